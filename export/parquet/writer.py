"""Parquet exporter: transactions → Arrow tables of records (export.parquet.records) → rotating files.

A file is written as NAME.parquet.part and renamed to NAME.parquet only once complete, so readers
never see a half-written file. NAME = <prefix><UTC start YYYYmmdd.HHMMSS.ffffff>.w<worker>, the
start being the capture time of the file's first record. Rotation: after rotate_records records,
and rotate_seconds after the file's start (the pipeline asks due() with capture time offline; live, the
supervisor rotates on the wall clock, so a quiet file is still closed on time).
"""

import os

import pyarrow as pa
import pyarrow.parquet as pq

from export.base import FileExporter
from export.parquet.schema import SCHEMA, UNIQUE_VALUED


def _first_time_ns(table):
    """Capture time of a table's first record (its query's, else its response's), to the microsecond."""
    return table.column("time")[0].as_py() * 1000


class ParquetExporter(FileExporter):
    suffix = ".parquet"

    def __init__(self, export_cfg, directory, worker_id, stats, builder=None):
        super().__init__(export_cfg, directory, worker_id, stats)
        if builder is None:
            from export.parquet.records import RecordBuilder

            builder = RecordBuilder()
        self.builder = builder
        self.writer = None
        self.file_records = 0
        self.pending = []  # tables not yet written as a row group
        self.pending_rows = 0
        compression = export_cfg.compression
        self.compression = None if compression == "none" else compression

    # -- the exporter interface (see export/__init__.py) --

    def write(self, txs, address_events=None, now_ns=None):
        """Transactions → Arrow table (export.parquet.records) → rows. Address events are not part of this format
        (they are counted in the statistics)."""
        if txs:
            self.write_table(self.builder.build(txs))

    def write_table(self, table):
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

    # -- internals --

    def _open(self, ts_ns):
        self._name(ts_ns)
        try:
            self.writer = pq.ParquetWriter(
                self.part_path,
                SCHEMA,
                compression=self.compression,
                compression_level=self.cfg.compression_level,
                use_dictionary=[name for name in SCHEMA.names if name not in UNIQUE_VALUED],
            )
        except OSError as exc:
            raise self._output_error(exc) from None
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
