"""dnstap decoder: a DnstapBatch in, DNS message tuples out (probe.model), as the packet decoder gives them.

Each data frame is a protobuf Dnstap message (dnstap_schema). Its message becomes one message tuple:
- which: the types selected by dnstap.message_types (dnstap_types); a query type gives a query, a response
  type a response, walked from query_message or response_message by the same DNS walker as packets;
- time: query_time for a query type, response_time for a response type (the server's clock, never ours);
- ends: query_address/query_port is the client (the initiator) in both halves, response_address/port the
  server, so a query goes client → server and a response server → client, as packets do; the IP version
  from socket_family, else from the address length;
- transport: socket_protocol, numbered as probe.model TRANSPORTS; the IP protocol follows from it (DoH over
  HTTP/3 is UDP); none when the producer does not say;
- origin: the message family and the producer's identity (dnstap_type, server_identity columns); scope (the
  matching key's first part): transport, family and identity, or the producer (connection, file) when
  there is no identity, so that two servers' or two families' messages never pair;
- a response that also carries its query (query_message) gives a QueryCopy before it (probe.model).
Frames, lengths, TTL, UDP checksum, VLAN and TCP handshake RTT are not in dnstap: None.

Whatever is dropped is counted (probe.stats, dnstap_*). A frame that does not decode as protobuf ends
its producer's run: the rest is dropped, and batch.refused tells the source to close that producer.
decode gives message tuples (the Python pipeline, the reference); decode_into appends the same messages to a
probe._records.MsgBatch as message records (the columnar pipeline): with decode.parser fast (auto, when built)
the loop over a producer's frames runs in C (probe/decode/_dnstap.c), which writes the records and hands back to
this Python code, the reference it must equal, the frame protobuf refuses (its messages join the batch as
tuples, MsgBatch.extend, in order).
"""

from probe.decode.dnstap_types import MESSAGE_TYPES, TYPE_COUNTERS
from probe.decode.parsers import make_parser, resolve
from probe.model import TRANSPORTS, M, QueryCopy
from probe.native import load, say_not_built

_dnstap = load("probe.decode._dnstap")

NS = 1_000_000_000
TS_MAX = (1 << 63) - 1  # later times do not fit int64 nanoseconds
FAMILY_IPV = {1: 4, 2: 6}  # SocketFamily INET, INET6
ADDRESS_IPV = {4: 4, 16: 6}
TRANSPORT_DOH = 4
HTTP3 = 3
PROTO_UDP = 17
_FLAGS, _MALFORMED = M.FLAGS, M.MALFORMED
SCOPE_CACHE_MAX = 10_000
# Counters kept per batch in a list, added to Stats once per batch.
COUNTS = ("dnstap_frames", "dnstap_decode_errors", "dnstap_frames_discarded", "dnstap_not_message",
          "dnstap_unknown_type", "dnstap_filtered", "dnstap_no_time", "dnstap_no_dns", "dnstap_bad_address",
          "dnstap_embedded_queries", "ip_filtered", "dns_messages", "queries", "responses", "malformed")
(FRAMES, DECODE_ERRORS, DISCARDED, NOT_MESSAGE, UNKNOWN_TYPE, FILTERED, NO_TIME, NO_DNS, BAD_ADDRESS, EMBEDDED,
 IP_FILTERED, MESSAGES, QUERIES, RESPONSES, MALFORMED) = range(len(COUNTS))


class DnstapDecoder:
    """Stateless but for caches and now_ns: each frame is decoded on its own."""

    def __init__(self, dnstap_cfg, decode_cfg, stats, ip_filter=None, keep_raw=True, python=False):
        """ip_filter: the filter.* allow/deny lists (probe.decode.ipfilter.IpFilter), applied to the client and
        server addresses as to packets' (a message without addresses is kept); python: always the Python loop
        (the reference the tests compare the C loop with)."""
        self.stats = stats
        self.keep = {4: ip_filter.keep4, 6: ip_filter.keep6} if ip_filter else {}
        self.parser = resolve(decode_cfg.parser)
        parser = make_parser(self.parser, stats, keep_raw)
        self.parse = parser.parse
        selected = set(dnstap_cfg.message_types)
        # indexed by type number: (selected, family, response); 0 is no type
        self.types = (None,) + tuple(
            (name in selected, family, response) for _, (name, family, response) in sorted(MESSAGE_TYPES.items())
        )
        self.type_counts = [0] * len(self.types)
        self.now_ns = 0
        self.address_events = {}  # none from dnstap (the C-DNS exporter asks every decoder)
        self._scopes = {}
        self._c = None
        if self.parser == "fast" and not python:
            if _dnstap is None:
                say_not_built("probe.decode._dnstap")
            else:
                keep4, keep6 = self.keep.get(4), self.keep.get(6)
                # the arguments of _dnstap.decode after (spans, producer, out, counts, type_counts)
                self._c_args = (self.types, keep4, keep6, keep_raw)
                self._c = _dnstap.decode

    def decode(self, batch, source_name="input"):
        """The messages of the batch as message tuples (the Python loop: the reference)."""
        out = []
        counts = [0] * len(COUNTS)
        for producer, frames in _runs_taken(batch, counts):
            problem = self._run(producer, frames, out, counts)
            if problem is not None:
                batch.refused[producer] = problem
        self._add_counts(counts)
        return out

    def decode_into(self, batch, out, source_name="input"):
        """The same messages appended to out, a probe._records.MsgBatch, as message records."""
        counts = [0] * len(COUNTS)
        for producer, frames in _runs_taken(batch, counts):
            if self._c is not None:
                stop, max_ts = self._c(frames.spans, producer, out, counts, self.type_counts, *self._c_args)
                if max_ts > self.now_ns:
                    self.now_ns = max_ts
                if stop < 0:
                    continue
                frames = list(frames)[stop:]  # a frame protobuf refuses: the Python loop says why
            msgs = []
            problem = self._run(producer, frames, msgs, counts)
            out.extend(msgs)
            if problem is not None:
                batch.refused[producer] = problem
        self._add_counts(counts)

    def _add_counts(self, counts):
        type_counts = self.type_counts
        stats = self.stats
        for name, value in zip(COUNTS, counts):
            if value:
                setattr(stats, name, getattr(stats, name) + value)
        for number, value in enumerate(type_counts):
            if value:
                name = TYPE_COUNTERS[number]
                setattr(stats, name, getattr(stats, name) + value)
                type_counts[number] = 0

    def flush(self):
        """End of input: nothing is held between frames."""

    def _run(self, producer, frames, out, counts):
        """The frames of one producer; returns why the producer is refused (a frame that does not decode)."""
        # protobuf's runtime and the schema (about 15 ms of CPU at start-up) are loaded only when this
        # loop runs: the reference, or a frame the C loop refused
        from google.protobuf.message import DecodeError

        from probe.decode.dnstap_schema import Dnstap

        parse_pb = Dnstap.FromString
        message = self._message
        counts[FRAMES] += len(frames)
        for i, frame in enumerate(frames):
            try:
                d = parse_pb(frame)
            except DecodeError as exc:
                counts[DECODE_ERRORS] += 1
                counts[DISCARDED] += len(frames) - i - 1
                return f"a data frame of {len(frame)} bytes is not a protobuf dnstap message ({exc})"
            if not d.HasField("type") or not d.HasField("message"):
                counts[NOT_MESSAGE] += 1
                continue
            message(d, producer, out, counts)
        return None

    def _message(self, d, producer, out, counts):
        m = d.message
        has = m.HasField
        if not has("type"):  # absent, or a value outside the enum (upb keeps those as unknown fields)
            counts[UNKNOWN_TYPE] += 1
            return
        number = m.type
        self.type_counts[number] += 1
        selected, family, response = self.types[number]
        if not selected:
            counts[FILTERED] += 1
            return
        prefix = "response" if response else "query"
        ts = _time(m, prefix)
        if ts is None:
            counts[NO_TIME] += 1
            return
        if not has(prefix + "_message"):
            counts[NO_DNS] += 1
            return
        ends = _ends(m)
        if ends is None:
            counts[BAD_ADDRESS] += 1
            return
        ipv, qa, qp, ra, rp = ends
        keep = self.keep.get(ipv)
        if keep is not None and qa is not None and ra is not None and not keep(qa, ra):
            counts[IP_FILTERED] += 1
            return
        transport = m.socket_protocol if has("socket_protocol") else None
        proto = None
        if transport is not None:
            proto = TRANSPORTS[transport][1]
            if transport == TRANSPORT_DOH and has("http_protocol") and m.http_protocol == HTTP3:
                proto = PROTO_UDP
        identity = d.identity or None
        key = (identity, family, transport, None if identity else producer)
        scope_origin = self._scopes.get(key)
        if scope_origin is None:
            if len(self._scopes) >= SCOPE_CACHE_MAX:
                self._scopes.clear()
            text = identity.decode("utf-8", "replace") if identity else None
            scope_origin = self._scopes[key] = ((transport, family, text if identity else producer), (family, text))
        scope, origin = scope_origin
        if ts > self.now_ns:
            self.now_ns = ts
        if response:
            if has("query_message"):
                counts[EMBEDDED] += 1
                qts = _time(m, "query")
                qnet = (qts if qts is not None else ts, None, ipv, proto, qa, qp, ra, rp, None, None, None, None,
                        transport, scope, origin)
                out.append(QueryCopy(qnet + self.parse(m.query_message)))
            msg = (ts, None, ipv, proto, ra, rp, qa, qp, None, None, None, None, transport, scope, origin) + self.parse(
                m.response_message
            )
        else:
            msg = (ts, None, ipv, proto, qa, qp, ra, rp, None, None, None, None, transport, scope, origin) + self.parse(
                m.query_message
            )
        out.append(msg)
        counts[MESSAGES] += 1
        flags = msg[_FLAGS]
        if flags is not None and flags & 0x8000:
            counts[RESPONSES] += 1
        else:
            counts[QUERIES] += 1
        if msg[_MALFORMED]:
            counts[MALFORMED] += 1


def _runs_taken(batch, counts):
    """The (producer, frames) runs of the batch, but for those of a producer refused in it by then (an earlier run
    of it): their frames are counted as discarded."""
    for producer, frames in batch.runs:
        if producer in batch.refused:
            counts[DISCARDED] += len(frames)
        else:
            yield producer, frames


def _time(m, prefix):
    """The message's query or response time in ns, or None when it has none (or one out of range)."""
    if not m.HasField(prefix + "_time_sec"):
        return None
    sec, nsec = getattr(m, prefix + "_time_sec"), getattr(m, prefix + "_time_nsec")
    ts = sec * NS + nsec
    return ts if nsec < NS and ts <= TS_MAX else None


def _ends(m):
    """(ip version, client address, client port, server address, server port), None where absent; None for
    all when an address does not fit the family (or the other address) or a port is beyond 65535."""
    qa, ra = m.query_address or None, m.response_address or None
    qp, rp = m.query_port or None, m.response_port or None
    if m.HasField("socket_family"):
        ipv = FAMILY_IPV[m.socket_family]
    else:
        a = qa or ra
        ipv = ADDRESS_IPV.get(len(a)) if a is not None else None
        if a is not None and ipv is None:
            return None
    want = 4 if ipv == 4 else 16
    if (qa is not None and len(qa) != want) or (ra is not None and len(ra) != want):
        return None
    if (qp is not None and qp > 65535) or (rp is not None and rp > 65535):
        return None
    return ipv, qa, qp, ra, rp
