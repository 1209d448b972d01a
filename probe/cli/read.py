"""`dnsprobe read`: capture files (pcap, pcapng, dnstap) → transactions → Parquet or C-DNS files, and a statistics
table."""

import sys
import time
from pathlib import Path

from probe.cli.flags import CONFIG_FLAGS, add_pipeline_options, overrides
from probe.cli.output import end_of_run, need_file, show_progress
from probe.config import load_config
from probe.run.checks import check_config
from probe.run.offline import read_files
from probe.timeline import mark

READ_EPILOG = """\
Reads pcap and pcapng files, plain or compressed with gzip, xz or zstd (recognised by content),
with Ethernet (802.1Q/802.1ad tags), Linux cooked SLL/SLL2 or raw IPv4/IPv6 link layers, and dnstap
files (Frame Streams, as fstrm_capture or a server's file sink write them; the message types of
dnstap.message_types, default AUTH_* and CLIENT_*). Packets and dnstap may be mixed: they never pair
with each other, and the dnstap_type column tells their rows apart. Files are
read in the order given, as one continuous capture: a query in one file can match a response in
the next. Records are written as NAME.parquet.part (C-DNS: NAME.cdns[.gz|.xz|.zst].part) and renamed
when complete; NAME comes from the capture time of the file's first record and the worker, so the same
input read again meets its names: refused (exit 2), or replaced with --overwrite. The statistics go to
_PREFIX<start>.stats.json beside them (a name engines reading the directory skip).
A pipe (- for stdin) is decoded as it arrives, and SIGINT or SIGTERM writes everything read (exit 130).

examples:
  dnsprobe read capture.pcap.xz -o out/
  dnsprobe read capture.pcap.xz -o out/ --format cdns --cdns-compression xz
  dnsprobe read day1.pcap day2.pcap -o out/ --query-timeout 2 --compression snappy
  dnsprobe read capture.pcapng -o out/ --set export.rotate_records=1000000
  xzcat day.pcap.xz | dnsprobe read - -o out/            # - is stdin
  tcpdump -i eth0 -U -w - port 53 | dnsprobe read - -o out/ --set export.rotate_seconds=60
  dnsprobe read knot.dnstap resolver.dnstap.zst -o out/ --set 'dnstap.message_types=[CLIENT_QUERY,CLIENT_RESPONSE]'
  dnsprobe read day.pcap -o out/ --workers 2          # two processes, each its share of the flows
  dnsprobe read day.pcap -o out/ --filter 'not net 10.0.0.0/8'   # a BPF filter expression (libpcap)
  dnsprobe read day.pcap -o out/ --coremask 0x3       # the same, pinned to cores 0 and 1
"""

# Flags of read only: parallel reading.
READ_FLAGS = (
    (("--workers",), "run.workers", int, "worker processes, each reading its share of the flows (default 1)"),
    (("--coremask",), "run.coremask", str, "hex mask of the cores to run one read worker on each, e.g. 0x3"),
)
# Switches of read only (set the key to true).
READ_SWITCHES = (
    (("--overwrite",), "export.overwrite", "replace output files whose names exist (the same input read again);"
     " without it such a name is refused (exit 2)"),
)


STDIN = "/dev/stdin"  # what the input - reads (and how the statistics name it)


def add_parser(sub):
    read = sub.add_parser(
        "read",
        help="read capture files and write transactions",
        description="Decode DNS from capture files, match queries with responses, write records.",
        epilog=READ_EPILOG,
    )
    read.add_argument("files", nargs="+", metavar="FILE",
                      help="pcap, pcapng or dnstap file (.gz, .xz, .zst accepted), or a pipe: - (stdin), a FIFO")
    add_pipeline_options(read, CONFIG_FLAGS, "decode.tcp_idle_timeout=30", "a progress bar",
                         "the statistics, the rate and the files written")
    for flags, key, typ, help_ in READ_FLAGS:
        read.add_argument(*flags, dest=key, type=typ, metavar=key.split(".")[1].upper(), help=help_)
    for flags, key, help_ in READ_SWITCHES:
        read.add_argument(*flags, dest=key, action="store_const", const=True, help=help_)


def run(args):
    cfg = load_config(args.config, overrides(args, READ_FLAGS + READ_SWITCHES))
    check_config(cfg, "read")
    mark("configuration read")
    args.files = [STDIN if f == "-" else f for f in args.files]
    for f in args.files:
        need_file(f, "input file ")
    bar = ProgressBar() if show_progress(cfg, args) else None
    began = time.monotonic()
    try:
        stats, errors, interrupted = read_files(cfg, args.files, bar)
    finally:
        if bar:
            bar.close()
    seconds = time.monotonic() - began
    messages = [str(exc) for exc in errors] + (["interrupted; writing what was decoded"] if interrupted else [])
    files = (cfg.export.directory, stats.files_written, stats.files, cfg.export.layout != "hive")
    end_of_run(stats, "file", files, messages, seconds, args.quiet)
    if interrupted:
        return 130
    return 1 if errors else 0


class ProgressBar:
    """A bar per input on stderr, shown from the first input on, by the process that reads it (with several read
    workers, worker 0, a forked process: the bar starts there, not before the fork)."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        self.bars = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
            console=Console(file=sys.stderr),
        )

    def __call__(self, path, size):
        self.bars.start()  # (once: a started display ignores it)
        task = self.bars.add_task(Path(path).name, total=size)
        return lambda pos: self.bars.update(task, completed=pos)

    def close(self):
        self.bars.stop()  # (nothing when it was not started here)
