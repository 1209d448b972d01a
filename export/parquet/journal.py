"""Parquet of a live capture: a journal first, the Parquet file at rotation.

A Parquet file is readable only once its footer is written, at its end; a worker that dies before then would
leave nothing readable. So live capture writes each file first as a journal, NAME.parquet.journal: an Arrow IPC
stream (which needs no footer), whose record batches are put in the file by flush() (the worker calls it within
export.flush_seconds of a transaction's completion); in the hive layout .NAME.parquet.journal, a name engines
skip. The journal is readable up to its last complete batch at any moment, by `dnsprobe inspect` and by
read_journal(). When the file closes (rotation, a partition's end, export.rotate_bytes: here the journal's
size) the journal is converted into NAME.parquet (its key-value metadata, export.filemeta, kept in the journal's
schema; the row groups, sorting, codec, dictionaries and page index of
ParquetExporter) by a thread of its own, off the capture core, and removed; a journal whose writer died is
converted the same way by export.recovery.

The journal is locked (export.base.lock_live_file) from its creation until its conversion is complete.
"""

import os
import threading

import pyarrow as pa
import pyarrow.ipc as ipc

from export.base import announce_finished, live_path, lock_live_file, off_capture_cores
from export.parquet.schema import SCHEMA
from export.parquet.writer import LATE, ON_TIME, ParquetExporter, _File, late_rows, open_parquet, write_row_groups

JOURNAL_SUFFIX = ".journal"
# Buffers compressed one by one (export.journal_compression): the journal is written at the capture's pace, so its
# codec's CPU is paid per packet; lz4 costs the least of the two, zstd gives the smaller journal. In the calling
# thread: handing a batch's buffers to Arrow's thread pool cost more CPU than it saved time (docs/performance.md).
IPC_OPTIONS = {codec: ipc.IpcWriteOptions(compression=None if codec == "none" else codec, use_threads=False)
               for codec in ("lz4", "zstd", "none")}
IPC_READ_OPTIONS = ipc.IpcReadOptions(use_threads=False)
BUFFER_BYTES = 1 << 20


class JournalWriter:
    """An Arrow IPC stream of record batches into a locked file; flush() puts what was written in the file."""

    def __init__(self, path, compression="lz4", key_values=None):
        """key_values: the Parquet file's key-value metadata (export.filemeta), kept in the stream's schema for the
        conversion."""
        self.lock = lock_live_file(path)
        try:
            self.stream = pa.BufferedOutputStream(pa.OSFile(str(path), "w"), buffer_size=BUFFER_BYTES)
            schema = SCHEMA.with_metadata(key_values or {})
            self.writer = ipc.new_stream(self.stream, schema, options=IPC_OPTIONS[compression])
            self.stream.flush()  # the schema: a journal is readable (empty) from the start
        except BaseException:
            os.close(self.lock)
            raise
        self.unflushed = 0  # rows written to the stream, not yet flushed to the file

    def write(self, table):
        self.writer.write_table(table)
        self.unflushed += table.num_rows

    def flush(self):
        """Rows now in the file (they were not before)."""
        self.stream.flush()
        rows, self.unflushed = self.unflushed, 0
        return rows

    def tell(self):
        """Bytes written to the journal so far (export.rotate_bytes)."""
        return self.stream.tell()

    def close(self):
        """End the stream (the lock stays: the journal is still the only copy of its rows)."""
        self.writer.close()
        self.stream.close()


def journal_batches(path, memory_pool=None):
    """The record batches of a journal up to its last complete one, one by one (in memory_pool's buffers, default
    pyarrow's). cut() tells afterwards whether the stream ended cut short (its writer is still writing, or died)
    rather than closed."""
    return _Batches(path, memory_pool)


class _Batches:
    def __init__(self, path, memory_pool):
        self.path = path
        self.memory_pool = memory_pool
        self.was_cut = False
        self.key_values = None  # the stream schema's metadata, once read (the file's, export.filemeta)

    def cut(self):
        return self.was_cut

    def __iter__(self):
        # Read, not mapped: a mapped journal's pages would count in the worker's RSS as the conversion reads
        # them, adding the whole journal to its peak at every rotation.
        try:
            source = pa.OSFile(str(self.path), "r")
        except OSError:
            self.was_cut = True
            return
        with source:
            try:
                reader = ipc.open_stream(source, options=IPC_READ_OPTIONS, memory_pool=self.memory_pool)
            except (pa.ArrowInvalid, OSError):  # not even the schema (an empty file)
                self.was_cut = True
                return
            self.key_values = reader.schema.metadata
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                except (pa.ArrowInvalid, OSError):  # a batch cut short: the end of what is readable
                    self.was_cut = True
                    return
                yield batch


def read_journal(path):
    """The rows of a journal as a table (its complete batches), and whether the stream was cut."""
    batches = journal_batches(path)
    table = pa.Table.from_batches(list(batches), schema=SCHEMA)
    return table, batches.cut()


def journal_schema(path):
    """The schema of a journal, with the file's key-value metadata (export.filemeta)."""
    with pa.OSFile(str(path), "r") as source:
        return ipc.open_stream(source, options=IPC_READ_OPTIONS).schema


def final_of(journal):
    """The Parquet file a journal becomes: NAME.parquet.journal, or hidden .NAME.parquet.journal → NAME.parquet."""
    name = journal.name[: -len(JOURNAL_SUFFIX)]
    return journal.with_name(name[1:] if name.startswith(".") else name)


def convert_journal(journal, final, export_cfg):
    """Write the rows of a journal as the Parquet file final (through its live name NAME.parquet.part, hidden
    when the journal is, then renamed), and remove the journal; returns the number of rows (without rows, no file
    is written). Streamed: one row group in memory at a time (with export.time_order, one of each stream: the late
    rows' apart), cut and sorted as ParquetExporter does (export.parquet.writer.write_row_groups).

    Its buffers come from the C library's allocator, not pyarrow's default (mimalloc): mimalloc keeps the pages
    this thread freed for a while, so at every rotation the worker's RSS rose by about twice what the
    conversion holds at once."""
    pool = pa.system_memory_pool()
    part = live_path(final, ".part", hidden=journal.name.startswith("."))
    f = None
    rows = 0
    batches = journal_batches(journal, pool)
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if f is None:  # (the metadata written in the journal: the file says what it is)
                f = _File(final, part, 0, *open_parquet(part, export_cfg, pool, batches.key_values))
            table = pa.Table.from_batches([batch])
            if export_cfg.time_order:  # (each batch one stream, as the exporter wrote it)
                on_time, late = late_rows(table)
                f.add(on_time, ON_TIME)
                f.add(late, LATE)
            else:
                f.add(table)
            rows += batch.num_rows
            write_row_groups(f, export_cfg, False)
        if f is not None:
            write_row_groups(f, export_cfg, True)
    finally:
        if f is not None:
            f.writer.close()
            f.sink.close()
    if f is not None:
        os.replace(part, final)
    os.unlink(journal)
    return rows


class _Conversion(threading.Thread):
    """Converts one closed journal, off the capture core; the journal's lock is released when it is done."""

    def __init__(self, journal, final, export_cfg, lock):
        super().__init__(name=f"parquet-journal {final.name}", daemon=True)
        self.part_path, self.final_path, self.cfg, self.lock = journal, final, export_cfg, lock
        self.error = None

    def done(self):
        return not self.is_alive()

    def run(self):
        off_capture_cores()
        try:
            if convert_journal(self.part_path, self.final_path, self.cfg):
                announce_finished(self.final_path)
        except OSError as exc:
            self.error = exc
        finally:
            os.close(self.lock)


class JournalingParquetExporter(ParquetExporter):
    """ParquetExporter for live capture: rows go to the journal as they come (flush() puts them in the file),
    and a closed journal becomes NAME.parquet in a thread; the `records` counter counts the rows in the file."""

    live_suffix = JOURNAL_SUFFIX

    def _new_file(self, bucket, ts_ns):
        final, journal = self._file_name(bucket, ts_ns)
        try:
            writer = JournalWriter(journal, self.cfg.journal_compression, self.key_values)
        except OSError as exc:
            raise self._output_error(exc, self.dir) from None
        return _File(final, journal, ts_ns, writer, writer)  # (the journal's size: export.rotate_bytes)

    def _count(self, rows):
        pass  # counted once in the file: flush()

    def _flush_row_groups(self, f, force):
        """Rows go to the journal at once (the conversion cuts the row groups)."""
        try:
            for tables in f.take_pending():
                for table in tables:
                    f.writer.write(table)
        except OSError as exc:
            raise self._output_error(exc, f.part_path) from None

    def flush(self):
        self._reap()
        try:
            for f in self.files.values():
                self.stats.records += f.writer.flush()
        except OSError as exc:
            raise self._output_error(exc) from None

    def unwritten(self):
        return sum(f.writer.unflushed for f in self.files.values())

    def _close(self, f):
        self._flush_row_groups(f, force=True)
        try:
            self.stats.records += f.writer.flush()
            f.writer.close()
        except OSError as exc:
            os.close(f.writer.lock)
            raise self._output_error(exc, f.part_path) from None
        conversion = _Conversion(f.part_path, f.final_path, self.cfg, f.writer.lock)
        conversion.start()
        self._finish_in_thread(conversion)
