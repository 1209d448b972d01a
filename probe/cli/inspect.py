"""`dnsprobe inspect`: print the records of Parquet or C-DNS files, or rebuild C-DNS files as a pcap.

The table is for people: times in ISO 8601, QTYPE and RCODE by name, columns that fit the terminal (120 columns
when the output is not a terminal), and a line saying how many records were not shown. --json is for programs:
every record, numbers as stored. Files being written by a capture are read too, up to their last complete batch
or block: a Parquet journal (NAME.parquet.journal) or a C-DNS NAME.cdns[...].part."""

import json
import os
import sys
from pathlib import Path

from probe.cli.output import need_file, read_in_part
from probe.decode.mnemonics import rcode_name, rr_type_name
from probe.errors import ConfigError, DnsprobeError

INSPECT_EPILOG = """\
examples:
  dnsprobe inspect out/dnsprobe.20200819.134153.851855.w0.parquet
  dnsprobe inspect out/                                  # every file of a directory, also a capture's live ones
  dnsprobe inspect out/*.parquet --json --limit 5
  dnsprobe inspect FILE.parquet --columns qname,qtype,rcode,response_delay_us
  dnsprobe inspect capture.cdns.xz --json                # a C-DNS file (RFC 8618), any writer: every record
  dnsprobe inspect --pcap rebuilt.pcap capture.cdns.xz    # its DNS messages as a pcap (full sections needed)
  dnsprobe inspect --summary out/                        # counts, top names and clients, mixes, delays
  dnsprobe inspect --summary out/ --json --limit 100     # the same as one JSON object, lists of 100
  dnsprobe inspect --meta FILE                           # what the file is: version, privacy, server, source, config

C-DNS files (plain, .gz, .xz or .zst, told from Parquet by their content) are printed with the Parquet
column names; columns C-DNS does not record (len, res_len, udp_sum, vlan, tcp_hs_rtt, response_messages)
are absent.
"""

TABLE_LIMIT = 20  # records the table view prints unless --limit says otherwise
TABLE_WIDTH = 120  # the width the table fits when the output is not a terminal (a file or a pipe has none)
DEFAULT_INSPECT_COLUMNS = ("time", "src", "prot", "qname", "qtype", "rcode", "response_delay_us")
# --json's default: more columns (a program does not mind the width).
DEFAULT_JSON_COLUMNS = (
    "time", "src", "srcp", "dst", "dstp", "prot", "id", "qname", "qtype", "rcode",
    "query_present", "response_present", "response_delay_us", "malformed",
)
# Columns of free-length text, cut (widest first) to fit; the others are always shown whole.
CUTTABLE = ("qname", "domainname", "src", "dst", "edns_client_subnet", "edns_nsid", "edns_other")
READABLE = 12  # a cut column keeps this many characters before a default column is left out
SHORTEST = 8  # and this many at least
# The default columns a narrow terminal leaves out, first to last (time and QNAME stay).
DROP_ORDER = ("prot", "src", "response_delay_us", "rcode", "qtype")
# Shorter headers in the table for people (--columns and --json use the column names).
HEADERS = {"response_delay_us": "delay_us", "query_present": "query", "response_present": "response"}
# The columns a person would read as numbers or names: (column, function of a value).
TRANSPORTS = {17: "UDP", 6: "TCP"}
# Which file names in a directory are records: finished files, and files a capture is writing.
RECORD_FILES = (".parquet", ".parquet.journal", ".cdns", ".cdns.gz", ".cdns.xz", ".cdns.zst")
LIVE_SUFFIXES = (".journal", ".part")


def add_parser(sub):
    insp = sub.add_parser(
        "inspect",
        help="print records of an output file",
        description="Print the records of dnsprobe Parquet files or of C-DNS files as a table or as JSON lines.",
        epilog=INSPECT_EPILOG,
    )
    insp.add_argument("files", nargs="+", metavar="FILE",
                      help="a .parquet file written by dnsprobe, a C-DNS file, or a directory (every file in it)")
    insp.add_argument("--pcap", metavar="OUT", help="rebuild the DNS messages of C-DNS FILEs as the pcap OUT")
    insp.add_argument("--json", action="store_true", help="one JSON object per record")
    insp.add_argument("--limit", type=int, metavar="N",
                      help=f"records to print (0: all; default: {TABLE_LIMIT} in the table, all with --json)")
    insp.add_argument("--columns", metavar="A,B,...", help="columns to print (default: a summary set)")
    insp.add_argument("--all-columns", action="store_true", help="print every column")
    insp.add_argument("--summary", action="store_true",
                      help="print a summary of the records instead: time span, rate, top QNAMEs, registered domains "
                           "and clients, QTYPE, RCODE and transport mix, response delays (--limit: list length)")
    insp.add_argument("--meta", action="store_true",
                      help="print what each file says of itself instead: dnsprobe and schema version, client address "
                           "privacy, server, capture source kind, configuration digest (--json: one object a file)")


def record_files(directory):
    """The files of records in a directory and below it (a hive layout's partitions), in path order: finished
    ones, and those a capture is writing."""
    names = sorted(p for p in Path(directory).rglob("*") if p.is_file() and (
        p.name.endswith(RECORD_FILES) or (".cdns" in p.name and p.name.endswith(".part"))))
    if not names:
        raise ConfigError(f"{directory}: no dnsprobe output files in it (.parquet, .cdns[.gz|.xz|.zst], or a "
                          "capture's .journal or .part)")
    return names


def _expand(files):
    out = []
    for f in files:
        out += record_files(f) if Path(f).is_dir() else [f]
    return out


def _inspect_files(files):
    """Tables of the records of Parquet and C-DNS files (told apart by content) and of live journals, and the
    errors of files that could be read only in part (their records before the problem are in the tables). A
    file being written (.journal, .part) ends where its writer has got to: that is not an error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from export.cdns.reader import file_head, read_table, sniff_cdns
    from export.parquet.journal import read_journal

    tables, errors = [], []
    for f in files:
        need_file(f)
        live = str(f).endswith(LIVE_SUFFIXES)
        if str(f).endswith(".parquet.journal"):
            tables.append(read_journal(f)[0])
            continue
        head = file_head(f)
        if head[:4] != b"PAR1" and not sniff_cdns(head) and head[:1] not in (b"\x83", b"\x9f"):
            what = f"it starts with bytes {head[:4].hex()}" if head else "it is empty"
            raise DnsprobeError(f"{f}: neither a Parquet file nor a C-DNS file ({what})")
        if head[:4] != b"PAR1":
            table, error = read_table(f)
            if error is not None and not len(table) and not live:
                raise error
            errors += [error] if error and not live else []
            tables.append(table)
            continue
        try:
            tables.append(pq.read_table(f))
        except (pa.ArrowInvalid, OSError) as exc:
            raise DnsprobeError(f"{f}: not a readable Parquet file: {exc}") from None
    return tables, errors


def _inspect_meta(args):
    """Each file's metadata (export.filemeta.read_meta): `file:` then `  key: value` lines, or one JSON object a
    file with --json."""
    from export.filemeta import read_meta

    for f in _expand(args.files):
        need_file(f)
        meta = read_meta(f)
        if args.json:
            print(json.dumps({"file": str(f), **meta}))
        else:
            print(f"{f}:" + "".join(f"\n  {k}: {v}" for k, v in meta.items()))
    return 0


def _inspect_pcap(args):
    from export.cdns.pcap import rebuild_pcap
    from export.cdns.reader import file_head, sniff_cdns

    for f in args.files:
        need_file(f)
        if not sniff_cdns(file_head(f)):
            raise ConfigError(f"{f}: --pcap rebuilds C-DNS files only, and this is not one")
    packets, messages = rebuild_pcap(args.files, args.pcap)
    print(f"{args.pcap}: {packets} packets, {messages} DNS messages from {len(args.files)} C-DNS file(s)")
    return 0


def run(args):
    import pyarrow as pa

    if args.summary:
        from probe.cli.summary import run_summary

        return run_summary(args)
    if args.meta:
        return _inspect_meta(args)
    if args.limit is None:
        args.limit = 0 if args.json else TABLE_LIMIT  # JSON is for pipes: all of it
    if args.limit < 0:
        raise ConfigError("--limit must be 0 or more")
    if args.pcap:
        return _inspect_pcap(args)
    tables, errors = _inspect_files(_expand(args.files))
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    total = table.num_rows
    if args.limit:
        table = table.slice(0, args.limit)
    if args.all_columns:
        columns = table.column_names
    elif args.columns:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    else:
        default = DEFAULT_JSON_COLUMNS if args.json else DEFAULT_INSPECT_COLUMNS
        columns = [c for c in default if c in table.column_names]
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConfigError(unknown_columns(missing, table.column_names))
    if args.json:
        for row in _printable(table.select(columns)).to_pylist():
            print(json.dumps(row, default=str))
        return read_in_part(errors, "were printed")
    _print_table(_for_people(table.select(columns)), fit=not args.all_columns, drop=not args.columns)
    if total > table.num_rows:
        more = total - table.num_rows
        print(f"… {more:,} more record{'s' if more > 1 else ''} (--limit N prints N, --limit 0 all)")
    return read_in_part(errors, "were printed")


def _for_people(table):
    """Cells as text: times in ISO 8601 (UTC, to the microsecond), QTYPE and RCODE by name, the transport by
    name, nulls as '-'."""
    import datetime

    def iso_us(us):
        t = datetime.datetime.fromtimestamp(us // 1_000_000, datetime.timezone.utc)
        return f"{t:%Y-%m-%dT%H:%M:%S}.{us % 1_000_000:06d}Z"

    readers = {"qtype": rr_type_name, "rcode": rcode_name, "prot": lambda v: TRANSPORTS.get(v, str(v)),
               "time": iso_us}
    import pyarrow as pa

    columns = {}
    for field in table.schema:
        values = table.column(field.name)
        if pa.types.is_timestamp(field.type):
            values = values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            show = iso_us
        else:
            show = readers.get(field.name, str)
        columns[field.name] = ["-" if v is None else show(v) for v in values.to_pylist()]
    return columns


def unknown_columns(missing, present):
    """The message for --columns naming columns the files do not have: the closest of each, whether it is a
    Parquet column that C-DNS does not record, and the columns there are."""
    from export.parquet.schema import COLUMNS
    from probe.cli.flags import did_you_mean

    parquet = {name for name, _, _ in COLUMNS}
    named = [f"{c!r} (a Parquet column, not recorded in C-DNS)" if c in parquet else f"{c!r}{did_you_mean(c, present)}"
             for c in missing]
    return f"no column {', '.join(named)}; the columns there are: {', '.join(present)}"


def _print_table(columns, fit, drop):
    """The cells as a table; with fit, as wide as the terminal at most: the widest of the CUTTABLE columns (names,
    addresses) are cut with … first, to READABLE characters; then, with drop, the columns of DROP_ORDER are left
    out one by one (a line says which); then the cut columns are cut down to SHORTEST."""
    from rich.console import Console
    from rich.table import Table

    width = _terminal_width()
    headers = {c: HEADERS.get(c, c) for c in columns}
    left_out = []
    while True:
        widths = _fit_widths(columns, headers, width, READABLE if fit else None)
        if not (fit and drop and sum(widths.values()) + 3 * len(widths) + 1 > width):
            break
        victim = next((c for c in DROP_ORDER if c in columns and len(columns) > 1), None)
        if victim is None:
            break
        columns = {c: cells for c, cells in columns.items() if c != victim}
        left_out.append(headers[victim])
    if fit:
        widths = _fit_widths(columns, headers, width, SHORTEST)
    out = Table(show_lines=False)
    for c in columns:
        out.add_column(headers[c], no_wrap=True)
    for row in zip(*(_cut(cells, widths[c]) for c, cells in columns.items())):
        out.add_row(*row)
    Console(file=sys.stdout, width=sum(widths.values()) + 3 * len(columns) + 1).print(out)
    if left_out:
        print(f"(hidden for the width: {', '.join(left_out)}; --all-columns)")


def _terminal_width():
    """The width of the terminal the table goes to, or TABLE_WIDTH when it goes to a file or a pipe."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or TABLE_WIDTH
    except (OSError, ValueError):
        return TABLE_WIDTH


def _fit_widths(columns, headers, width, shortest):
    """Each column's width: its widest cell, the widest CUTTABLE ones cut (not below shortest, nor their header)
    until the table fits `width` (shortest None: not cut)."""
    widths = {c: max([len(headers[c])] + [len(v) for v in cells]) for c, cells in columns.items()}
    room = width - 3 * len(columns) - 1  # borders and padding
    while shortest is not None and sum(widths.values()) > room:
        cuttable = {c: w for c, w in widths.items() if c in CUTTABLE and w > max(len(headers[c]), shortest)}
        if not cuttable:
            break
        widths[max(cuttable, key=cuttable.get)] -= 1
    return widths


def _cut(cells, width):
    return [v if len(v) <= width else v[: width - 1] + "…" for v in cells]


def _printable(table):
    """Timestamps as ISO text with all their digits (pyarrow cannot make datetimes of nanoseconds)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            text = pc.strftime(table.column(i), format="%Y-%m-%dT%H:%M:%SZ")
            table = table.set_column(i, field.name, text)
    return table
