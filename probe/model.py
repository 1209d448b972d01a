"""The data passed between the pipeline's stages (capture → decode → match → export).

- FrameBatch: what a packet source yields, frames of one link type in columns; DnstapBatch: what a dnstap
  source yields, Frame Streams data frames by producer.
- A DNS message: one flat tuple laid out by MESSAGE_FIELDS, the network part (NET_FIELDS, filled by the
  packet or the dnstap decoder) then the DNS part (DNS_FIELDS, filled by the wire walker or by dpkt). Tuples, not
  objects, because a batch of them transposes into columns with one pass in C; M and E name the indexes.
- A transaction: what matching makes of messages, the triple (query, response, response_messages) with
  query or response None when the other is missing; response_messages counts the messages merged into the
  response (zone transfers), else 1.
"""

from dataclasses import dataclass, field

# Link-layer types (LINKTYPE_* numbers as in pcap files; see tcpdump's linktypes list).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
# DLT_RAW as some systems write it in the pcap header (12 on most, 14 on OpenBSD).
LINKTYPE_RAW_ALIASES = (12, 14)
# What live capture keeps of an accepted frame (the kernel filter's return value): all of it.
SNAPLEN = 262144


class FrameBatch:
    """Frames that share one link type. Three parallel lists, one entry per frame.

    ts_ns: capture timestamp, integer nanoseconds since the epoch (never the wall clock)
    wirelen: original frame length on the wire
    data: captured bytes (possibly shorter than wirelen when a snaplen cut it)

    packed: the same frames without an object per frame (a probe._records.Frames, made by the C sources: the
    pcap splitter, the ring reader), or None. With it, the three lists are made from it when first read; the
    columnar decoder reads it directly.

    share: (k, n) when the source kept only the frames of read worker k of n (`dnsprobe read --workers n`, the
    pcap splitter), else None; read: then (frames read, capture time of the last one), theirs included, on which
    the worker's capture clock runs (frames_read, last_ts).
    """

    __slots__ = ("linktype", "_ts_ns", "_wirelen", "_data", "packed", "share", "read")

    def __init__(self, linktype, ts_ns=None, wirelen=None, data=None, packed=None, share=None, read=None):
        self.linktype = linktype
        self.packed = packed
        self.share = share
        self.read = read
        if packed is None:
            self._ts_ns = [] if ts_ns is None else ts_ns
            self._wirelen = [] if wirelen is None else wirelen
            self._data = [] if data is None else data
        else:
            self._ts_ns = self._wirelen = self._data = None

    def _unpack(self):
        self._ts_ns, self._wirelen, self._data = self.packed.lists()

    @property
    def has_lists(self):
        """Whether the three lists exist (given, or made from packed when first read)."""
        return self._data is not None

    @property
    def ts_ns(self):
        if self._ts_ns is None:
            self._unpack()
        return self._ts_ns

    @property
    def wirelen(self):
        if self._wirelen is None:
            self._unpack()
        return self._wirelen

    @property
    def data(self):
        if self._data is None:
            self._unpack()
        return self._data

    def last_ts(self):
        """Capture time of the last frame read (frames_read() is not 0)."""
        if self.read is not None:
            return self.read[1]
        return self.packed.last_ts() if self._ts_ns is None else self._ts_ns[-1]

    def frames_read(self):
        """The frames the source read for this batch: len(self), and with a share also the other workers'."""
        return len(self) if self.read is None else self.read[0]

    def __len__(self):
        return len(self.packed) if self._data is None else len(self._data)

    def __repr__(self):
        packed = ", packed" if self._data is None else ""
        share = ""
        if self.share is not None:
            share = f", worker {self.share[0]} of {self.share[1]}'s of {self.frames_read()} read"
        return f"FrameBatch(linktype={self.linktype}, {len(self)} frames{packed}{share})"


@dataclass(slots=True)
class DnstapBatch:
    """dnstap data frames (each a protobuf Dnstap message), in runs by producer.

    runs: [(producer, [frame bytes, ...]), ...]; producer names the connection or file the frames came from
      (it keeps apart in matching the messages of producers that send no identity).
    refused: filled by the decoder, {producer: reason} for a producer that sent a frame that does not decode
      (the rest of its run is dropped); the source closes that connection (a file: an error naming it).
    """

    runs: list = field(default_factory=list)
    refused: dict = field(default_factory=dict)

    def __len__(self):
        return sum(len(frames) for _, frames in self.runs)


class QueryCopy(tuple):
    """A query message carried inside a dnstap response message besides its own query message (Knot's
    responses-with-queries). Matching uses it only when the query itself was not logged, so that the
    transaction counts once; being a tuple subclass, the C matching loop leaves it to the Python one."""

    __slots__ = ()


# Lengths and counts go to int32 columns (DNS Probe's len, res_len, dns_res_len, ancount). A frame's own
# length above this is refused by the sources; sums over frames or messages are capped here and counted.
INT32_MAX = 0x7FFFFFFF


def cap_int32(value, stats):
    """A summed length or count as stored: at most INT32_MAX (stats.lengths_capped counts each cut); None
    (no frames: dnstap) stays None."""
    if value is not None and value > INT32_MAX:
        stats.lengths_capped += 1
        return INT32_MAX
    return value


NET_FIELDS = (
    "ts_ns",  # capture time of the (first) frame carrying the message, ns since the epoch
    "wirelen",  # frame length(s) on the wire; TCP and fragments: summed over the frames used
    "ipv",  # 4 or 6
    "proto",  # 17 UDP, 6 TCP
    "src",  # source address, packed bytes
    "sport",
    "dst",  # destination address, packed bytes
    "dport",
    "ttl",  # IPv4 TTL or IPv6 hop limit
    "udp_sum",  # UDP checksum (0 for TCP)
    "vlan",  # outermost 802.1Q/802.1ad VLAN id, or None
    "tcp_rtt_ms",  # TCP handshake round trip in ms when the handshake was seen, else None
    "transport",  # TRANSPORTS code (udp, tcp, dot, doh, ...), None when the source does not say
    "scope",  # what a query and its response share besides their ends and DNS ID (the first part of the match
    # key): the IP protocol (proto) for packets; for dnstap a tuple of transport, producer and message family
    "origin",  # None for packets; dnstap: (message family: auth, client, resolver, ..., server identity or None)
)

# Transports, numbered as dnstap's SocketProtocol (the transport field's values): code -> (name, IP protocol,
# RFC 8618 transport value of qr-transport-flags bits 1-4; 15 "non-standard" where RFC 8618 defines none).
TRANSPORTS = {
    1: ("udp", 17, 0),
    2: ("tcp", 6, 1),
    3: ("dot", 6, 2),
    4: ("doh", 6, 4),
    5: ("dnscrypt-udp", 17, 15),
    6: ("dnscrypt-tcp", 6, 15),
    7: ("doq", 17, 15),
}
TRANSPORT_UDP = 1
TRANSPORT_TCP = 2
CDNS_TRANSPORT_UNKNOWN = 15  # RFC 8618 "non-standard transport": also a message whose transport is not known

DNS_FIELDS = (
    "dns_len",  # DNS message length (TCP: without the 2-byte prefix)
    "id",
    "flags",  # the 16-bit flags word of the header
    "qdcount",
    "ancount",
    "nscount",
    "arcount",
    "qname",  # text, labels joined by '.', original case, no trailing dot
    "qtype",
    "qclass",
    "labels",  # number of labels in QNAME
    "edns",  # EDNS tuple (EDNS_FIELDS) or None without OPT
    "malformed",  # True when the message could not be walked to its end
    "last_an_type",  # RR type of the last answer (closes zone transfers), or None
    "raw",  # the DNS message bytes as received (C-DNS); None where the exporter does not read it (export.reads_raw)
)

EDNS_FIELDS = (
    "udp_size",
    "version",
    "do",
    "ext_rcode",  # upper 8 bits of the extended RCODE
    "nsid",
    "dau",
    "dhu",
    "n3u",
    "client_subnet",  # "address/source-prefix" or ""
    "other",  # comma-separated codes of other options with a payload (DNS Probe's edns_other)
    "ede",  # tuple of extended DNS error info-codes (RFC 8914)
    "cookie",  # a COOKIE option is present
    "rdata",  # the OPT RR's RDATA bytes (its options), b"" without options (C-DNS query-opt-rdata)
)

MESSAGE_FIELDS = NET_FIELDS + DNS_FIELDS

# Index constants, generated from the tables so they cannot drift.
M = type("M", (), {name.upper(): i for i, name in enumerate(MESSAGE_FIELDS)})
E = type("E", (), {name.upper(): i for i, name in enumerate(EDNS_FIELDS)})

# Flag bits of the header's flags word.
FLAG_QR = 0x8000
FLAG_AA = 0x0400
FLAG_TC = 0x0200
FLAG_RD = 0x0100
FLAG_RA = 0x0080
FLAG_Z = 0x0040
FLAG_AD = 0x0020
FLAG_CD = 0x0010
