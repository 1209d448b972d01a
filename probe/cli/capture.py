"""`dnsprobe capture`: live capture from network interfaces (AF_PACKET) or a DPDK port, and dnstap from servers."""

import sys

from probe.cli.flags import CONFIG_FLAGS, add_pipeline_options, overrides
from probe.cli.output import show_progress
from probe.config import load_config

CAPTURE_EPILOG = """\
Captures on one or more interfaces with one worker process per core of the coremask. Each worker
reads every interface through its own AF_PACKET TPACKET_V3 ring, in a fanout group that sends both
directions of a flow to the same worker; a kernel filter keeps only DNS (and IP fragments). Each
worker writes its own files (NAME.w<worker>.parquet; while open a journal, NAME.parquet.journal, that
`dnsprobe inspect` reads). Every completed transaction is in a readable file within export.flush_seconds.
Files rotate on the wall clock every export.rotate_seconds for all workers together, after
export.rotate_records records, and on SIGHUP. SIGINT or SIGTERM stops: pending transactions are written,
files closed, a one-line summary printed. A worker that dies is restarted (logged; counted as
worker_restarts); what it had put in its file is kept, what it had not is counted as lost_in_dead_worker.
An interface that does not exist at start is exit status 2, naming the interfaces there are, unless
--wait-for-interface (capture.wait_for_interface); one that is down at start, or goes down or away later,
is waited for, with a line every minute while it is. Statistics: a JSON file in the
output directory (at start, every capture.stats_interval seconds, at exit), a Prometheus endpoint
(capture.prometheus_port), and a status line when stderr is a terminal.

dnstap: --dnstap-socket PATH (Unix) and --dnstap-listen HOST:PORT (TCP) take DNS servers' dnstap
(Frame Streams, bidirectional handshake, many producers at once), alone or beside interfaces; the
workers share the producers' connections and write their messages into the same files (column
dnstap_type; counters dnstap_*). Message types: dnstap.message_types (default AUTH_* and CLIENT_*).

Needs root or CAP_NET_RAW for interfaces (for a Python program, as an ambient capability:
AmbientCapabilities= under systemd); --user NAME makes the workers switch to NAME once their sockets are
open.

exit status: 0 stopped cleanly by SIGINT/SIGTERM; 1 data was lost (a worker died), or a worker failed
while stopping; 2 usage or configuration error (bad coremask, no such interface, no permission, fanout group
in use, ...).

examples:
  dnsprobe capture -i eth0 -o /var/lib/dnsprobe
  dnsprobe capture -i eth0 -i eth1 --coremask 0x3 -o out/ --prometheus-port 9153
  dnsprobe capture -c /etc/dnsprobe/resolver.yml --user dnsprobe
  dnsprobe capture --dnstap-socket /run/dnsprobe/dnstap.sock --dnstap-socket-group knot -o out/
  dnsprobe capture -i eth0 --dnstap-socket /run/dnsprobe/dnstap.sock -o out/
"""

CAPTURE_FLAGS = (
    # (flags, key, type, help); type None: a switch
    (("-i", "--interface"), "capture.interfaces", str, "interface to capture on (repeatable)"),
    (("--coremask",), "capture.coremask", str, "hex mask of the cores to run workers on, e.g. 0x3"),
    (("--promiscuous",), "capture.promiscuous", None, "put the interfaces in promiscuous mode"),
    (("--wait-for-interface",), "capture.wait_for_interface", None, "wait for an interface that does not exist yet"
     " (without: exit status 2 naming the interfaces there are)"),
    (("--user",), "capture.user", str, "user the workers switch to after opening their sockets"),
    (("--block-size",), "capture.block_size", int, "bytes per ring block"),
    (("--block-count",), "capture.block_count", int, "blocks per ring"),
    (("--block-timeout",), "capture.block_timeout_ms", int, "ms before a partly filled block is handed over"),
    (("--stats-interval",), "capture.stats_interval", float, "seconds between statistics JSON writes"),
    (("--prometheus-port",), "capture.prometheus_port", int, "local port of the Prometheus endpoint (0: off)"),
    (("--dnstap-socket",), "dnstap.socket", str, "listen on this Unix socket for dnstap producers (servers)"),
    (("--dnstap-listen",), "dnstap.listen", str, "listen on HOST:PORT (TCP) for dnstap producers"),
    (("--dnstap-socket-owner",), "dnstap.socket_owner", str, "owner (user) of the dnstap Unix socket"),
    (("--dnstap-socket-group",), "dnstap.socket_group", str, "group of the dnstap Unix socket"),
    (("--dnstap-socket-mode",), "dnstap.socket_mode", str, "mode of the dnstap Unix socket, octal (default 0660)"),
    (("--dpdk",), "dpdk.enabled", None, "capture with DPDK instead of AF_PACKET (docs/dpdk.md)"),
    (("--dpdk-args",), "dpdk.args", str, "EAL arguments, e.g. --dpdk-args='--no-huge --vdev=net_pcap0,rx_pcap=F'"),
    (("--dpdk-port",), "dpdk.port", int, "DPDK port to capture on"),
)


def add_parser(sub):
    cap = sub.add_parser(
        "capture",
        help="capture live traffic from network interfaces and dnstap sockets",
        description="Capture DNS from network interfaces and servers' dnstap, match queries with responses, write"
        " records.",
        epilog=CAPTURE_EPILOG,
    )
    add_capture_flags(cap)
    add_pipeline_options(cap, CONFIG_FLAGS, "capture.block_count=64", "the status line", "the statistics table")
    return cap


def add_capture_flags(parser):
    """The flags of CAPTURE_FLAGS (also taken by `dnsprobe config`)."""
    for flags, key, typ, help_ in CAPTURE_FLAGS:
        if typ is None:
            parser.add_argument(*flags, dest=key, action="store_const", const=True, help=help_)
        elif key == "capture.interfaces":
            parser.add_argument(*flags, dest=key, action="append", metavar="IFACE", help=help_)
        else:
            parser.add_argument(*flags, dest=key, type=typ, metavar=key.split(".")[1].upper(), help=help_)


def run(args):
    from probe.run.capture import capture  # (here: `read` and the other commands do not load the live code)

    cfg = load_config(args.config, overrides(args, CAPTURE_FLAGS))
    status, supervisor = capture(cfg, show_status=show_progress(cfg))
    if not args.quiet:
        from rich.console import Console

        supervisor.totals().render_table(Console(file=sys.stdout), "dpdk" if cfg.dpdk.enabled else "af_packet")
    return status
