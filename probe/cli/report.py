"""`dnsprobe report`: one self-contained HTML page of plots and tables of what a set of Parquet or C-DNS files
holds (probe.cli.aggregate's figures, those of `inspect --summary`; drawn by probe.cli.report_html).

--from/--to and --server choose the partitions of a hive data set (year=/month=/day=[/hour=]/server= directories)
before any file is opened; --from/--to also keep only the records of their time span, so that a flat data set is
cut the same way.
"""

import datetime
import re
from pathlib import Path

from probe.errors import ConfigError

REPORT_EPILOG = """\
examples:
  dnsprobe report out/ -o report.html                    # every file of a directory (hive partitions too)
  dnsprobe report out/*.parquet capture.cdns.xz -o report.html --limit 20
  dnsprobe report hive/ --from 2024-05-01 --to 2024-05-02 --server probe1 -o day.html

--from and --to are UTC: a date (2024-05-01) or a date and time (2024-05-01T12:30, 2024-05-01T12:30:05Z);
--from is the first instant kept, --to the first one left out.
"""
REPORT_TOP = 20  # bars of each top list unless --limit says otherwise
# The partition directories of the hive layout that bound a time span: the unit each adds to its parent's.
TIME_PARTITIONS = ("year", "month", "day", "hour")
PARTITION = re.compile(r"^(year|month|day|hour|server)=(.*)$")


def add_parser(sub):
    rep = sub.add_parser(
        "report",
        help="write an HTML report of output files: plots and tables",
        description="Write one self-contained HTML file (plots as inline SVG, nothing loaded from the network) of "
                    "what dnsprobe Parquet or C-DNS files hold: rate by RCODE over time, unanswered queries, response "
                    "delays by transport, QTYPE mix, top QNAMEs, registered domains and clients, transports, EDNS, "
                    "TC, and the files' metadata.",
        epilog=REPORT_EPILOG,
    )
    rep.add_argument("files", nargs="+", metavar="PATH",
                     help="a .parquet file written by dnsprobe, a C-DNS file, or a directory (every file in it and "
                          "below: flat or hive)")
    rep.add_argument("-o", "--output", metavar="FILE", required=True, help="the HTML file to write")
    rep.add_argument("--limit", type=int, metavar="N", default=REPORT_TOP,
                     help=f"bars of each top list (QNAMEs, registered domains, clients; default {REPORT_TOP})")
    rep.add_argument("--from", dest="from_", metavar="TIME", type=_utc_us,
                     help="only records at or after TIME (UTC; hive: only the partitions that reach it)")
    rep.add_argument("--to", metavar="TIME", type=_utc_us,
                     help="only records before TIME (UTC; hive: only the partitions that start before it)")
    rep.add_argument("--server", action="append", metavar="NAME",
                     help="only the hive partitions server=NAME (repeatable)")


def _utc_us(text):
    """argparse type of --from/--to: µs since the epoch of an ISO 8601 date or date and time, UTC."""
    import argparse

    try:
        t = datetime.datetime.fromisoformat(text.removesuffix("Z").removesuffix("z"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (2024-05-01) nor a date and time "
                                         "(2024-05-01T12:30:05) in UTC") from None
    if t.tzinfo is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: times are UTC, without an offset")
    return int(t.replace(tzinfo=datetime.timezone.utc).timestamp()) * 1_000_000 + t.microsecond


def partitions(path):
    """The hive partitions of a file's path ({key: value} of its year=, month=, day=, hour=, server= parts)."""
    return dict(m.groups() for part in Path(path).parent.parts if (m := PARTITION.match(part)))


def partition_span(parts):
    """(first µs, end µs) of the time a file's year=/month=/day=/hour= partitions cover, or None if it has none."""
    values = [int(parts[k]) for k in TIME_PARTITIONS if k in parts]
    if not values:
        return None
    year, month, day, hour = values + [1, 1, 0][len(values) - 1:]
    start = datetime.datetime(year, month, day, hour, tzinfo=datetime.timezone.utc)
    if len(values) == 1:
        end = start.replace(year=year + 1)
    elif len(values) == 2:
        end = (start + datetime.timedelta(days=31)).replace(day=1)
    else:
        end = start + (datetime.timedelta(days=1) if len(values) == 3 else datetime.timedelta(hours=1))
    return int(start.timestamp()) * 1_000_000, int(end.timestamp()) * 1_000_000


def chosen(paths, first, end, servers):
    """The files whose partitions meet the filters (first/end: µs or None; servers: names or None); a file
    outside any partition is kept by --from/--to (its records are cut) but not by --server."""
    from probe.cli.flags import did_you_mean

    kept, seen = [], set()
    for path in paths:
        parts = partitions(path)
        seen.add(parts.get("server"))
        if servers and parts.get("server") not in servers:
            continue
        span = partition_span(parts)
        if span and ((first is not None and span[1] <= first) or (end is not None and span[0] >= end)):
            continue
        kept.append(path)
    named = sorted(s for s in seen if s is not None)
    if servers and not named:
        raise ConfigError("--server chooses hive partitions (server=NAME directories), and there are none")
    missing = [s for s in servers or () if s not in named]
    if missing:
        raise ConfigError(f"no partition server={missing[0]}{did_you_mean(missing[0], named)}; the servers there: "
                          f"{', '.join(named)}")
    if not kept:
        raise ConfigError("no partition of the data set is in the time span of --from/--to")
    return kept


def run(args):
    from probe.cli.aggregate import files_meta, report_of, tally_of
    from probe.cli.inspect import _expand
    from probe.cli.output import error, read_in_part

    if args.limit < 0:
        raise ConfigError("--limit must be 0 or more")
    if args.from_ is not None and args.to is not None and args.from_ >= args.to:
        raise ConfigError("--from must be before --to")
    paths = chosen(_expand(args.files), args.from_, args.to, args.server)
    time_range = None
    if args.from_ is not None or args.to is not None:
        time_range = (args.from_ if args.from_ is not None else 0, args.to if args.to is not None else 1 << 62)
    tally, errors = tally_of(paths, report=True, time_range=time_range)
    report = report_of(tally, len(paths), args.limit)
    meta = files_meta(paths)
    from probe.cli.report_html import page

    what = f"{report['records']:,} records of {len(paths):,} file{'s' * (len(paths) != 1)}: " + " ".join(
        map(str, args.files))
    try:
        Path(args.output).write_text(page(report, meta, what), encoding="utf-8")
    except OSError as exc:
        error(f"{args.output}: cannot write the report: {exc.strerror}")
        return 1
    print(f"{args.output}: {what}")
    return read_in_part(errors)
