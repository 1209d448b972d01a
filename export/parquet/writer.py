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
from export.parquet.schema import (
    DELTA_ENCODED,
    SCHEMA,
    SCHEMA_VERSION,
    UNCOMPRESSED,
    UNIQUE_VALUED,
    UNSORTED_WITHOUT_STATISTICS,
    leaf_paths,
)

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000
DEFAULT_SERVER = "__default__"  # the partition directory of an empty server name
SORT_KEYS = {"domainname": [("domainname", "ascending"), ("qname", "ascending")]}
# The streams of rows of a file, each cut into row groups of its own (write_row_groups). A transaction's row is
# made when it completes: answered, at its response, tens of milliseconds after its timestamp (its query's) at
# most; unanswered, once its query has waited match.query_timeout, seconds. Apart (export.time_order), each stream
# comes nearly in timestamp order (timeouts expire in age order), so each row group's min/max spans little more
# than its rows and a time range reads only the row groups holding its rows; together, a row group holding a late
# row reaches match.query_timeout back and a range reads it for nothing.
ON_TIME, LATE = 0, 1
# Rows of a data page at most (export.row_group_size's default 100,000: two pages a column chunk). Each page a codec
# compresses costs pyarrow's zstd a fixed ~18 µs here whatever its size (a context made per page, its CPU feature
# check a trap on a virtual machine; apache/arrow#48187); Arrow's default of 20,000 rows (five pages, and the
# dictionary's) made that about a tenth of the writer's CPU. 50,000 keeps two pages per row group for the page index
# (docs/performance.md).
PAGE_ROWS = 50_000


def server_name(export_cfg):
    """The probe's server name: export.server_name, else the host name."""
    return export_cfg.server_name if export_cfg.server_name is not None else socket.gethostname()


def _first_time_ns(table):
    """Capture time of a table's first record (its query's, else its response's), to the microsecond."""
    return table.column("time")[0].as_py() * 1000


def open_parquet(path, export_cfg, memory_pool=None, key_values=None):
    """(ParquetWriter, its file) of an output file: export.compression and its level (none for the columns of
    UNCOMPRESSED), dictionaries but for the columns whose values rarely repeat (the times delta-encoded), statistics
    and the page index but for the unsorted names and client addresses, data pages of up to PAGE_ROWS rows, and the
    sorting columns of export.sort; memory_pool: the writer's Arrow pool (default: pyarrow's); key_values: the file's
    key-value metadata (export.filemeta.parquet_key_values; every exporter's file has it, None only for copies made
    by benchmarks)."""
    sort_keys = SORT_KEYS.get(export_cfg.sort)
    sorted_by = {name for name, _ in sort_keys or ()}
    sink = pa.OSFile(str(path), "wb")
    try:
        writer = pq.ParquetWriter(
            sink,
            SCHEMA.with_metadata(key_values or {}),
            **_compression(export_cfg.compression, export_cfg.compression_level),
            use_dictionary=[name for name in SCHEMA.names if name not in UNIQUE_VALUED],
            column_encoding=dict.fromkeys(DELTA_ENCODED, "DELTA_BINARY_PACKED"),
            write_statistics=[n for n in SCHEMA.names if n not in UNSORTED_WITHOUT_STATISTICS or n in sorted_by],
            write_page_index=True,  # column and offset indexes: engines skip pages by time, server, type, ...
            sorting_columns=pq.SortingColumn.from_ordering(SCHEMA, sort_keys) if sort_keys else None,
            memory_pool=memory_pool,
            max_rows_per_page=PAGE_ROWS,
        )
    except BaseException:
        sink.close()
        raise
    return writer, sink


def _compression(codec, level):
    """pyarrow's compression and compression_level for export.compression and its level: by leaf column (a
    per-column setting names leaves), the codec but for UNCOMPRESSED's columns, and the level where there is a codec
    (a leaf given none is not compressed, and takes no level)."""
    if codec == "none":
        return {"compression": None, "compression_level": level}
    compressed = [leaf for field in SCHEMA if field.name not in UNCOMPRESSED for leaf in leaf_paths(field)]
    by_leaf = {leaf: "none" for field in SCHEMA if field.name in UNCOMPRESSED for leaf in leaf_paths(field)}
    by_leaf.update(dict.fromkeys(compressed, codec))
    return {"compression": by_leaf, "compression_level": None if level is None else dict.fromkeys(compressed, level)}


def write_row_groups(f, export_cfg, force, full=lambda f: False):
    """Write the rows f holds as row groups of export.row_group_size rows (each sorted by export.sort), the last one
    of each stream shorter only with force; stop early once full(f) (export.rotate_bytes). The rows not written stay
    pending. Each stream of rows (_File.pending) is cut into row groups of its own."""
    size = export_cfg.row_group_size
    sort_keys = SORT_KEYS.get(export_cfg.sort)
    for stream, tables in enumerate(f.pending):
        rows = f.stream_rows[stream]
        if not tables or (rows < size and not force):
            continue
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        while table.num_rows >= size or (force and table.num_rows):
            chunk = table.slice(0, size)
            f.writer.write_table(chunk.sort_by(sort_keys) if sort_keys else chunk, row_group_size=size)
            table = table.slice(chunk.num_rows)
            if full(f) and not force:
                break
        tables[:] = [table] if table.num_rows else []
        f.stream_rows[stream] = table.num_rows
        if full(f) and not force:
            return


def late_rows(table):
    """The table's rows as (the others, the late ones): late, a query without response, not malformed, exported once
    it waited match.query_timeout (export.parquet.rows.is_late). Tables made by RowBuilder apart (export.time_order)
    are one or the other, given as they are; a table of both (a journal made by hand) is copied apart."""
    late = _f("and_not", [_f("and_not", [table.column("query_present"), table.column("response_present")]),
                          table.column("malformed")])
    if late.null_count:  # (a journal made by hand: such a row is not late, and no row is lost)
        late = _f("coalesce", [late, pa.scalar(False)])
    count = _f("sum", [late]).as_py() or 0
    if not count:
        return table, table.slice(0, 0)
    if count == table.num_rows:
        return table.slice(0, 0), table
    return table.filter(_f("invert", [late])), table.filter(late)


class _File(OutputFile):
    """One open Parquet file: its paths, writer, and the rows buffered for its next row groups."""

    def __init__(self, final_path, part_path, start_ns, writer, sink):
        super().__init__(final_path, part_path, start_ns)
        self.writer = writer
        self.sink = sink
        # The tables of rows not written yet, by stream: ON_TIME, and LATE (only with export.time_order).
        self.pending = ([], [])
        self.stream_rows = [0, 0]

    @property
    def pending_rows(self):
        """Rows not written yet."""
        return self.stream_rows[ON_TIME] + self.stream_rows[LATE]

    def add(self, table, stream=ON_TIME):
        if table.num_rows:
            self.pending[stream].append(table)
            self.stream_rows[stream] += table.num_rows

    def take_pending(self):
        """The tables of the rows not written yet, by stream, which the file then no longer holds."""
        tables = tuple(list(t) for t in self.pending)
        for t in self.pending:
            t.clear()
        self.stream_rows = [0, 0]
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
        self.late_ns = int(cfg.match.query_timeout * 1e9)  # how late a transaction of a hive partition completes
        self.time_order = export_cfg.time_order  # late rows in row groups of their own (ON_TIME, LATE)
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
        if not txs:
            return
        # (export.time_order: the late rows made apart, in the same pass, each table then one stream; see ON_TIME)
        if self.tx_records:
            tables = self.builder.build_from_records(txs, self.time_order)
        else:
            tables = self.builder.build_apart(txs) if self.time_order else [self.builder.build(txs)]
        for stream, table in enumerate(tables):
            if not table.num_rows:
                continue
            for step in self.steps:
                table = step(table)
            self.write_table(table, stream)

    def write_table(self, table, stream=None):
        """Append rows of a stream (ON_TIME, LATE; None: rows of either, split by late_rows when export.time_order);
        a file opened for them is named after its first row's time."""
        if stream is None:
            if self.time_order:
                for stream, rows in enumerate(late_rows(table)):
                    if rows.num_rows:
                        self.write_table(rows, stream)
                return
            stream = ON_TIME
        if self.metrics is not None:
            self.metrics.add_table(table)
        if not self.hive:
            self._append(None, table, stream)
            return
        for bucket, rows in self._partitions(table):
            self._append(bucket, rows, stream)

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

    def _append(self, bucket, table, stream):
        while table.num_rows:
            f = self._open(_first_time_ns(table), bucket)
            take = self._room(f, table.num_rows)
            f.add(table.slice(0, take), stream)
            f.rows += take
            self._count(take)
            table = table.slice(take)
            self._flush_row_groups(f, force=False)
            if not self._over_size(f):
                self._end_if_full(bucket)
                continue
            # The rows not written yet belong to the next file, the other stream's first.
            f.rows -= f.pending_rows
            self._count(-f.pending_rows)
            pending = f.take_pending()
            table = pa.concat_tables(pending[stream] + [table])
            self._end_if_full(bucket)
            if pending[1 - stream]:
                self._append(bucket, pa.concat_tables(pending[1 - stream]), 1 - stream)

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
            write_row_groups(f, self.cfg, force, self._over_size)
        except OSError as exc:
            raise self._output_error(exc, f.part_path) from None
