"""Export stage: writers that take transactions (query, response, response_messages) and write rotating files.

The exporter interface, used by probe.pipeline.Pipeline:
  write_transactions(txs, address_events, now_ns)  append completed transactions (and C-DNS address events)
  is_open()     a file is open
  due(now_ns)   the open file has reached its time limit
  rotate()      close the current file now (the next records open a new one)
  close()       end of output: close, and wait for anything still finishing the files
  completed     final paths of the files closed so far

Files are written as NAME.part and renamed to NAME when complete; NAME is
<prefix><UTC start YYYYmmdd.HHMMSS.ffffff>.w<worker><suffix>, the start being the capture time of the
file's first record.
"""

import datetime
import errno
import os
import time
from pathlib import Path

from probe.errors import ConfigError, OutputError


def make_exporter(cfg, directory, worker_id, stats, client=None, live=False):
    """The exporter for cfg.export.format; a new format is one new module and one entry here.

    client: the probe.privacy.ClientPrivacy applied to client addresses (None: written as they are);
    live: the records come from live capture (C-DNS collection parameters say so)."""
    fmt = cfg.export.format
    if fmt == "parquet":
        from export.parquet import ParquetExporter
        from probe.records import RecordBuilder

        return ParquetExporter(cfg.export, directory, worker_id, stats, RecordBuilder(client=client))
    if fmt == "cdns":
        from export.cdns import CdnsExporter

        return CdnsExporter(cfg, directory, worker_id, stats, client=client, live=live)
    raise ValueError(f"unknown export format {fmt!r}")


def reads_raw(cfg):
    """Whether the exporter for cfg.export.format reads the raw DNS message of the message tuples
    (probe.decode.fields.DNS_FIELDS raw): C-DNS does (question names, full sections, malformed-message
    data), Parquet does not, so the decoder leaves it None and saves a copy of every message."""
    return cfg.export.format != "parquet"


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
    while path.exists() or Path(f"{path}.part").exists():
        path = directory / f"{base}.{seq}{suffix}"
        seq += 1
    return path


def stats_json_path(export_cfg, directory, started):
    """Where a run's statistics JSON goes: PREFIX<UTC start to the second>.stats.json, made unique."""
    stamp = time.strftime("%Y%m%d.%H%M%S", time.gmtime(started))
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
