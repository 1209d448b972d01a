"""What the exporters share: the Exporter interface, file names, .part files, rotation on time, output errors.

Files are written as NAME.part and renamed to NAME when complete; NAME is
<prefix><UTC start YYYYmmdd.HHMMSS.ffffff>.w<worker><suffix>, the start being the capture time of the
file's first record.
"""

import datetime
import errno
import os
import time
from pathlib import Path
from typing import Protocol

from probe.errors import ConfigError, OutputError


class Exporter(Protocol):
    """The export stage's interface, as the pipeline (probe.run.pipeline) uses it."""

    completed: list  # final paths of the files closed so far

    def write(self, txs, address_events=None, now_ns=None):
        """Append completed transactions (and, for C-DNS, the decoder's address events)."""

    def is_open(self) -> bool:
        """A file is open."""

    def due(self, now_ns) -> bool:
        """The open file has reached its time limit (capture time now_ns)."""

    def rotate(self):
        """Close the current file now; the next records open a new one."""

    def close(self):
        """End of output: close, and wait for anything still finishing the files."""


def file_stamp(ts_ns):
    t = datetime.datetime.fromtimestamp(ts_ns // 1_000_000_000, datetime.timezone.utc)
    return t.strftime("%Y%m%d.%H%M%S") + f".{(ts_ns // 1000) % 1_000_000:06d}"


def free_path(directory, base, suffix):
    """DIR/BASE+SUFFIX, or DIR/BASE.N+SUFFIX with the first N that is free, counting NAME.part as taken.

    Output names carry a time to the second (statistics) or microsecond (data); two runs writing to one
    directory can still meet on a name, and neither may replace the other's file."""
    directory = Path(directory)
    path = directory / f"{base}{suffix}"
    seq = 1
    while path.exists() or Path(f"{path}.part").exists() or hidden_part(path).exists():
        path = directory / f"{base}.{seq}{suffix}"
        seq += 1
    return path


def hidden_part(path):
    """The name of a file being written in the hive layout: .NAME.part, which engines reading the dataset skip
    (Spark, Hive, Trino and pyarrow ignore names starting with '.' or '_')."""
    return path.with_name(f".{path.name}.part")


STATS_DIR = "_stats"  # the hive layout's directory of statistics JSON files, skipped by engines as hidden


def stats_json_path(export_cfg, directory, started):
    """Where a run's statistics JSON goes: PREFIX<UTC start to the second>.stats.json, made unique; in the hive
    layout under _stats/, so that the output directory holds nothing but the dataset."""
    stamp = time.strftime("%Y%m%d.%H%M%S", time.gmtime(started))
    if export_cfg.layout == "hive":
        directory = Path(directory) / STATS_DIR
        directory.mkdir(exist_ok=True)
    return free_path(directory, f"{export_cfg.file_prefix}{stamp}", ".stats.json")


def check_output_dir(directory):
    """Fail early, with the reason, when the output directory cannot be written."""
    path = Path(directory)
    if not path.exists():
        raise ConfigError(f"output directory {path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"output path {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {path} is not writable")


def tx_time_ns(tx):
    """Capture time of a transaction: its query's, else its response's."""
    m = tx[0] if tx[0] is not None else tx[1]
    return m[0]


class FileExporter:
    """What the exporters share: names, .part paths, rotation on time, output errors."""

    suffix = ""

    def __init__(self, export_cfg, directory, worker_id, stats):
        self.cfg = export_cfg
        self.dir = Path(directory)
        self.worker_id = worker_id
        self.stats = stats
        self.part_path = None
        self.final_path = None
        self.file_start_ns = None
        self.completed = []  # final paths of closed files

    def is_open(self):
        raise NotImplementedError

    def rotate(self):
        raise NotImplementedError

    def due(self, now_ns):
        """True when the open file has reached its time limit."""
        return (
            self.is_open()
            and self.cfg.rotate_seconds > 0
            and now_ns - self.file_start_ns >= int(self.cfg.rotate_seconds * 1e9)
        )

    def close(self):
        self.rotate()

    def _name(self, ts_ns):
        """Choose the paths of a new file starting at ts_ns (a .N is added if the name is taken)."""
        final = free_path(self.dir, f"{self.cfg.file_prefix}{file_stamp(ts_ns)}.w{self.worker_id}", self.suffix)
        self.final_path = final
        self.part_path = Path(f"{final}.part")
        self.file_start_ns = ts_ns

    def _output_error(self, exc, where=None):
        where = where or self.part_path or self.dir
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space" in str(exc):
            return OutputError(f"{where}: disk full; the .part file holds the records written so far")
        return OutputError(f"{where}: cannot write: {exc}")
