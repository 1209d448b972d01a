"""`dnsprobe top`: the figures of a running `dnsprobe capture` (capture.top), refreshed every second, or one snapshot
as JSON (--json). It reads the capture's Unix socket (probe.run.top): no second capture."""

import sys
import time

from probe.errors import ConfigError
from probe.run.top import WINDOW_S

DEFAULT_SECONDS = 10
SHOWN = 10  # rows of each top list on the screen


def add_parser(sub):
    top = sub.add_parser(
        "top",
        help="live figures of a running capture: rates, RCODE and QTYPE mix, delays, top QNAMEs, domains, clients",
        description="Show what a running `dnsprobe capture` sees, refreshed every second: the last N seconds'\n"
        "packets and transactions per second (capture time), RCODE and QTYPE mix, response-delay percentiles\n"
        "and the most frequent QNAMEs, registered domains and clients (heavy-hitter summaries: each count may\n"
        "over-estimate by its error). The capture serves them on capture.top_socket (default\n"
        "_dnsprobe.top.sock in its output directory). With capture.top on-demand (the default) its workers count\n"
        "from the first request on (which waits up to 3 s for a complete second) until none came for\n"
        "capture.top_idle_seconds.",
    )
    top.add_argument("--socket", metavar="PATH", help="the capture's socket (default: _dnsprobe.top.sock in -o DIR)")
    top.add_argument("-o", "--output", metavar="DIR", default=".", help="the capture's output directory (default .)")
    top.add_argument("-n", "--seconds", type=int, default=DEFAULT_SECONDS, metavar="N",
                     help=f"the last N seconds of capture time (default {DEFAULT_SECONDS}, at most {WINDOW_S})")
    top.add_argument("--json", action="store_true", help="print one snapshot as JSON and exit")


def _path(args):
    from pathlib import Path

    from probe.run.top import SOCKET_NAME

    return Path(args.socket) if args.socket else Path(args.output) / SOCKET_NAME


def _fetch(path, seconds):
    from probe.run.top import fetch

    try:
        snapshot = fetch(path, seconds)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"no running capture serves `dnsprobe top` on {path} ({why}); start one with `dnsprobe"
                          " capture`, or name its socket with --socket") from None
    if "error" in snapshot:  # capture.top false
        raise ConfigError(f"the capture serving {path}: {snapshot['error']}")
    return snapshot


def run(args):
    import json

    if not 1 <= args.seconds <= WINDOW_S:
        raise ConfigError(f"-n must be between 1 and {WINDOW_S}")
    path = _path(args)
    snapshot = _fetch(path, args.seconds)
    if args.json:
        json.dump(snapshot, sys.stdout, indent=1)
        print()
        return 0
    from rich.console import Console
    from rich.live import Live

    console = Console()
    with Live(render(snapshot, path), console=console, screen=False, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(1.0)
                live.update(render(_fetch(path, args.seconds), path), refresh=True)
        except KeyboardInterrupt:
            return 0


def render(s, path):
    """A snapshot as rich renderables: a header line, the mixes and delays, the three top lists."""
    from rich.columns import Columns
    from rich.console import Group
    from rich.table import Table

    newest, since = s["last_second"], s["counting_since"]
    when = time.strftime("%H:%M:%S", time.gmtime(newest)) if newest is not None else "no traffic yet"
    span = f"last {s['seconds']} s to {when} UTC"
    if since is not None and newest is not None and since > newest - s["seconds"] + 1:  # not yet N seconds
        span = f"counting since {time.strftime('%H:%M:%S', time.gmtime(since))}, to {when} UTC"
    elif since is None and newest is None and s["counting"]:
        span = "counting started: no traffic counted yet"
    head = (f"dnsprobe top: {path}  {span} (capture time)  "
            f"{s['packets_per_second']:,.1f} packets/s  {s['transactions_per_second']:,.1f} transactions/s")
    delay = s["delay"]
    delays = "  ".join(f"{k} {v / 1000:,.2f} ms" for k, v in delay.items() if k != "count") or "none"
    mixes = []
    for key, title in (("rcode", "RCODE"), ("qtype", "QTYPE")):
        table = Table(title=title, box=None)
        table.add_column(title)
        table.add_column("share", justify="right")
        total = sum(m["count"] for m in s[key]) or 1
        for m in s[key][:6]:
            table.add_row(m["name"], f"{100 * m['count'] / total:.1f} %")
        mixes.append(table)
    tops = []
    for key, title in (("qnames", "QNAME"), ("registered_domains", "registered domain"), ("clients", "client")):
        table = Table(title=f"top {title}s", box=None)
        table.add_column(title, overflow="fold", max_width=40)
        table.add_column("count", justify="right")
        for entry in s[key][:SHOWN]:
            table.add_row(entry["value"] if entry["value"] != "" else "(a public suffix)", f"{entry['count']:,}")
        tops.append(table)
    return Group(head, f"response delay percentiles: {delays}", Columns(mixes), Columns(tops))
