"""What a set of Parquet or C-DNS files holds, counted once for `dnsprobe inspect --summary` and `dnsprobe
report` (probe.cli.summary, probe.cli.report): both print the figures computed here.

Records and time span, transactions per second (mean and peak second), the most frequent QNAMEs, registered
domains and clients, the QTYPE, RCODE and transport mix, matched / query-only / response-only, response-delay
percentiles and a histogram; for the report also (Tally(report=True)) the transactions over time by RCODE and
presence, the response delays by transport, the EDNS buffer sizes and DO bit of the queries, the TC bit of the
responses by transport.

Every figure is computed by Arrow's compute functions, table by table (a Parquet file's row groups, only the
columns needed; a C-DNS file or a live journal whole): each table is reduced to (value, count) tables by hash
grouping, the partial counts of all tables are summed by one more grouping at the end, and only the short results
reach Python. The delays too are counted by value, so their percentiles and histogram are exact whatever the number
of records. Registered domains are taken from the files where they hold them (enrich.public_suffix), else found
with the bundled Public Suffix List (ICANN section) for each table's distinct QNAMEs.
"""

import bisect
import datetime

from export.metrics import transport_names
from probe.decode.mnemonics import rcode_name, rr_type_name

# The columns the summary reads (a file that lacks one is read as if it were all null there).
SUMMARY_COLUMNS = (
    "time", "qname", "registered_domain", "src", "qtype", "rcode", "query_present", "response_present",
    "transport", "prot", "response_delay_us",
)
# And those the report reads besides (the TC bit of the response, the EDNS buffer size and DO bit of the query).
REPORT_COLUMNS = SUMMARY_COLUMNS + ("tc", "edns_udp", "edns_do")
BATCH_ROWS = 1 << 20  # Parquet rows reduced at a time (at most: a batch ends with its row group)
# Read from Parquet as Arrow dictionaries, as they are stored: their texts are not copied out row by row, and a
# row group's names are grouped by their dictionary indexes (a third of the time of texts, measured).
DICTIONARY_COLUMNS = ("qname", "src", "registered_domain")
# Percentiles of the response delay, in thousandths: integer arithmetic picks the rank exactly.
PERCENTILES_PERMILLE = (500, 900, 950, 990, 999)
COUNTED = ("second", "qtype", "rcode", "qname", "registered_domain", "src", "transport", "delay", "presence")
# The report's groupings besides (their key columns): records by time bucket, RCODE and presence; response delays
# by transport; queries by EDNS buffer size and DO bit; responses by transport and TC bit.
REPORT_KEYS = {"timeline": ["bucket", "rcode", "query", "response"], "transport_delay": ["transport", "delay"],
               "edns": ["edns_udp", "edns_do"], "tc": ["transport", "tc"]}
# The widths of the timeline's buckets in µs, each a multiple of the one before (so that counts by one width are
# counted again by a wider one exactly): the narrowest that splits the time span in at most TIMELINE_BUCKETS.
BUCKET_WIDTHS_US = (1_000, 10_000, 100_000, 1_000_000, 10_000_000, 60_000_000, 600_000_000, 3_600_000_000,
                    86_400_000_000)
TIMELINE_BUCKETS = 1_000
CDF_POINTS = 200  # the response delay's CDF by transport: its quantiles at 0, 1/200, ... 1


def read_tables(paths, columns=SUMMARY_COLUMNS, time_range=None):
    """Yield the columns of each file's records as Arrow tables (only the records of time_range, (first, end) in
    µs, when given), and at the end the list of errors of the files that could be read only in part (C-DNS; their
    records before the problem are yielded)."""
    import pyarrow.parquet as pq

    from export.cdns.reader import file_head
    from probe.cli.inspect import _inspect_files
    from probe.cli.output import need_file

    errors = []
    for path in paths:
        need_file(path)
        if str(path).endswith(".parquet") and file_head(path)[:4] == b"PAR1":
            parquet = pq.ParquetFile(path, read_dictionary=DICTIONARY_COLUMNS)
            present = [c for c in columns if c in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=present):
                yield _in_range(_typed_columns(batch, columns), time_range)
            continue
        tables, file_errors = _inspect_files([path])  # C-DNS, journals: the reader of inspect's table
        errors += file_errors
        yield from (_in_range(_typed_columns(t, columns), time_range) for t in tables)
    yield errors


def _in_range(table, time_range):
    import pyarrow.compute as pc

    if time_range is None:
        return table
    times = table.column("time")
    return table.filter(pc.and_(pc.greater_equal(times, time_range[0]), pc.less(times, time_range[1])))


def _typed_columns(table, names):
    """The table's columns of those names in their schema types, null where the file has none; a record batch's
    dictionaries as they are (Arrow's grouping takes one dictionary, not chunks of differing ones)."""
    import pyarrow as pa

    from export.parquet.schema import SCHEMA

    columns = {}
    for name in names:
        typ = SCHEMA.field(name).type
        if name not in table.schema.names:
            columns[name] = pa.nulls(table.num_rows, typ)
        elif pa.types.is_dictionary(column_type := table.schema.field(name).type) and column_type.value_type == typ \
                and not isinstance(column := table.column(name), pa.ChunkedArray):
            columns[name] = column  # one dictionary (a record batch's): grouped by its indexes
        else:
            columns[name] = table.column(name).cast(typ)
    return pa.table(columns)


def _grouped(table, keys):
    """(keys..., count) of the rows of a table by the values of its key columns (nulls a value of their own); keys
    read as dictionaries come out as their values, so that the partial counts of all tables concatenate."""
    import pyarrow as pa

    grouped = _keys_and(table.select(keys).group_by(keys, use_threads=False).aggregate([([], "count_all")]), keys)
    for i, field in enumerate(grouped.schema):
        if pa.types.is_dictionary(field.type):
            grouped = grouped.set_column(i, field.name, grouped.column(i).cast(field.type.value_type))
    return grouped


def _keys_and(grouped, keys):
    """A group_by's result (its keys and its one aggregate, in an order that changed with pyarrow's versions) as
    (keys..., count)."""
    (aggregate,) = (c for c in grouped.column_names if c not in keys)
    return grouped.select(keys + [aggregate]).rename_columns(keys + ["count"])


def _merged(partials, keys, force=False):
    """The (keys..., count) tables of several tables as one, the counts of a value summed."""
    import pyarrow as pa

    if len(partials) == 1 and not force:
        return partials[0]
    table = pa.concat_tables(partials)
    return _keys_and(table.group_by(keys, use_threads=False).aggregate([("count", "sum")]), keys)


class Tally:
    """The partial counts of the tables added so far."""

    def __init__(self, report=False):
        self.records = 0
        self.first = self.last = None
        self.report = report  # the report's groupings too (REPORT_KEYS; the tables need REPORT_COLUMNS)
        self.partials = {what: [] for what in (*COUNTED, *(REPORT_KEYS if report else ()))}
        self.suffixes = None  # the Public Suffix List, read when a file has no registered domains
        self.bucket_us = BUCKET_WIDTHS_US[0]  # the timeline's, widened as the time span grows

    def add(self, table):
        import pyarrow as pa
        import pyarrow.compute as pc

        if not table.num_rows:
            return
        self.records += table.num_rows
        times = table.column("time")
        low, high = pc.min_max(times).values()
        if low.is_valid:
            self.first = low.as_py() if self.first is None else min(self.first, low.as_py())
            self.last = high.as_py() if self.last is None else max(self.last, high.as_py())
        delays = pc.drop_null(table.column("response_delay_us"))
        derived = pa.table({
            "second": pc.divide(times, 1_000_000),  # capture times are after 1970: the division floors them
            "transport": transport_names(table.column("transport"), table.column("prot")),
            "query": pc.fill_null(table.column("query_present"), False),
            "response": pc.fill_null(table.column("response_present"), False),
        })
        for what, source, keys in (("second", derived, ["second"]), ("qtype", table, ["qtype"]),
                                   ("rcode", table, ["rcode"]), ("src", table, ["src"]), ("qname", table, ["qname"]),
                                   ("transport", derived, ["transport"]),
                                   ("presence", derived, ["query", "response"]),
                                   ("delay", pa.table({"delay": delays}), ["delay"])):
            self.partials[what].append(_grouped(source, keys))
        self.partials["registered_domain"].append(self._registered_domains(table, self.partials["qname"][-1]))
        if self.report:
            self._add_report(table, derived)

    def _add_report(self, table, derived):
        """The report's partial counts of a table (REPORT_KEYS), the timeline's buckets widened first if the time
        span has outgrown them."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.first is not None:
            self._widen(next((w for w in BUCKET_WIDTHS_US if (self.last - self.first) // w < TIMELINE_BUCKETS),
                             BUCKET_WIDTHS_US[-1]))
        timeline = pa.table({"bucket": pc.divide(table.column("time"), self.bucket_us), "rcode": table.column("rcode"),
                             "query": derived.column("query"), "response": derived.column("response")})
        both = pa.table({"transport": derived.column("transport"), "delay": table.column("response_delay_us"),
                         "tc": table.column("tc"), "edns_udp": table.column("edns_udp"),
                         "edns_do": table.column("edns_do")})
        for what, source in (("timeline", timeline),
                             ("transport_delay", both.filter(pc.is_valid(both.column("delay")))),
                             ("edns", both.filter(derived.column("query"))),
                             ("tc", both.filter(derived.column("response")))):
            self.partials[what].append(_grouped(source, REPORT_KEYS[what]))

    def _widen(self, bucket_us):
        """The timeline counted again in buckets of bucket_us (a multiple of the present width)."""
        import pyarrow.compute as pc

        if bucket_us <= self.bucket_us:
            return
        keys = REPORT_KEYS["timeline"]
        if self.partials["timeline"]:
            counts = _merged(self.partials["timeline"], keys)
            counts = counts.set_column(0, "bucket", pc.divide(counts.column("bucket"), bucket_us // self.bucket_us))
            self.partials["timeline"] = [_merged([counts], keys, force=True)]
        self.bucket_us = bucket_us

    def _registered_domains(self, table, names):
        """(registered_domain, count) of a table: the files' own, else the Public Suffix List's, found for each
        distinct QNAME of the table (names: their counts), not for each record."""
        import pyarrow as pa
        import pyarrow.compute as pc

        stored = table.column("registered_domain")
        if not stored.null_count:
            return _grouped(table, ["registered_domain"])
        if self.suffixes is None:
            from export.enrich.psl import PublicSuffixes

            self.suffixes = PublicSuffixes()
        if stored.null_count == len(stored):
            found = self.suffixes.columns(names.column("qname"))[1]
            return _merged([pa.table({"registered_domain": found, "count": names.column("count")})],
                           ["registered_domain"], force=True)
        # Some records with, some without (files of both kinds in one table): each its own, else the list's.
        found = self.suffixes.columns(table.column("qname").cast(pa.string()))[1]
        return _grouped(pa.table({"registered_domain": pc.coalesce(stored.cast(pa.string()), found)}),
                        ["registered_domain"])

    def counts(self, what):
        keys = ["query", "response"] if what == "presence" else REPORT_KEYS.get(what, [what])
        return _merged(self.partials[what], keys) if self.partials[what] else None


def tally_of(paths, report=False, time_range=None):
    """The Tally of the records of the files (of time_range only, when given) and the errors of files read in
    part."""
    tally = Tally(report)
    for table in read_tables(paths, REPORT_COLUMNS if report else SUMMARY_COLUMNS, time_range):
        if isinstance(table, list):
            return tally, table
        tally.add(table)


def summarise(paths, top=10):
    """The summary of the records of the files (a dict, as --json prints it) and the errors of files read in
    part."""
    tally, errors = tally_of(paths)
    return summary_of(tally, len(paths), top), errors


def report_of(tally, files, top):
    """The summary of a Tally(report=True) and the report's figures besides."""
    return {**summary_of(tally, files, top), "timeline": _timeline(tally), "delay_by_transport": _delay_by_transport(
        tally), "edns": _edns(tally.counts("edns")), "tc": _truncated(tally.counts("tc"))}


def _timeline(tally):
    """Records by time bucket (every bucket from the first to the last, µs from the epoch): their number by RCODE
    name (no response: None) and the share of the queries that have no response (None: no query in the bucket)."""
    import pyarrow.compute as pc

    counts = tally.counts("timeline")
    if counts is None or not len(counts):
        return None
    low, high = (v.as_py() for v in pc.min_max(counts.column("bucket")).values())
    size = high - low + 1
    by_rcode, queries, unanswered = {}, [0] * size, [0] * size
    for bucket, rcode, query, response, count in _rows(counts, REPORT_KEYS["timeline"] + ["count"]):
        series = by_rcode.setdefault(rcode, [0] * size)
        series[bucket - low] += count
        if query:
            queries[bucket - low] += count
            unanswered[bucket - low] += count if not response else 0
    order = sorted(by_rcode, key=lambda r: (r is None, r))
    return {"bucket_seconds": tally.bucket_us / 1e6, "buckets": [(low + i) * tally.bucket_us for i in range(size)],
            "rcodes": {rcode_name(r) if r is not None else None: by_rcode[r] for r in order},
            "query_only_share": [u / q if q else None for u, q in zip(unanswered, queries)]}


def _delay_by_transport(tally):
    """{transport: the response delays' figures (as the summary's) and their quantiles at CDF_POINTS + 1 ranks}."""
    import pyarrow.compute as pc

    counts = tally.counts("transport_delay")
    if counts is None:
        return {}
    out = {}
    for transport in sorted(counts.column("transport").unique().to_pylist(), key=lambda t: (t is None, t)):
        mine = counts.filter(pc.is_null(counts.column("transport")) if transport is None else
                             pc.equal(counts.column("transport"), transport))
        delays = _merged([mine.select(["delay", "count"])], ["delay"], force=True).sort_by("delay")
        values = delays.column("delay").to_pylist()
        ends = pc.cumulative_sum(delays.column("count")).to_pylist()
        n = ends[-1]
        out[transport] = {**_delays(delays), "quantiles": [
            values[bisect.bisect_right(ends, (n - 1) * i // CDF_POINTS)] for i in range(CDF_POINTS + 1)]}
    return out


def _edns(counts):
    """The queries' EDNS buffer sizes (0: no OPT record; most frequent first) and DO bits."""
    sizes, do = {}, {"do": 0, "no_do": 0, "no_edns": 0}
    for size, bit, count in _rows(counts, REPORT_KEYS["edns"] + ["count"]):
        size = size or 0  # (null: a file without the column)
        sizes[size] = sizes.get(size, 0) + count
        do["no_edns" if not size else "do" if bit else "no_do"] += count
    return {"buffer_sizes": sorted(sizes.items(), key=lambda sc: (-sc[1], sc[0])), "do": do}


def _truncated(counts):
    """{transport: {"responses": n, "truncated": those with TC}}."""
    out = {}
    for transport, tc, count in _rows(counts, REPORT_KEYS["tc"] + ["count"]):
        mine = out.setdefault(transport, {"responses": 0, "truncated": 0})
        mine["responses"] += count
        mine["truncated"] += count if tc else 0
    return out


def files_meta(paths):
    """What the files say of themselves (export.filemeta.read_meta, as `inspect --meta` prints it): {key: [(value,
    number of files)]}, most frequent value first."""
    from export.filemeta import read_meta

    out = {}
    for path in paths:
        for key, value in read_meta(path).items():
            out.setdefault(key, {}).setdefault(value, 0)
            out[key][value] += 1
    return {key: sorted(values.items(), key=lambda vc: (-vc[1], str(vc[0]))) for key, values in out.items()}


def summary_of(tally, files, top):
    presence = {(q, r): c for q, r, c in _rows(tally.counts("presence"), ["query", "response", "count"])}
    return {
        "files": files,
        "records": tally.records,
        "time": _time_span(tally),
        "rate": _rate(tally),
        "transactions": {"matched": presence.get((True, True), 0), "query_only": presence.get((True, False), 0),
                         "response_only": presence.get((False, True), 0)},
        "transports": _mix(tally.counts("transport"), "transport"),
        "qtypes": [{**row, "name": rr_type_name(row["qtype"])} for row in _mix(tally.counts("qtype"), "qtype")],
        "rcodes": [{**row, "name": rcode_name(row["rcode"])} for row in _mix(tally.counts("rcode"), "rcode")],
        "qnames": _top(tally.counts("qname"), "qname", top),
        "registered_domains": _top(tally.counts("registered_domain"), "registered_domain", top),
        "clients": _top(tally.counts("src"), "src", top),
        "response_delay_us": _delays(tally.counts("delay")),
    }


def _rows(table, columns):
    if table is None:
        return []
    return zip(*(table.column(c).to_pylist() for c in columns))


def _iso(us, digits=True):
    t = datetime.datetime.fromtimestamp(us // 1_000_000, datetime.timezone.utc)
    return f"{t:%Y-%m-%dT%H:%M:%S}" + (f".{us % 1_000_000:06d}Z" if digits else "Z")


def _time_span(tally):
    if tally.first is None:
        return None
    return {"first": _iso(tally.first), "last": _iso(tally.last), "seconds": (tally.last - tally.first) / 1e6}


def _rate(tally):
    """Mean transactions per second over the time span, and the busiest second (the earliest of equals)."""
    seconds = tally.counts("second")
    if seconds is None or tally.first is None:
        return None
    peak_second, peak = min(((s, c) for s, c in _rows(seconds, ["second", "count"]) if s is not None),
                            key=lambda sc: (-sc[1], sc[0]))
    span = (tally.last - tally.first) / 1e6
    return {"mean_per_second": tally.records / span if span > 0 else None, "peak_per_second": peak,
            "peak_second": _iso(peak_second * 1_000_000, digits=False)}


def _mix(counts, key):
    """Every value with its count, most frequent first (then by value; null last)."""
    rows = [{key: v, "count": c} for v, c in _rows(counts, [key, "count"])]
    return sorted(rows, key=lambda r: (-r["count"], r[key] is None, r[key] if r[key] is not None else 0))


def _top(counts, key, n):
    """The n most frequent values (then by value), and the number of distinct ones. Null is not one, nor in the
    list (a transaction without a question has no QNAME): as in `dnsprobe top`'s lists."""
    import pyarrow.compute as pc

    if counts is None:
        return {"distinct": 0, "top": []}
    counts = counts.filter(pc.is_valid(counts.column(key)))
    distinct = len(counts)
    picked = counts.take(pc.select_k_unstable(counts, k=min(n, len(counts)), sort_keys=[
        ("count", "descending"), (key, "ascending")])) if n else counts.slice(0, 0)
    return {"distinct": distinct, "top": [{key: v, "count": c} for v, c in _rows(picked, [key, "count"])]}


def _delays(counts):
    """Percentiles (exact: the value of rank floor(q × (n − 1)) in the sorted delays), extremes, mean and the
    histogram of the response delays, from their (delay, count) table."""
    import pyarrow.compute as pc

    if counts is None or not len(counts):
        return None
    counts = counts.sort_by("delay")
    values = counts.column("delay").to_pylist()
    ends = pc.cumulative_sum(counts.column("count")).to_pylist()  # ends[i]: rows up to and with values[i]
    n = ends[-1]
    total = pc.sum(pc.multiply(counts.column("delay"), counts.column("count"))).as_py()
    out = {"count": n, "min": values[0], "max": values[-1], "mean": total / n}
    for permille in PERCENTILES_PERMILLE:
        rank = (n - 1) * permille // 1000
        out[f"p{permille / 10:g}"] = values[bisect.bisect_right(ends, rank)]
    out["histogram"] = _histogram(values, ends)
    return out


def histogram_edges(low, high):
    """Bucket edges in µs, 1-2-5 in each decade (1, 2, 5, 10, 20, ...): from the largest at or below low (1 at the
    least) to the first above high."""
    edges, decade = [], 1
    while not edges or edges[-1] <= high:
        edges += [step * decade for step in (1, 2, 5)]
        decade *= 10
    return edges[bisect.bisect_right(edges, max(low, 1)) - 1: bisect.bisect_right(edges, high) + 1]


def _histogram(values, ends):
    """[{from_us, to_us, count}] over 1-2-5 buckets from the smallest delay to the largest (the first bucket
    from null: any delay under 1 µs)."""
    edges = histogram_edges(values[0], values[-1])
    below = [0] + [ends[i - 1] if (i := bisect.bisect_left(values, e)) else 0 for e in edges]
    buckets = [{"from_us": None, "to_us": edges[0], "count": below[1]}] if values[0] < 1 else []
    buckets += [{"from_us": edges[i], "to_us": edges[i + 1], "count": below[i + 2] - below[i + 1]}
                for i in range(len(edges) - 1)]
    return buckets


