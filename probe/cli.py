"""The `dnsprobe` command.

Exit status: 0 success; 1 an input file could not be (fully) read or the output could not be
written (everything decoded before the problem is still written); 2 usage or configuration error.
"""

import argparse
import json
import sys
from pathlib import Path

import yaml

from probe import __version__
from probe.errors import CaptureFileError, ConfigError, DnsprobeError, OutputError

DESCRIPTION = """\
dnsprobe captures DNS traffic passively, pairs each query with its response, and writes the
transactions as Parquet files whose first 55 columns are those of CZ.NIC DNS Probe, or as C-DNS
(RFC 8618) files.
"""

EPILOG = """\
exit status:
  0  success
  1  an input file was unreadable or corrupt, or the output could not be written
     (everything decoded before the problem is still written and counted)
  2  usage or configuration error (unknown key, wrong type, impossible value)

files:
  config/dnsprobe.yml   default configuration, every option with its default and meaning

See README.md for the output schema and the configuration reference.
"""

READ_EPILOG = """\
Reads pcap and pcapng files, plain or compressed with gzip, xz or zstd (recognised by content),
with Ethernet (802.1Q/802.1ad tags), Linux cooked SLL/SLL2 or raw IPv4/IPv6 link layers. Files are
read in the order given, as one continuous capture: a query in one file can match a response in
the next. Records are written as NAME.parquet.part (C-DNS: NAME.cdns[.gz|.xz|.zst].part) and renamed
when complete; a statistics JSON file is written next to them.

examples:
  dnsprobe read capture.pcap.xz -o out/
  dnsprobe read capture.pcap.xz -o out/ --format cdns --cdns-compression xz
  dnsprobe read day1.pcap day2.pcap -o out/ --query-timeout 2 --compression snappy
  dnsprobe read capture.pcapng -o out/ --set export.rotate_records=1000000
  xzcat day.pcap.xz | dnsprobe read /dev/stdin -o out/
"""

INSPECT_EPILOG = """\
examples:
  dnsprobe inspect out/dnsprobe.20200819.134153.851855.w0.parquet
  dnsprobe inspect out/*.parquet --json --limit 5
  dnsprobe inspect FILE.parquet --columns qname,qtype,rcode,response_delay_us
  dnsprobe inspect capture.cdns.xz --json --limit 0       # a C-DNS file (RFC 8618), any writer
  dnsprobe inspect --pcap rebuilt.pcap capture.cdns.xz    # its DNS messages as a pcap (full sections needed)

C-DNS files (plain, .gz, .xz or .zst, told from Parquet by their content) are printed with the Parquet
column names; columns C-DNS does not record (len, res_len, udp_sum, vlan, tcp_hs_rtt, response_messages)
are absent.
"""

DEFAULT_INSPECT_COLUMNS = (
    "time", "src", "srcp", "dst", "dstp", "prot", "id", "qname", "qtype", "rcode",
    "query_present", "response_present", "response_delay_us", "malformed",
)



def _network_arg(family):
    """argparse type of --ipv4-allow and the like: an address or CIDR prefix of the family, or a usage error
    naming the flag (exit 2)."""
    from probe.privacy import check_network

    check = check_network(family)

    def network(text):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return network


# Command-line flags that set config keys: (flag, key, argparse type, help, action).
CONFIG_FLAGS = (
    ("--format", "export.format", str, "output format: parquet or cdns (C-DNS, RFC 8618)", None),
    ("--query-timeout", "match.query_timeout", float, "seconds a query waits for its response", None),
    ("--dns-port", "decode.dns_ports", int, "DNS port (repeatable; replaces the configured list)", "append"),
    ("--parser", "decode.parser", str, "DNS parser: auto, fast, wire or dpkt", None),
    ("--rotate-records", "export.rotate_records", int, "close a file after N records (0: never)", None),
    ("--rotate-seconds", "export.rotate_seconds", float, "close a file after S seconds (0: never)", None),
    ("--row-group-size", "export.row_group_size", int, "Parquet rows per row group", None),
    ("--compression", "export.compression", str, "Parquet codec: zstd, snappy, gzip, brotli, lz4, none", None),
    ("--cdns-compression", "export.cdns_compression", str, "C-DNS whole-file compression: none, gzip, xz, zstd", None),
    ("--prefix", "export.file_prefix", str, "output file name prefix", None),
    ("--ipv4-allow", "filter.ipv4_allow", _network_arg(4), "keep only packets from/to this IPv4 address or CIDR"
     " prefix (repeatable)", "append"),
    ("--ipv4-deny", "filter.ipv4_deny", _network_arg(4), "drop packets from/to this IPv4 address or CIDR prefix"
     " (repeatable; unused with --ipv4-allow)", "append"),
    ("--ipv6-allow", "filter.ipv6_allow", _network_arg(6), "keep only packets from/to this IPv6 address or CIDR"
     " prefix (repeatable)", "append"),
    ("--ipv6-deny", "filter.ipv6_deny", _network_arg(6), "drop packets from/to this IPv6 address or CIDR prefix"
     " (repeatable; unused with --ipv6-allow)", "append"),
    ("--client-ipv4-prefix", "privacy.client_ipv4_prefix", int, "keep only the first N bits of client IPv4"
     " addresses", None),
    ("--client-ipv6-prefix", "privacy.client_ipv6_prefix", int, "keep only the first N bits of client IPv6"
     " addresses", None),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, f"dnsprobe: error: {message}\n")


def add_pipeline_options(parser, config_flags, set_example, progress_what, quiet_what):
    """Options shared by the commands that run a pipeline (read, capture): output, config, overrides."""
    parser.add_argument("-o", "--output", metavar="DIR", help="output directory (config export.directory)")
    parser.add_argument("-c", "--config", metavar="FILE", help="configuration file (default: config/dnsprobe.yml)")
    for flag, key, typ, help_, action in config_flags:
        parser.add_argument(flag, dest=key, type=typ, action=action, metavar=key.split(".")[1].upper(), help=help_)
    parser.add_argument(
        "--anonymize-key", metavar="FILE",
        help="anonymise client addresses with this cryptopANT key file (privacy.anonymize, privacy.key_file)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help=f"set any config key, e.g. --set {set_example} (VALUE is YAML)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="run.progress", action="store_const", const="always",
                       help=f"always show {progress_what}")
    group.add_argument("--no-progress", dest="run.progress", action="store_const", const="never",
                       help=f"never show {progress_what}")
    parser.add_argument("-q", "--quiet", action="store_true", help=f"do not print {quiet_what} at the end")


def build_parser():
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="dnsprobe", description=DESCRIPTION, epilog=EPILOG, formatter_class=fmt)
    parser.add_argument("--version", action="version", version=f"dnsprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    read = sub.add_parser(
        "read",
        help="read capture files and write transactions",
        description="Decode DNS from capture files, match queries with responses, write records.",
        epilog=READ_EPILOG,
        formatter_class=fmt,
    )
    read.add_argument("files", nargs="+", metavar="FILE",
                      help="pcap or pcapng file (.gz, .xz, .zst accepted), or a pipe such as /dev/stdin")
    add_pipeline_options(read, CONFIG_FLAGS, "decode.tcp_idle_timeout=30", "a progress bar", "the statistics table")

    insp = sub.add_parser(
        "inspect",
        help="print records of an output file",
        description="Print the records of dnsprobe Parquet files or of C-DNS files as a table or as JSON lines.",
        epilog=INSPECT_EPILOG,
        formatter_class=fmt,
    )
    insp.add_argument("files", nargs="+", metavar="FILE", help="a .parquet file written by dnsprobe, or a C-DNS file")
    insp.add_argument("--pcap", metavar="OUT", help="rebuild the DNS messages of C-DNS FILEs as the pcap OUT")
    insp.add_argument("--json", action="store_true", help="one JSON object per record")
    insp.add_argument("--limit", type=int, default=20, metavar="N", help="records to print (default 20; 0: all)")
    insp.add_argument("--columns", metavar="A,B,...", help="columns to print (default: a summary set)")
    insp.add_argument("--all-columns", action="store_true", help="print every column")

    from probe.live import add_capture_parser

    add_capture_parser(sub, CONFIG_FLAGS)

    keygen = sub.add_parser(
        "keygen",
        help="create a cryptopANT key file for anonymising client addresses",
        description="Create a new random key file in cryptopANT's format (the format DNS Probe reads), readable\n"
        "by its owner only. The same key file gives the same anonymised addresses in dnsprobe, DNS Probe\n"
        "and cryptopANT's scramble_ips. Use it with --anonymize-key FILE or privacy.key_file.",
        formatter_class=fmt,
    )
    keygen.add_argument("file", metavar="FILE", help="key file to create")
    keygen.add_argument("--algorithm", choices=("aes", "blowfish", "md5", "sha1"), default="aes",
                        help="cryptopANT algorithm for IPv4 and IPv6 (default aes)")
    keygen.add_argument("--force", action="store_true", help="replace FILE if it exists")

    sub.add_parser("bench", add_help=False, help="benchmark suite: pkts/s by worker count against dnscap, netsniff-ng "
                   "(source tree only; dnsprobe bench --help)")

    conf = sub.add_parser(
        "config",
        help="print the effective or default configuration",
        description="Print the configuration that `read` would use, after the file and flags.",
        formatter_class=fmt,
    )
    conf.add_argument("-c", "--config", metavar="FILE", help="configuration file to load")
    conf.add_argument("--defaults", action="store_true", help="print the default config/dnsprobe.yml text")
    return parser


def _overrides(args):
    out = {}
    for _, key, _, _, _ in CONFIG_FLAGS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    if getattr(args, "run.progress", None):
        out["run.progress"] = getattr(args, "run.progress")
    if getattr(args, "output", None):
        out["export.directory"] = args.output
    if getattr(args, "anonymize_key", None):
        out["privacy.anonymize"] = True
        out["privacy.key_file"] = args.anonymize_key
    for item in getattr(args, "set", []):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {key}: value is not valid YAML: {exc}") from None
    return out


def _err(console_file, message):
    print(f"dnsprobe: error: {message}", file=console_file)


def cmd_read(args):
    from rich.console import Console

    from export import check_output_dir, stats_json_path
    from probe.config import load_config
    from probe.pipeline import Pipeline
    from probe.sources.pcapfile import read_capture

    cfg = load_config(args.config, _overrides(args))
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    for f in args.files:
        _need_file(f, "input file ")
    pipeline = Pipeline(cfg, out_dir)
    errors = []
    show = cfg.run.progress == "always" or (cfg.run.progress == "auto" and sys.stderr.isatty())
    progress = _progress(args.files) if show else None
    interrupted = False
    try:
        if progress:
            progress.start()
        for f in args.files:
            size = Path(f).stat().st_size if Path(f).is_file() else None  # a pipe: a bar without an end
            task = progress.add_task(Path(f).name, total=size) if progress else None
            on_progress = (lambda pos, t=task: progress.update(t, completed=pos)) if progress else None
            try:
                for batch in read_capture(f, cfg.run.batch_size, on_progress):
                    pipeline.feed(batch, f)
            except CaptureFileError as exc:
                errors.append(exc)
                _err(sys.stderr, str(exc))
    except KeyboardInterrupt:
        interrupted = True
        _err(sys.stderr, "interrupted; writing what was decoded")
    finally:
        if progress:
            progress.stop()
    stats = pipeline.finish()
    if cfg.run.stats_json:
        stats.write_json(
            stats_json_path(cfg.export, out_dir, pipeline.started),
            {
                "decode_parser": pipeline.decoder.parser,  # decode.parser auto resolved: fast, wire or dpkt
                "inputs": [str(f) for f in args.files],
                "errors": [str(e) for e in errors],
                "files_written": [p.name for p in pipeline.exporter.completed],
            },
        )
    if not args.quiet:
        stats.render_table(Console(file=sys.stdout))
    if interrupted:
        return 130
    return 1 if errors else 0


def _progress(files):
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=__import__("rich.console").console.Console(file=sys.stderr),
    )


def _inspect_files(files, limit):
    """Tables of the records of Parquet and C-DNS files (told apart by content), and the errors of C-DNS
    files that could be read only in part (their blocks before the problem are in the tables)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from export.cdns_reader import file_head, read_table, sniff_cdns

    tables, errors = [], []
    for f in files:
        _need_file(f)
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


def _need_file(f, label=""):
    """A usage error (exit 2) unless f names an existing file."""
    path = Path(f)
    if path.is_dir():
        raise ConfigError(f"{label}{f}: is a directory, not a file")
    if not path.exists():
        raise ConfigError(f"{label}{f}: no such file")


def _inspect_pcap(args):
    from export.cdns_pcap import rebuild_pcap
    from export.cdns_reader import file_head, sniff_cdns

    for f in args.files:
        _need_file(f)
        if not sniff_cdns(file_head(f)):
            raise ConfigError(f"{f}: --pcap rebuilds C-DNS files only, and this is not one")
    packets, messages = rebuild_pcap(args.files, args.pcap)
    print(f"{args.pcap}: {packets} packets, {messages} DNS messages from {len(args.files)} C-DNS file(s)")
    return 0


def cmd_inspect(args):
    import pyarrow as pa

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
        _err(sys.stderr, f"{exc} (the records before it were printed)")
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


def cmd_keygen(args):
    from probe.privacy import new_key, write_key_file

    write_key_file(args.file, new_key(args.algorithm), force=args.force)
    print(f"dnsprobe: wrote a new {args.algorithm} key to {args.file} (mode 0600); keep it secret and keep a copy: "
          "without it the anonymised addresses cannot be matched with new data", file=sys.stderr)
    return 0


def cmd_config(args):
    from probe.config import load_config, options, render_default_yaml

    if args.defaults:
        sys.stdout.write(render_default_yaml())
        return 0
    cfg = load_config(args.config)
    for key, _, _ in options():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        print(f"{key}: {list(value) if isinstance(value, tuple) else value}")
    return 0


def cmd_bench(argv):
    """`dnsprobe bench ARGS`: benchmarks/suite.py's main(ARGS), from the source tree dnsprobe runs from."""
    suite = Path(__file__).resolve().parent.parent / "benchmarks" / "suite.py"
    if not suite.exists():
        _err(sys.stderr, f"dnsprobe bench needs the source tree (no {suite}): run it from a git checkout")
        return 2
    sys.path.insert(0, str(suite.parent))
    import suite as bench_suite

    return bench_suite.main(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the suite's own: not parsed here
        return cmd_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from probe.live import cmd_capture

    handler = {
        "read": cmd_read, "inspect": cmd_inspect, "config": cmd_config, "capture": cmd_capture, "keygen": cmd_keygen,
    }[args.command]
    try:
        return handler(args)
    except (ConfigError, OutputError, DnsprobeError) as exc:
        _err(sys.stderr, str(exc))
        return exc.exit_status
    except BrokenPipeError:
        return 0
