"""`dnsprobe inspect`: print the records of Parquet or C-DNS files, or rebuild C-DNS files as a pcap."""

import json
import sys

from probe.cli.flags import FORMATTER
from probe.cli.output import error, need_file
from probe.errors import ConfigError, DnsprobeError

INSPECT_EPILOG = """\
examples:
  dnsprobe inspect out/dnsprobe.20200819.134153.851855.w0.parquet
  dnsprobe inspect out/*.parquet --json --limit 5
  dnsprobe inspect FILE.parquet --columns qname,qtype,rcode,response_delay_us
  dnsprobe inspect capture.cdns.xz --json                # a C-DNS file (RFC 8618), any writer: every record
  dnsprobe inspect --pcap rebuilt.pcap capture.cdns.xz    # its DNS messages as a pcap (full sections needed)

C-DNS files (plain, .gz, .xz or .zst, told from Parquet by their content) are printed with the Parquet
column names; columns C-DNS does not record (len, res_len, udp_sum, vlan, tcp_hs_rtt, response_messages)
are absent.
"""

TABLE_LIMIT = 20  # records the table view prints unless --limit says otherwise
DEFAULT_INSPECT_COLUMNS = (
    "time", "src", "srcp", "dst", "dstp", "prot", "id", "qname", "qtype", "rcode",
    "query_present", "response_present", "response_delay_us", "malformed",
)




def add_parser(sub):
    insp = sub.add_parser(
        "inspect",
        help="print records of an output file",
        description="Print the records of dnsprobe Parquet files or of C-DNS files as a table or as JSON lines.",
        epilog=INSPECT_EPILOG,
        formatter_class=FORMATTER,
    )
    insp.add_argument("files", nargs="+", metavar="FILE", help="a .parquet file written by dnsprobe, or a C-DNS file")
    insp.add_argument("--pcap", metavar="OUT", help="rebuild the DNS messages of C-DNS FILEs as the pcap OUT")
    insp.add_argument("--json", action="store_true", help="one JSON object per record")
    insp.add_argument("--limit", type=int, metavar="N",
                      help=f"records to print (0: all; default: {TABLE_LIMIT} in the table, all with --json)")
    insp.add_argument("--columns", metavar="A,B,...", help="columns to print (default: a summary set)")
    insp.add_argument("--all-columns", action="store_true", help="print every column")


def _inspect_files(files, limit):
    """Tables of the records of Parquet and C-DNS files (told apart by content), and the errors of C-DNS
    files that could be read only in part (their blocks before the problem are in the tables)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from export.cdns.reader import file_head, read_table, sniff_cdns

    tables, errors = [], []
    for f in files:
        need_file(f)
        head = file_head(f)
        if head[:4] != b"PAR1" and not sniff_cdns(head) and head[:1] not in (b"\x83", b"\x9f"):
            what = f"it starts with bytes {head[:4].hex()}" if head else "it is empty"
            raise DnsprobeError(f"{f}: neither a Parquet file nor a C-DNS file ({what})")
        if head[:4] != b"PAR1":
            table, error = read_table(f, limit)
            if error is not None and not len(table):
                raise error
            errors += [error] if error else []
            tables.append(table)
            continue
        try:
            tables.append(pq.read_table(f))
        except (pa.ArrowInvalid, OSError) as exc:
            raise DnsprobeError(f"{f}: not a readable Parquet file: {exc}") from None
    return tables, errors


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

    if args.limit is None:
        args.limit = 0 if args.json else TABLE_LIMIT  # JSON is for pipes: all of it
    if args.limit < 0:
        raise ConfigError("--limit must be 0 or more")
    if args.pcap:
        return _inspect_pcap(args)
    tables, errors = _inspect_files(args.files, args.limit)
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    if args.limit:
        table = table.slice(0, args.limit)
    if args.all_columns:
        columns = table.column_names
    elif args.columns:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    else:
        columns = [c for c in DEFAULT_INSPECT_COLUMNS if c in table.column_names]
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConfigError(f"unknown column(s): {', '.join(missing)}")
    rows = _printable(table.select(columns)).to_pylist()
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
        return _partial(errors)
    from rich.console import Console
    from rich.table import Table

    cells = [["" if row[c] is None else str(row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out = Table(show_lines=False)
    for c in columns:
        out.add_column(c, no_wrap=True)
    for r in cells:
        out.add_row(*r)
    # Wide enough that no cell is folded; a terminal wraps long lines itself.
    Console(file=sys.stdout, width=sum(widths) + 3 * len(columns) + 1).print(out)
    return _partial(errors)


def _partial(errors):
    """Exit status after printing what could be read: 1, with one line per file, if some were read in part."""
    sys.stdout.flush()
    for exc in errors:
        error(f"{exc} (the records before it were printed)")
    return 1 if errors else 0


def _printable(table):
    """Timestamps as ISO text with all their digits (pyarrow cannot make datetimes of nanoseconds)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            text = pc.strftime(table.column(i), format="%Y-%m-%dT%H:%M:%SZ")
            table = table.set_column(i, field.name, text)
    return table


