"""Declarative layout of a decoded DNS message.

A message is one flat tuple: the network part (NET_FIELDS, filled by the packet decoder) followed by
the DNS part (DNS_FIELDS, filled by the wire walker or by dpkt). Tuples, not objects, because a batch
of them transposes into columns with one zip(*rows) in C.
"""

# Lengths and counts go to int32 columns (DNS Probe's len, res_len, dns_res_len, ancount). A frame's own
# length above this is refused by the sources; sums over frames or messages are capped here and counted.
INT32_MAX = 0x7FFFFFFF


def cap_int32(value, stats):
    """A summed length or count as stored: at most INT32_MAX (stats.lengths_capped counts each cut)."""
    if value > INT32_MAX:
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
)

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
