"""Parquet exporter: takes Arrow tables of records, writes rotating files.

A file is written as NAME.parquet.part and renamed to NAME.parquet only once complete, so readers
never see a half-written file. NAME = <prefix><UTC start YYYYmmdd.HHMMSS.ffffff>.w<worker>, the
start being the capture time of the file's first record. Rotation: after rotate_records records,
and rotate_seconds after the file's start (checked against the time given to tick(), so a quiet
file is still closed on time).
"""

import datetime
import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from probe.errors import ConfigError, OutputError
from probe.records import SCHEMA


def file_stamp(ts_ns):
    t = datetime.datetime.fromtimestamp(ts_ns // 1_000_000_000, datetime.timezone.utc)
    return t.strftime("%Y%m%d.%H%M%S") + f".{(ts_ns // 1000) % 1_000_000:06d}"


def check_output_dir(directory):
    """Fail early, with the reason, when the output directory cannot be written."""
    path = Path(directory)
    if not path.exists():
        raise ConfigError(f"output directory {path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"output path {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {path} is not writable")


def _first_time_ns(table):
    """Capture time of a table's first record: its query time, else its response time."""
    row = table.slice(0, 1)
    for name in ("query_time", "response_time"):
        value = row.column(name)[0]
        if value.is_valid:
            return value.value
    return row.column("time")[0].as_py() * 1000


class ParquetExporter:
    suffix = ".parquet"

    def __init__(self, export_cfg, directory, worker_id, stats):
        self.cfg = export_cfg
        self.dir = Path(directory)
        self.worker_id = worker_id
        self.stats = stats
        self.writer = None
        self.part_path = None
        self.final_path = None
        self.file_start_ns = None
        self.file_records = 0
        self.pending = []  # tables not yet written as a row group
        self.pending_rows = 0
        self.completed = []  # final paths of closed files
        compression = export_cfg.compression
        self.compression = None if compression == "none" else compression

    # -- the exporter interface: write(table), tick(now_ns), rotate(), close() --

    def write(self, table):
        """Append records; a file opened for them is named after its first record's time."""
        limit = self.cfg.rotate_records
        while table.num_rows:
            if self.writer is None:
                self._open(_first_time_ns(table))
            take = table.num_rows if not limit else min(table.num_rows, limit - self.file_records)
            self._buffer(table.slice(0, take))
            table = table.slice(take)
            if limit and self.file_records >= limit:
                self.rotate()

    def is_open(self):
        return self.writer is not None

    def due(self, now_ns):
        """True when the open file has reached its time limit."""
        return (
            self.writer is not None
            and self.cfg.rotate_seconds > 0
            and now_ns - self.file_start_ns >= int(self.cfg.rotate_seconds * 1e9)
        )

    def tick(self, now_ns):
        """Time passes (capture time offline, wall clock live): close the file when it is due."""
        if self.due(now_ns):
            self.rotate()

    def rotate(self):
        if self.writer is None:
            return
        self._flush_row_group(force=True)
        try:
            self.writer.close()
            os.replace(self.part_path, self.final_path)
        except OSError as exc:
            raise self._output_error(exc) from None
        self.completed.append(self.final_path)
        self.stats.files += 1
        self.writer = None

    def close(self):
        self.rotate()

    # -- internals --

    def _open(self, ts_ns):
        base = f"{self.cfg.file_prefix}{file_stamp(ts_ns)}.w{self.worker_id}"
        final = self.dir / f"{base}{self.suffix}"
        seq = 1
        while final.exists() or Path(f"{final}.part").exists():
            final = self.dir / f"{base}.{seq}{self.suffix}"
            seq += 1
        self.final_path = final
        self.part_path = Path(f"{final}.part")
        try:
            self.writer = pq.ParquetWriter(
                self.part_path,
                SCHEMA,
                compression=self.compression,
                compression_level=self.cfg.compression_level,
            )
        except OSError as exc:
            raise self._output_error(exc) from None
        self.file_start_ns = ts_ns
        self.file_records = 0

    def _buffer(self, table):
        self.pending.append(table)
        self.pending_rows += table.num_rows
        self.file_records += table.num_rows
        self.stats.records += table.num_rows
        self._flush_row_group(force=False)

    def _flush_row_group(self, force):
        size = self.cfg.row_group_size
        if not self.pending or (self.pending_rows < size and not force):
            return
        table = pa.concat_tables(self.pending)
        self.pending = []
        self.pending_rows = 0
        try:
            while table.num_rows >= size or (force and table.num_rows):
                chunk = table.slice(0, size)
                self.writer.write_table(chunk, row_group_size=size)
                table = table.slice(chunk.num_rows)
        except OSError as exc:
            raise self._output_error(exc) from None
        if table.num_rows:
            self.pending = [table]
            self.pending_rows = table.num_rows

    def _output_error(self, exc):
        where = self.part_path or self.dir
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space" in str(exc):
            return OutputError(f"{where}: disk full; the .part file holds the records written so far")
        return OutputError(f"{where}: cannot write: {exc}")
