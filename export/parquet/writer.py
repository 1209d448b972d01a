"""Parquet exporter: transactions → Arrow table of rows (export.parquet.rows) → enrichment (export.enrich) →
client privacy (export.parquet.privacy) → rotating files, flat or in hive partitions.

A file is written as NAME.parquet.part (hive layout: .NAME.parquet.part, a name engines skip) and renamed
to NAME.parquet only once complete, so readers never see a half-written file. NAME = <prefix><UTC start
YYYYmmdd.HHMMSS.ffffff>.w<worker>[.N], the start being the capture time of the file's first record (a name that
exists: export.base). Rotation
(export.base.FileExporter): after rotate_records records, once the file holds rotate_bytes bytes (checked after
each row group; the rows not yet in a row group then go to the next file), and rotate_seconds after the file's
start (the pipeline asks due() with capture time offline; live, the supervisor rotates on the wall clock, so a
quiet file is still closed on time).

Layout (export.layout): flat, every file in the output directory; or hive, each file in the directory of
its rows' partition, year=Y/month=M/day=D[/hour=H]/server=NAME (unpadded numbers, UTC capture time of
the transaction), as ENTRADA writes them. A file never holds two partitions: the rows of a batch are split
by partition, one file is open per partition, and a partition's file is closed once the capture clock has
passed the partition's end by the query timeout (the latest a transaction of it can still complete).

Live capture writes each file first as a journal and converts it when it closes: export.parquet.journal.

Every file says what it is in its key-value metadata (export.filemeta: dnsprobe.version, dnsprobe.schema_version,
the client privacy, the server, the source kinds, the configuration digest).
"""

import datetime
import os
import socket

import pyarrow as pa
import pyarrow.parquet as pq

# Arrow's compute functions by name: pyarrow.compute, which wraps them, costs a run 50-80 ms of start-up
# (tests/cli/test_console.py), and a worker imports nothing after it dropped its privileges (--user).
from pyarrow._compute import call_function as _f

from export.base import FileExporter, OutputFile
from export.filemeta import FileOrigin, file_meta, parquet_key_values
from export.parquet.schema import DELTA_ENCODED, SCHEMA, SCHEMA_VERSION, UNIQUE_VALUED, UNSORTED_WITHOUT_STATISTICS

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000
DEFAULT_SERVER = "__default__"  # the partition directory of an empty server name
SORT_KEYS = {"domainname": [("domainname", "ascending"), ("qname", "ascending")]}
# Row groups' worth of rows held back, beyond the one being filled, for the rows that complete late to find their
# place (write_row_groups): rows stay in timestamp order up to row_group_size / match.query_timeout transactions a
# second (20,000 with the defaults); above, what waits longer goes, and a late row joins a later group.
HELD_GROUPS = 1


def server_name(export_cfg):
    """The probe's server name: export.server_name, else the host name."""
    return export_cfg.server_name if export_cfg.server_name is not None else socket.gethostname()


def _first_time_ns(table):
    """Capture time of a table's first record (its query's, else its response's), to the microsecond."""
    return table.column("time")[0].as_py() * 1000


def open_parquet(path, export_cfg, memory_pool=None, key_values=None):
    """(ParquetWriter, its file) of an output file: export.compression and its level, dictionaries but for the
    columns whose values rarely repeat (the times delta-encoded), statistics and the page index but for the
    unsorted names and client addresses, and the sorting columns of export.sort; memory_pool: the writer's Arrow pool
    (default: pyarrow's); key_values: the file's key-value metadata (export.filemeta.parquet_key_values; every
    exporter's file has it, None only for copies made by benchmarks)."""
    sort_keys = SORT_KEYS.get(export_cfg.sort)
    sorted_by = {name for name, _ in sort_keys or ()}
    sink = pa.OSFile(str(path), "wb")
    try:
        writer = pq.ParquetWriter(
            sink,
            SCHEMA.with_metadata(key_values or {}),
            compression=None if export_cfg.compression == "none" else export_cfg.compression,
            compression_level=export_cfg.compression_level,
            use_dictionary=[name for name in SCHEMA.names if name not in UNIQUE_VALUED],
            column_encoding=dict.fromkeys(DELTA_ENCODED, "DELTA_BINARY_PACKED"),
            write_statistics=[n for n in SCHEMA.names if n not in UNSORTED_WITHOUT_STATISTICS or n in sorted_by],
            write_page_index=True,  # column and offset indexes: engines skip pages by time, server, type, ...
            sorting_columns=pq.SortingColumn.from_ordering(SCHEMA, sort_keys) if sort_keys else None,
            memory_pool=memory_pool,
        )
    except BaseException:
        sink.close()
        raise
    return writer, sink


def write_row_groups(f, export_cfg, force, late_us, full=lambda f: False):
    """Write rows f holds as row groups of export.row_group_size rows (each sorted by export.sort), the last one
    shorter only with force; stop early once full(f) (export.rotate_bytes). The rows not written stay pending. In the
    order they came, or with export.time_order in the order of their timestamp (_write_in_time_order)."""
    if export_cfg.time_order:
        _write_in_time_order(f, export_cfg, force, late_us, full)
        return
    size = export_cfg.row_group_size
    if not f.pending or (f.pending_rows < size and not force):
        return
    table = pa.concat_tables(f.pending) if len(f.pending) > 1 else f.pending[0]
    sort_keys = SORT_KEYS.get(export_cfg.sort)
    while table.num_rows >= size or (force and table.num_rows):
        chunk = table.slice(0, size)
        f.writer.write_table(chunk.sort_by(sort_keys) if sort_keys else chunk, row_group_size=size)
        table = table.slice(chunk.num_rows)
        if full(f) and not force:
            break
    f.pending, f.todo = ([table], [None]) if table.num_rows else ([], [])
    f.pending_rows = table.num_rows


def _write_in_time_order(f, export_cfg, force, late_us, full):
    """write_row_groups with export.time_order: in the order of the rows' timestamp.

    Why the order: a transaction's row is made when it completes, at its response or, unanswered, once its query
    has waited match.query_timeout, so rows come up to that much later than rows of later timestamps; a row group
    cut in that order spans the timeout more than its own rows and a time-range query reads it for nothing. So the
    rows of the last late_us (the timeout) before the newest timestamp are not written yet (a transaction of theirs
    may still complete; None: the input has ended, none will), and groups are cut from the older ones once there
    are enough for a group (with force: all of them). Memory bounds the wait: beyond the group being filled, at
    most HELD_GROUPS groups' rows wait, the oldest going first. Rows are not copied to be kept: each pending table
    has the mask of its rows not written yet."""
    size = export_cfg.row_group_size
    if not f.pending or (f.pending_rows - f.held < size and not force):
        return
    table = pa.concat_tables(f.pending) if len(f.pending) > 1 else f.pending[0]
    # (never null in rows made here; a journal made by hand may have none: they count as the oldest)
    times = _f("coalesce", [table.column("timestamp").combine_chunks().view(pa.int64()), pa.scalar(0, pa.int64())])
    todo = pa.concat_arrays([pa.repeat(True, t.num_rows) if m is None else m for t, m in zip(f.pending, f.todo)])
    if force or late_us is None:
        count = f.pending_rows if force else f.pending_rows // size * size
    else:
        horizon = pa.scalar(_f("max", [times]).as_py() - late_us, pa.int64())
        old = _f("sum", [_f("and", [todo, _f("less", [times, horizon])])]).as_py() or 0
        count = max(old, f.pending_rows - HELD_GROUPS * size) // size * size
    if not count:
        f.held = f.pending_rows  # (none to write yet: look again one group's rows later)
        return
    positions = _f("indices_nonzero", [todo])
    # stable: equal times stay in the order they came
    order = _f("take", [positions, _f("sort_indices", [_f("take", [times, positions])])])
    written = todo
    if count < f.pending_rows:  # the oldest rows, ties by position
        last = order[count - 1].as_py()
        at = times[last]
        rows_at = _f("indices_nonzero", [pa.repeat(True, len(todo))])  # 0, 1, 2, ...
        earlier = _f("or", [_f("less", [times, at]), _f("and", [
            _f("equal", [times, at]), _f("less_equal", [rows_at, pa.scalar(last, pa.uint64())])])])
        written = _f("and", [todo, earlier])
    f.todo = _split(_f("and_not", [todo, written]), f.pending)
    rows = _f("take", [table, order.slice(0, count)])
    sort_keys = SORT_KEYS.get(export_cfg.sort)
    while rows.num_rows:
        chunk = rows.slice(0, size)
        f.writer.write_table(chunk.sort_by(sort_keys) if sort_keys else chunk, row_group_size=size)
        rows = rows.slice(chunk.num_rows)
        if full(f) and not force:
            break
    kept = [(t, m) for t, m in zip(f.pending, f.todo) if _f("any", [m]).as_py()]
    f.pending = ([rows] if rows.num_rows else []) + [t for t, _ in kept]  # (rows: stopped by full(f), go first)
    f.todo = ([None] if rows.num_rows else []) + [m for _, m in kept]
    f.pending_rows = f.held = rows.num_rows + sum(_f("sum", [m]).as_py() or 0 for _, m in kept)


def _split(mask, tables):
    """The mask of a concatenation of tables, cut back into one mask per table."""
    out, at = [], 0
    for t in tables:
        out.append(mask.slice(at, t.num_rows))
        at += t.num_rows
    return out


class _File(OutputFile):
    """One open Parquet file: its paths, writer, and the rows buffered for its next row groups."""

    def __init__(self, final_path, part_path, start_ns, writer, sink):
        super().__init__(final_path, part_path, start_ns)
        self.writer = writer
        self.sink = sink
        self.pending = []  # tables of rows, some of them written (write_row_groups)
        self.todo = []  # of each pending table, the mask of its rows not written yet (None: all of them)
        self.pending_rows = 0  # rows not written yet
        self.held = 0  # of those, the ones pending at the last cut

    def add(self, table):
        self.pending.append(table)
        self.todo.append(None)
        self.pending_rows += table.num_rows

    def take_pending(self):
        """The tables of the rows not written yet, which the file then no longer holds."""
        tables = [t if m is None else t.filter(m) for t, m in zip(self.pending, self.todo)]
        self.pending, self.todo = [], []
        self.pending_rows = self.held = 0
        return tables

    def size(self):
        return self.sink.tell()


class ParquetExporter(FileExporter):
    suffix = ".parquet"
    live_suffix = ".part"  # (hidden in the hive layout: .NAME.parquet.part)

    def __init__(self, cfg, directory, worker_id, stats, client=None, live=False, metrics=None, tx_records=False,
                 origin=None):
        """client: the export.anonymise.ClientPrivacy of client addresses (None: written as they are); origin: the
        run's export.filemeta.FileOrigin, in every file's key-value metadata (None: unspecified); live: the
        transactions come from live capture (names: export.base.FileExporter._take_name; its journal is a class of its
        own, chosen by export.make_exporter); metrics: an export.metrics.DnsMetrics counting what is written (None:
        not counted); tx_records: write() is given probe._records.TxBatch (built by the C column pass), else
        transaction tuples (the Python reference)."""
        # Imported here: recovering journals (export.recovery) needs none of them.
        from export.enrich import make_enricher
        from export.parquet.rows import RowBuilder

        super().__init__(cfg, directory, worker_id, stats, metrics, live)
        export_cfg = cfg.export
        self.builder = RowBuilder(answers=export_cfg.answers, stats=stats)
        self.tx_records = tx_records
        # Applied to every table of rows before it is written, in order. Enrichment looks the real addresses
        # up; privacy transforms them afterwards (docs/enrichment.md).
        self.enricher = make_enricher(cfg)
        steps = [self.enricher] if self.enricher is not None else []
        if client is not None:
            from export.parquet.privacy import TablePrivacy  # with pyarrow.compute: only when configured

            steps.append(TablePrivacy(client, cfg.enrich.cache_size))
        self.steps = tuple(steps)
        # files: partition (None in the flat layout, else its bucket number) → _File
        self.late_ns = int(cfg.match.query_timeout * 1e9)  # how late a transaction completes (its row is made)
        self.late_us = self.late_ns // 1000  # rows held back to be written in timestamp order (None: input ended)
        self.hive = export_cfg.layout == "hive"
        self.bucket_us = HOUR_US if export_cfg.partition_hour else DAY_US
        self.server = server_name(export_cfg) or DEFAULT_SERVER
        self.key_values = parquet_key_values(file_meta(cfg, client, origin or FileOrigin(), live, SCHEMA_VERSION))

    # -- the exporter interface (see export/__init__.py) --

    def write(self, txs, address_events=None, now_ns=None):
        """Transactions → Arrow table (export.parquet.rows) → the steps → rows. Address events are not part of
        this format (they are counted in the statistics)."""
        if self.hive and now_ns is not None:
            self._close_ended(now_ns)
        if txs:
            table = self.builder.build_from_records(txs) if self.tx_records else self.builder.build(txs)
            for step in self.steps:
                table = step(table)
            self.write_table(table)

    def write_table(self, table):
        """Append rows; a file opened for them is named after its first row's time."""
        if self.metrics is not None:
            self.metrics.add_table(table)
        if not self.hive:
            self._append(None, table)
            return
        for bucket, rows in self._partitions(table):
            self._append(bucket, rows)

    def close(self):
        """The input has ended: the rows held back for their order are written as the others, rotating on
        export.rotate_bytes and export.rotate_records as they go; then every file is closed."""
        self.late_us = None
        for bucket, f in list(self.files.items()):
            if f.pending_rows and self.cfg.time_order:
                f.rows -= f.pending_rows
                self._count(-f.pending_rows)
                self._append(bucket, pa.concat_tables(f.take_pending()))
        super().close()

    def reload(self):
        if self.enricher is not None:
            self.enricher.reload()

    # -- partitions --

    def _partitions(self, table):
        """(bucket, rows) for each partition of the table's rows, in order of first appearance."""
        import pyarrow.compute as pc  # the hive layout only: a flat run starts without it

        buckets = pc.divide(table.column("time"), self.bucket_us)
        low, high = pc.min_max(buckets).values()
        if low == high:
            return [(low.as_py(), table)]
        return [(b, table.filter(pc.equal(buckets, b))) for b in pc.unique(buckets).to_pylist()]

    def partition_dir(self, bucket):
        """The directory of a hive partition: year=Y/month=M/day=D[/hour=H]/server=NAME, UTC, unpadded."""
        t = datetime.datetime.fromtimestamp(bucket * self.bucket_us // 1_000_000, datetime.timezone.utc)
        path = self.dir / f"year={t.year}" / f"month={t.month}" / f"day={t.day}"
        if self.bucket_us == HOUR_US:
            path = path / f"hour={t.hour}"
        return path / f"server={self.server}"

    def _close_ended(self, now_ns):
        for bucket in list(self.files):
            if bucket is not None and (bucket + 1) * self.bucket_us * 1000 + self.late_ns <= now_ns:
                self._end(bucket)

    # -- files --

    def _append(self, bucket, table):
        while table.num_rows:
            f = self._open(_first_time_ns(table), bucket)
            take = self._room(f, table.num_rows)
            f.add(table.slice(0, take))
            f.rows += take
            self._count(take)
            table = table.slice(take)
            self._flush_row_groups(f, force=False)
            if self._over_size(f):
                # The rows not written yet belong to the next file.
                f.rows -= f.pending_rows
                self._count(-f.pending_rows)
                table = pa.concat_tables(f.take_pending() + [table])
            self._end_if_full(bucket)

    def _count(self, rows):
        """Rows handed to the file (ParquetExporter: in the `records` counter at once; the journal counts them in its
        file)."""
        self.stats.records += rows

    def _file_name(self, bucket, ts_ns):
        """(final path, live path) of a new file of the partition starting at ts_ns, the live one created."""
        directory = self.dir if bucket is None else self.partition_dir(bucket)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._output_error(exc, self.dir) from None
        return self._take_name(directory, ts_ns, self.hive)

    def _new_file(self, bucket, ts_ns):
        final, part = self._file_name(bucket, ts_ns)
        try:
            return _File(final, part, ts_ns, *open_parquet(part, self.cfg, key_values=self.key_values))
        except OSError as exc:
            raise self._output_error(exc, self.dir) from None

    def _close(self, f):
        self._flush_row_groups(f, force=True)
        try:
            f.writer.close()
            f.sink.close()
            os.replace(f.part_path, f.final_path)
        except OSError as exc:
            raise self._output_error(exc, f.part_path) from None
        self._finished(f.final_path)

    def _flush_row_groups(self, f, force):
        try:
            write_row_groups(f, self.cfg, force, self.late_us, self._over_size)
        except OSError as exc:
            raise self._output_error(exc, f.part_path) from None
