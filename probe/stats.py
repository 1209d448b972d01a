"""Run statistics: one declarative table of counters, printed at the end and written as JSON.

Every packet, message and transaction that does not reach the output is counted under a named reason,
so `packets` always equals the sum of what happened to them.
"""

import json
import os

# dnstap message types, counted one by one (probe.decode.dnstap_types names them; the tests check the two agree).
DNSTAP_TYPE_COUNTERS = tuple(
    f"{family}_{half}" for family in ("auth", "resolver", "client", "forwarder", "stub", "tool", "update")
    for half in ("query", "response")
)

# (name, meaning). Order is the print order.
COUNTERS = (
    ("kernel_received", "live capture: frames the kernel's filter passed to the capture sockets (drops included)"),
    ("kernel_drops", "live capture: frames the kernel dropped because a capture ring was full"),
    ("kernel_freezes", "live capture: times a capture ring filled up and froze (tp_freeze_q_cnt)"),
    ("join_overlap", "live capture, several workers: frames a worker's socket received between its bind and its"
     " fanout join, set aside (the other workers had them; some may have come in the join's microseconds)"),
    ("dpdk_ipackets", "DPDK capture: frames the port received (rte_eth_stats ipackets)"),
    ("dpdk_imissed", "DPDK capture: frames the port dropped because its RX rings were full (imissed)"),
    ("dpdk_ierrors", "DPDK capture: erroneous frames the port received (ierrors)"),
    ("dpdk_rx_nombuf", "DPDK capture: frames dropped for lack of mbufs in the pool (rx_nombuf; dpdk.mempool_size)"),
    ("dpdk_ring_full", "DPDK capture, several processes: frames the primary could not pass to a worker because that"
     " worker's ring was full"),
    ("packets", "frames read from the source"),
    ("bytes", "bytes of those frames on the wire"),
    ("non_ip", "frames that are neither IPv4 nor IPv6 (ARP, LLDP, ...)"),
    ("non_dns", "IP packets that are not UDP/TCP on a DNS port (other ports, ICMP but the errors below)"),
    ("icmp_unreachable", "ICMP/ICMPv6 destination-unreachable errors (not DNS; compactor's address events; live,"
     " the kernel filter passes only those about DNS)"),
    ("icmp_other_errors", "ICMP/ICMPv6 time-exceeded and ICMPv6 packet-too-big errors (C-DNS address events; live,"
     " only those about DNS)"),
    ("truncated_frames", "frames cut short by the snaplen or damaged below DNS (bad IP/UDP/TCP header)"),
    ("ip_filtered", "IP packets (and dnstap messages) dropped by the filter.* allow/deny lists (live, lists in the"
     " kernel filter: counted by the kernel, not in packets)"),
    ("expression_filtered", "`dnsprobe read`: frames the filter.expression (--filter) rejected, before decoding"
     " (not in packets; live capture drops them in the kernel, uncounted)"),
    ("fragments", "IP fragments received"),
    ("fragments_reassembled", "datagrams rebuilt from fragments"),
    ("fragments_dropped", "fragments discarded (timeout, memory bound, overlap)"),
    ("tcp_segments", "TCP segments on a DNS port"),
    ("tcp_streams", "TCP connection directions seen"),
    ("tcp_retransmitted", "TCP segments already received (dropped as duplicates)"),
    ("tcp_out_of_order", "TCP segments received ahead of a gap and buffered"),
    ("tcp_ooo_dropped", "TCP segments ahead of a gap discarded: the direction held decode.tcp_max_ooo_segments"
     " segments or decode.tcp_max_ooo_bytes bytes"),
    ("tcp_dropped_bytes", "TCP payload bytes discarded (gap never filled, buffer bound, idle timeout)"),
    ("tcp_evicted", "TCP stream directions dropped early for a bound: decode.tcp_max_streams directions or"
     " decode.tcp_max_bytes bytes held (their bytes counted in tcp_dropped_bytes)"),
    ("tcp_resync", "TCP streams first seen mid-message and resynchronised"),
    ("tcp_resets", "TCP segments with RST on a DNS port (C-DNS address events; still decoded as TCP)"),
    ("dnstap_connections", "dnstap: producer connections accepted (capture --dnstap-socket, --dnstap-listen)"),
    ("dnstap_disconnections", "dnstap: producer connections closed, by the producer or after an error below"),
    ("dnstap_refused", "dnstap: connections refused: in the handshake, for a content type other than"
     " protobuf:dnstap.Dnstap (also counted as connected and disconnected), or at once, dnstap.max_connections"
     " being reached"),
    ("dnstap_frame_errors", "dnstap: streams (connections, files) ended by a Frame Streams error (impossible"
     " frame length, malformed control frame, data before START)"),
    ("dnstap_truncated", "dnstap: streams that ended inside a frame (the part received is dropped)"),
    ("dnstap_bytes", "dnstap: bytes received from producers or read from files, control frames included"),
    ("dnstap_frames", "dnstap: data frames received (each should hold one dnstap message)"),
    ("dnstap_decode_errors", "dnstap: data frames that are not a protobuf dnstap message (the connection is"
     " closed; in a file, an error naming it)"),
    ("dnstap_frames_discarded", "dnstap: data frames that came after one that did not decode, dropped with it"),
    ("dnstap_not_message", "dnstap: frames that hold no message (Dnstap.type is not MESSAGE)"),
    ("dnstap_unknown_type", "dnstap: messages of a type this version does not know"),
    *((f"dnstap_{t}", f"dnstap: {t.upper()} messages received") for t in DNSTAP_TYPE_COUNTERS),
    ("dnstap_filtered", "dnstap: messages of the types not selected (dnstap.message_types)"),
    ("dnstap_no_time", "dnstap: messages without their time (a query's query_time, a response's response_time),"
     " dropped"),
    ("dnstap_no_dns", "dnstap: messages without their DNS message (query_message, response_message), dropped"),
    ("dnstap_bad_address", "dnstap: messages whose addresses or ports do not fit their socket family, dropped"),
    ("dnstap_embedded_queries", "dnstap: queries carried inside response messages besides their own (Knot's"
     " responses-with-queries)"),
    ("dnstap_embedded_used", "dnstap: of those, the ones that became a transaction's query because the query"
     " itself was not logged (a transaction counts once)"),
    ("dns_messages", "DNS messages decoded"),
    ("queries", "DNS queries (QR=0)"),
    ("responses", "DNS responses (QR=1)"),
    ("malformed", "DNS messages that could not be fully parsed (kept as rows, malformed=true)"),
    ("dpkt_fallback", "messages dpkt could not parse, decoded by the wire walker (parser=dpkt)"),
    ("matched", "transactions with both query and response"),
    ("query_only", "queries without a response (timed out or input ended)"),
    ("response_only", "responses without a query"),
    ("duplicate_queries", "queries identical (same key) to a pending one; both are kept"),
    ("zone_transfer_messages", "AXFR/IXFR response messages merged into one transaction"),
    ("lengths_capped", "summed lengths or counts (TCP segments, fragments, zone transfers) over 2^31-1, stored"
     " as 2^31-1, the maximum of their int32 columns"),
    ("match_evicted", "pending queries exported early because the table reached its size bound (match.max_pending,"
     " or match.max_pending_per_key under one key)"),
    ("answers_capped", "export.answers: records of the answers column whose text was capped (docs/parquet.md):"
     " RDATA written in RFC 3597's form for its text's length, or owner name and data left empty past the"
     " message's cap"),
    ("transfers_evicted", "open zone transfers closed early, exported as they stood, because match.max_transfers"
     " were open"),
    ("records", "records (rows) written"),
    ("files", "output files completed"),
    ("on_close_commands", "export.on_close commands run for finished files that have ended (failed ones"
     " included)"),
    ("on_close_failed", "of those, the ones that failed: an exit status other than 0, a signal, export.on_close_timeout"
     " reached, or no start (each logged with its stderr's end; the file is kept)"),
    ("worker_restarts", "live capture: workers that died and were restarted (what their files hold is recovered)"),
    ("lost_in_dead_worker", "live capture: transactions a worker that died had completed but not yet put in its"
     " file, and queries it held waiting for a response, as of its last report (once a second); nonzero: exit"
     " status 1"),
    ("capture_interruptions", "live capture: capture socket errors (interface down or removed): the worker"
     " closed its files and waited for the interface"),
)

COUNTER_NAMES = tuple(name for name, _ in COUNTERS)
# Counters of the run's own process (live capture: the supervisor's), not of a worker.
RUN_COUNTERS = ("on_close_commands", "on_close_failed")
# The counters of one capture socket (AfPacketSource.counters), per worker and interface.
SOCKET_COUNTERS = ("kernel_received", "kernel_drops", "kernel_freezes", "join_overlap")

# The sources a counter belongs to; one not listed applies to every run. The table printed at the end of a run
# shows the counters of its source only (no kernel rows for a file, no DPDK rows for AF_PACKET).
SOURCES = ("file", "af_packet", "dpdk")
_LIVE = ("af_packet", "dpdk")
ONLY = {
    "kernel_received": ("af_packet",),
    "kernel_drops": ("af_packet",),
    "kernel_freezes": ("af_packet",),
    "join_overlap": ("af_packet",),
    "dpdk_ipackets": ("dpdk",),
    "dpdk_imissed": ("dpdk",),
    "dpdk_ierrors": ("dpdk",),
    "dpdk_rx_nombuf": ("dpdk",),
    "dpdk_ring_full": ("dpdk",),
    "worker_restarts": _LIVE,
    "lost_in_dead_worker": _LIVE,
    "capture_interruptions": ("af_packet",),
    "expression_filtered": ("file",),
}


def applicable(source):
    """The counter names that apply to a run reading from `source` (one of SOURCES), in print order."""
    return tuple(name for name in COUNTER_NAMES if source in ONLY.get(name, SOURCES))


class Stats:
    """Mutable counters; the hot path adds per batch, not per packet."""

    def __init__(self):
        for name in COUNTER_NAMES:
            setattr(self, name, 0)
        self.files_written = []  # names of the files completed, for the end of an offline run (not a counter)

    def add(self, other):
        for name in COUNTER_NAMES:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self):
        return {name: getattr(self, name) for name in COUNTER_NAMES}

    def write_json(self, path, extra=None):
        doc = {"counters": self.as_dict()}
        if extra:
            doc.update(extra)
        tmp = f"{path}.part"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)

    def render_table(self, console, source="file"):
        """The counters that apply to the run's source, with their values (meanings: docs/statistics.md). The title
        is narrower than the table: it is printed whole, on one line."""
        from rich.table import Table

        table = Table(title="dnsprobe statistics", show_lines=False)
        table.add_column("counter")
        table.add_column("value", justify="right")
        # A run without dnstap input does not list the dnstap counters (all zero).
        dnstap = any(getattr(self, name) for name in COUNTER_NAMES if name.startswith("dnstap_"))
        for name in applicable(source):
            if dnstap or not name.startswith("dnstap_"):
                table.add_row(name, f"{getattr(self, name):,}")
        console.print(table)
