"""The Parquet output schema: DNS Probe's 55 columns in its order, then dnsprobe's own.

One table (name, Arrow type, meaning): the writer, the row builder, the C-DNS reader (which gives
its records these names) and the generated documentation all follow it.
"""

import pyarrow as pa

I32 = pa.int32()
I64 = pa.int64()
STR = pa.string()
BOOL = pa.bool_()
# Microseconds, UTC: every engine reads it with its default settings (Spark refuses TIMESTAMP(NANOS)).
TS_US = pa.timestamp("us", tz="UTC")
# One resource record of the response (export.answers): section answer/authority/additional, owner name, type,
# class, TTL, RDATA in presentation format (RFC 3597 \\# form for types without a text form here).
ANSWER = pa.struct([
    ("section", STR), ("name", STR), ("type", I32), ("class", I32), ("ttl", I64), ("data", STR),
])
ANSWERS = pa.list_(ANSWER)

# DNS Probe 1.6's ExportedDataSchema (its doc/ExportedDataSchema.rst), in order; its expected files are in tests/data.
DNSPROBE_COLUMNS = (
    ("id", I32, "DNS ID"),
    ("unixtime", I64, "capture time of the transaction (query, else response), seconds"),
    ("time", I64, "the same instant in microseconds"),
    ("qname", STR, "QNAME, labels joined by '.', original case, no trailing dot"),
    ("domainname", STR, "last two labels of QNAME, lower-cased"),
    ("len", I32, "query frame length (TCP: summed over the frames carrying the message)"),
    ("frag", I32, "always 0, as DNS Probe"),
    ("ttl", I32, "query IPv4 TTL / IPv6 hop limit"),
    ("ipv", I32, "4 or 6"),
    ("prot", I32, "17 UDP, 6 TCP"),
    ("src", STR, "client address"),
    ("srcp", I32, "client port"),
    ("dst", STR, "server address"),
    ("dstp", I32, "server port"),
    ("udp_sum", I32, "query UDP checksum (0 for TCP)"),
    ("dns_len", I32, "query DNS message length"),
    ("aa", BOOL, "response AA"),
    ("tc", BOOL, "response TC"),
    ("rd", BOOL, "query RD"),
    ("ra", BOOL, "query RA"),
    ("z", BOOL, "query Z"),
    ("ad", BOOL, "query AD"),
    ("cd", BOOL, "query CD"),
    ("ancount", I32, "response ANCOUNT (zone transfers: summed)"),
    ("arcount", I32, "response ARCOUNT"),
    ("nscount", I32, "response NSCOUNT"),
    ("qdcount", I32, "query QDCOUNT"),
    ("opcode", I32, "OPCODE"),
    ("rcode", I32, "response RCODE including the extended bits of its OPT"),
    ("qtype", I32, "QTYPE"),
    ("qclass", I32, "QCLASS"),
    ("country", STR, "client country, ISO 3166 code (enrich.geoip_country; else or unknown: empty)"),
    ("asn", STR, "client AS number, decimal digits (enrich.geoip_asn; else or unknown: empty)"),
    ("edns_udp", I32, "query EDNS UDP payload size, 0 without OPT"),
    ("edns_version", I32, "query EDNS version"),
    ("edns_do", BOOL, "query DO bit"),
    ("edns_ping", BOOL, "always false, as DNS Probe"),
    ("edns_nsid", STR, "NSID from the response OPT"),
    ("edns_dnssec_dau", STR, "query DAU algorithms, comma-separated"),
    ("edns_dnssec_dhu", STR, "query DHU algorithms"),
    ("edns_dnssec_n3u", STR, "query N3U algorithms"),
    ("edns_client_subnet", STR, "query EDNS client subnet as address/source-prefix"),
    ("edns_other", STR, "codes of other query options with a payload, comma-separated"),
    ("edns_client_subnet_asn", STR, "AS number of the client subnet's address (enrich.geoip_asn; else empty)"),
    ("edns_client_subnet_country", STR, "country of the client subnet's address (enrich.geoip_country; else empty)"),
    ("labels", I32, "number of QNAME labels"),
    ("res_len", I32, "response frame length (TCP, zone transfers: summed)"),
    ("time_micro", I64, "microsecond part of time"),
    ("resp_frag", I32, "always 0, as DNS Probe"),
    ("proc_time", I32, "always 0, as DNS Probe"),
    ("is_google", BOOL, "the client is a Google Public DNS resolver (enrich.public_resolvers; else false)"),
    ("is_opendns", BOOL, "the client is an OpenDNS resolver (enrich.public_resolvers; else false)"),
    ("dns_res_len", I32, "response DNS message length (zone transfers: summed)"),
    ("server_location", STR, "the probe's server name (export.server_name; hive layout: the host name; else empty)"),
    ("tcp_hs_rtt", pa.float64(), "TCP handshake round trip (SYN to the client's ACK) in ms; null for UDP"),
)

DNSPROBE_EXTRA_COLUMNS = (
    ("timestamp", TS_US, "capture timestamp of the transaction (query, else response; µs, UTC), never null: the"
     " time-range column, the instant of `time` as a Parquet timestamp"),
    ("query_present", BOOL, "the transaction has a query"),
    ("response_present", BOOL, "the transaction has a response"),
    ("response_delay_us", I64, "response capture time minus query capture time, microseconds"),
    ("query_time", TS_US, "query capture timestamp (µs, UTC)"),
    ("response_time", TS_US, "response capture timestamp (µs, UTC)"),
    ("vlan", I32, "outermost VLAN id, null when untagged"),
    ("edns_ede", pa.list_(I32), "extended DNS error info-codes from the response (RFC 8914)"),
    ("malformed", BOOL, "the message could not be parsed to its end (exported unmatched)"),
    ("response_messages", I32, "response messages in the transaction (>1 for zone transfers)"),
    ("res_edns_udp", I32, "response EDNS UDP payload size, 0 without OPT"),
    ("transport", STR, "how the query reached the server: udp, tcp, dot, doh, doq, dnscrypt-udp, dnscrypt-tcp (packet"
     " capture: udp or tcp; dnstap: the producer's socket_protocol, null when it sends none)"),
    ("dnstap_type", STR, "dnstap: the message family the server logged (auth, client, resolver, forwarder, stub,"
     " tool, update); null for packet capture"),
    ("server_identity", STR, "dnstap: the identity the server sent (its name, as configured there); null for packet"
     " capture or when the server sends none"),
    ("public_resolver", STR, "Google, Cloudflare, Quad9 or OpenDNS when the client is one of their resolvers, else"
     " empty (enrich.public_resolvers; else null)"),
    ("registered_domain", STR, "QNAME's public suffix and one label more, lower-cased; empty for a suffix itself"
     " (enrich.public_suffix; else null)"),
    ("public_suffix", STR, "QNAME's public suffix (Public Suffix List), lower-cased (enrich.public_suffix; else"
     " null)"),
    ("answers", ANSWERS, "the response's answer, authority and additional records in presentation format"
     " (export.answers; else null)"),
)

COLUMNS = DNSPROBE_COLUMNS + DNSPROBE_EXTRA_COLUMNS
# Written in every file (key-value metadata dnsprobe.schema_version, export.filemeta). One more whenever a column
# is added, removed, renamed or changes type or meaning: a reader can then tell which columns a file has.
SCHEMA_VERSION = 2  # 2: timestamp
SCHEMA = pa.schema([pa.field(name, typ) for name, typ, _ in COLUMNS])
# Columns whose values rarely repeat within a row group: Parquet writes them without a dictionary, which
# would only make them bigger and slower to write (docs/performance.md has the measurement).
UNIQUE_VALUED = frozenset(
    ("time", "time_micro", "id", "srcp", "udp_sum", "tcp_hs_rtt", "response_delay_us", "timestamp", "query_time",
     "response_time")
)
# Of those, the times: delta-encoded (DELTA_BINARY_PACKED), which is both smaller and cheaper to write than plain
# values, as times rise through a row group and time_micro stays within six digits.
DELTA_ENCODED = frozenset(("time", "time_micro", "timestamp", "query_time", "response_time"))
# Columns written without min/max statistics (nor the page index, which is built from them) unless export.sort
# orders the rows by them: names and client addresses span nearly their whole range in every row group of
# unsorted rows, so those statistics would let an engine skip nothing, and they are the costliest to compute.
UNSORTED_WITHOUT_STATISTICS = frozenset(("qname", "domainname", "src", "edns_client_subnet"))
# Columns written without a codec, as their pages leave zstd nothing to take: the delta-encoded times set on (nearly)
# every row (1,020,500 bytes compressed against 1,020,449 raw for `time` on the standard mix), and the columns of one
# value per file (DNS Probe's always-zero ones, the server's name), which zstd makes larger. Arrow's zstd costs
# about 18 µs for each page it compresses whatever the page's size (docs/performance.md).
UNCOMPRESSED = frozenset(("time", "time_micro", "timestamp", "query_time", "frag", "resp_frag", "proc_time",
                          "server_location"))


def leaf_paths(field, prefix=""):
    """The dotted paths of a field's Parquet leaf columns, as Parquet names them (a list's values: NAME.list.element),
    the keys of pyarrow's per-column writer settings."""
    path = prefix + field.name
    if pa.types.is_list(field.type):
        return leaf_paths(field.type.value_field.with_name("element"), path + ".list.")
    if pa.types.is_struct(field.type):
        return [leaf for child in field.type for leaf in leaf_paths(child, path + ".")]
    return [path]

