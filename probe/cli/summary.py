"""`dnsprobe inspect --summary`: what a set of Parquet or C-DNS files holds, without SQL.

Records and time span, transactions per second (mean and peak second), the most frequent QNAMEs, registered
domains and clients, the QTYPE, RCODE and transport mix, matched / query-only / response-only, response-delay
percentiles and a histogram.

Every figure is computed by Arrow's compute functions, table by table (a Parquet file's row groups, only the
columns needed; a C-DNS file or a live journal whole): each table is reduced to (value, count) tables by hash
grouping, the partial counts of all tables are summed by one more grouping at the end, and only the short results
reach Python. The delays too are counted by value, so their percentiles and histogram are exact whatever the number
of records. Registered domains are taken from the files where they hold them (enrich.public_suffix), else found
with the bundled Public Suffix List (ICANN section) for each table's distinct QNAMEs.
"""

import bisect
import datetime
import sys

from probe.decode.mnemonics import rcode_name, rr_type_name
from probe.errors import ConfigError

# The columns the summary reads (a file that lacks one is read as if it were all null there).
SUMMARY_COLUMNS = (
    "time", "qname", "registered_domain", "src", "qtype", "rcode", "query_present", "response_present",
    "transport", "prot", "response_delay_us",
)
BATCH_ROWS = 1 << 20  # Parquet rows reduced at a time (at most: a batch ends with its row group)
# Read from Parquet as Arrow dictionaries, as they are stored: their texts are not copied out row by row, and a
# row group's names are grouped by their dictionary indexes (a third of the time of texts, measured).
DICTIONARY_COLUMNS = ("qname", "src", "registered_domain")
# Percentiles of the response delay, in thousandths: integer arithmetic picks the rank exactly.
PERCENTILES_PERMILLE = (500, 900, 950, 990, 999)
COUNTED = ("second", "qtype", "rcode", "qname", "registered_domain", "src", "transport", "delay", "presence")


def read_tables(paths):
    """Yield the summary columns of each file's records as Arrow tables, and at the end the list of errors of the
    files that could be read only in part (C-DNS; their records before the problem are yielded)."""
    import pyarrow.parquet as pq

    from export.cdns.reader import file_head
    from probe.cli.inspect import _inspect_files
    from probe.cli.output import need_file

    errors = []
    for path in paths:
        need_file(path)
        if str(path).endswith(".parquet") and file_head(path)[:4] == b"PAR1":
            parquet = pq.ParquetFile(path, read_dictionary=DICTIONARY_COLUMNS)
            columns = [c for c in SUMMARY_COLUMNS if c in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
                yield _summary_columns(batch)
            continue
        tables, file_errors = _inspect_files([path])  # C-DNS, journals: the reader of inspect's table
        errors += file_errors
        yield from (_summary_columns(t) for t in tables)
    yield errors


def _summary_columns(table):
    """The table's SUMMARY_COLUMNS in their schema types, null where the file has none; a record batch's
    dictionaries as they are (Arrow's grouping takes one dictionary, not chunks of differing ones)."""
    import pyarrow as pa

    from export.parquet.schema import SCHEMA

    columns = {}
    for name in SUMMARY_COLUMNS:
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

    def __init__(self):
        self.records = 0
        self.first = self.last = None
        self.partials = {what: [] for what in COUNTED}
        self.suffixes = None  # the Public Suffix List, read when a file has no registered domains

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
        # A record without a transport (files written before the column) has its IP protocol's.
        by_prot = pc.if_else(pc.equal(table.column("prot"), 17), "udp",
                             pc.if_else(pc.equal(table.column("prot"), 6), "tcp", pa.scalar(None, pa.string())))
        delays = pc.drop_null(table.column("response_delay_us"))
        derived = pa.table({
            "second": pc.divide(times, 1_000_000),  # capture times are after 1970: the division floors them
            "transport": pc.coalesce(table.column("transport"), by_prot),
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
        keys = ["query", "response"] if what == "presence" else [what]
        return _merged(self.partials[what], keys) if self.partials[what] else None


def summarise(paths, top=10):
    """The summary of the records of the files (a dict, as --json prints it) and the errors of files read in
    part."""
    tally = Tally()
    for table in read_tables(paths):
        if isinstance(table, list):
            errors = table
            break
        tally.add(table)
    return summary_of(tally, len(paths), top), errors


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
    """The n most frequent values (then by value), and the number of distinct ones (null not one)."""
    import pyarrow.compute as pc

    if counts is None:
        return {"distinct": 0, "top": []}
    distinct = len(counts) - counts.column(key).null_count
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


def run_summary(args):
    """inspect --summary: the summary of the files as text for people or, with --json, one JSON object."""
    import json

    from probe.cli.inspect import _expand
    from probe.cli.output import error

    if args.pcap or args.columns or args.all_columns:
        raise ConfigError("--summary takes --json and --limit (the length of its lists) only")
    top = SUMMARY_TOP if args.limit is None else args.limit
    if top < 0:
        raise ConfigError("--limit must be 0 or more")
    paths = _expand(args.files)
    summary, errors = summarise(paths, top)
    print(json.dumps(summary, indent=2) if args.json else "\n".join(summary_text(summary)))
    sys.stdout.flush()
    for exc in errors:
        error(f"{exc} (the records before it are counted)")
    return 1 if errors else 0


def summary_text(s):
    """The lines of the summary for people: counts with thousands separators, shares in per cent, delays in µs,
    ms or s, QTYPE and RCODE by name, lists ranked, names cut to fit 120 columns."""
    records = s["records"]
    lines = [f"{records:,} record{'s' * (records != 1)} in {s['files']:,} file{'s' * (s['files'] != 1)}"]
    if not records:
        return lines
    if s["time"]:
        t = s["time"]
        lines.append(f"time span     {t['first']} to {t['last']} ({_seconds(t['seconds'])})")
    if s["rate"]:
        r = s["rate"]
        mean = "-" if r["mean_per_second"] is None else f"{r['mean_per_second']:,.0f}"
        lines.append(f"per second    {mean} on average; the busiest second {r['peak_per_second']:,} "
                     f"({r['peak_second']})")
    tx = s["transactions"]
    lines.append("transactions  " + ", ".join(f"{tx[k]:,} {label} ({_share(tx[k], records)})" for k, label in (
        ("matched", "matched"), ("query_only", "query only"), ("response_only", "response only"))))
    lines += _ranking("transport", [(TRANSPORT_NAMES.get(r["transport"], r["transport"] or "unknown"), r["count"])
                                    for r in s["transports"]], records)
    lines += _ranking("QTYPE", [(r["name"] or "- (none)", r["count"]) for r in s["qtypes"]], records)
    lines += _ranking("RCODE", [(r["name"] or "- (no response)", r["count"]) for r in s["rcodes"]], records)
    for key, what in (("qnames", "QNAMEs"), ("registered_domains", "registered domains"), ("clients", "clients")):
        ranked, column = s[key], {"qnames": "qname", "clients": "src"}.get(key, "registered_domain")
        title = f"top {len(ranked['top'])} {what} of {ranked['distinct']:,}" if ranked["top"] else \
            f"{ranked['distinct']:,} {what}"
        lines += _ranking(title, [(_name(r[column], key), r["count"]) for r in ranked["top"]], records)
    if s["response_delay_us"]:
        lines += _delay_lines(s["response_delay_us"])
    return lines


TRANSPORT_NAMES = {"udp": "UDP", "tcp": "TCP", "dot": "DoT", "doh": "DoH", "doq": "DoQ",
                   "dnscrypt-udp": "DNSCrypt over UDP", "dnscrypt-tcp": "DNSCrypt over TCP"}
SUMMARY_TOP = 10  # lines of each top list unless --limit says otherwise
TEXT_WIDTH = 120
BAR_WIDTH = 50
EIGHTHS = " ▏▎▍▌▋▊▉"


def _name(value, key):
    if value is None:
        return "- (none)"
    if value == "" and key == "registered_domains":
        return "- (none: the name is a public suffix)"
    return value if value else '""'


def _share(count, total):
    return f"{100 * count / total:.1f} %" if total else "-"


def _ranking(title, rows, total):
    """A blank line, the title, and a line per (label, count): count, share, label (cut to fit)."""
    lines = ["", title]
    for label, count in rows:
        line = f"  {count:>13,}  {_share(count, total):>7}  "
        room = TEXT_WIDTH - len(line)
        lines.append(line + (label if len(label) <= room else label[: room - 1] + "…"))
    return lines


def _seconds(seconds):
    return f"{seconds:,.3f} s" if seconds < 3600 else f"{seconds / 3600:,.2f} h"


def _delay(us):
    """A delay in its unit: µs under a millisecond, ms under a second, else s (three digits at most)."""
    for unit, scale in (("s", 1_000_000), ("ms", 1_000)):
        if abs(us) >= scale:
            return f"{us / scale:.3g} {unit}"
    return f"{us:.3g} µs" if isinstance(us, float) else f"{us} µs"


def _delay_lines(d):
    lines = ["", f"response delay of {d['count']:,} matched transactions"]
    figures = ["min", *(f"p{p / 10:g}" for p in PERCENTILES_PERMILLE), "max", "mean"]
    lines.append("  " + "   ".join(f"{name} {_delay(d[name])}" for name in figures))
    peak = max(b["count"] for b in d["histogram"])
    for b in d["histogram"]:
        low = "below" if b["from_us"] is None else _delay(b["from_us"])
        eighths = round(8 * BAR_WIDTH * b["count"] / peak)
        bar = "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")
        lines.append(f"  {low:>7} to {_delay(b['to_us']):>6}  {bar:<{BAR_WIDTH}}  {b['count']:>13,}  "
                     f"{_share(b['count'], d['count']):>7}")
    return lines
