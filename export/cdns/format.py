"""C-DNS (RFC 8618) map keys and bit values, shared by the writer (export/cdns/writer.py) and the reader.

Every number here is copied from RFC 8618 Appendix A's CDDL (tests/data/cdns); the names are the
CDDL names with '-' → '_' and upper case. Maps are plain ints so a file is `cbor2.loads`-able without
this module; tables of (name, key) pairs let a reader turn a map into names.
"""

FILE_TYPE_ID = "C-DNS"
FORMAT_MAJOR = 1  # the values written under MAJOR_FORMAT_VERSION / MINOR_FORMAT_VERSION
FORMAT_MINOR = 0

# -- FilePreamble --
MAJOR_FORMAT_VERSION = 0
MINOR_FORMAT_VERSION = 1
PRIVATE_VERSION = 2
BLOCK_PARAMETERS = 3

# -- BlockParameters --
STORAGE_PARAMETERS = 0
COLLECTION_PARAMETERS = 1

# -- StorageParameters --
TICKS_PER_SECOND = 0
MAX_BLOCK_ITEMS = 1
STORAGE_HINTS = 2
OPCODES = 3
RR_TYPES = 4
STORAGE_FLAGS = 5
CLIENT_ADDRESS_PREFIX_IPV4 = 6
CLIENT_ADDRESS_PREFIX_IPV6 = 7
SERVER_ADDRESS_PREFIX_IPV4 = 8
SERVER_ADDRESS_PREFIX_IPV6 = 9
SAMPLING_METHOD = 10
ANONYMIZATION_METHOD = 11

# -- StorageHints --
QUERY_RESPONSE_HINTS = 0
QUERY_RESPONSE_SIGNATURE_HINTS = 1
RR_HINTS = 2
OTHER_DATA_HINTS = 3

# QueryResponseHintValues: bit numbers. The hint bit of a Q/R item field equals its map key (0..9),
# except response-processing-data (10) and the extended sections (11..17, no map key of their own).
QR_HINT_BITS = {
    "time-offset": 0,
    "client-address-index": 1,
    "client-port": 2,
    "transaction-id": 3,
    "qr-signature-index": 4,
    "client-hoplimit": 5,
    "response-delay": 6,
    "query-name-index": 7,
    "query-size": 8,
    "response-size": 9,
    "response-processing-data": 10,
    "query-question-sections": 11,  # second and subsequent questions
    "query-answer-sections": 12,
    "query-authority-sections": 13,
    "query-additional-sections": 14,
    "response-answer-sections": 15,
    "response-authority-sections": 16,
    "response-additional-sections": 17,
}

# QueryResponseSignatureHintValues: the bit of each signature field equals its map key (0..16).
QR_SIG_HINT_BITS = {
    "server-address-index": 0,
    "server-port": 1,
    "qr-transport-flags": 2,
    "qr-type": 3,
    "qr-sig-flags": 4,
    "query-opcode": 5,
    "qr-dns-flags": 6,
    "query-rcode": 7,
    "query-classtype-index": 8,
    "query-qdcount": 9,
    "query-ancount": 10,
    "query-nscount": 11,
    "query-arcount": 12,
    "query-edns-version": 13,
    "query-udp-size": 14,
    "query-opt-rdata-index": 15,
    "response-rcode": 16,
}

RR_HINT_BITS = {"ttl": 0, "rdata-index": 1}
OTHER_DATA_HINT_BITS = {"malformed-messages": 0, "address-event-counts": 1}

# StorageFlagValues
STORAGE_FLAG_ANONYMIZED_DATA = 1 << 0
STORAGE_FLAG_SAMPLED_DATA = 1 << 1
STORAGE_FLAG_NORMALIZED_NAMES = 1 << 2

# -- CollectionParameters --
QUERY_TIMEOUT = 0  # milliseconds
SKEW_TIMEOUT = 1  # microseconds
SNAPLEN = 2
PROMISC = 3
INTERFACES = 4
SERVER_ADDRESSES = 5
VLAN_IDS = 6
FILTER = 7
GENERATOR_ID = 8
HOST_ID = 9
# Implementation-specific (RFC 8618 7.1: negative keys are reserved for them), written and read only with a
# generator-id starting "dnsprobe": a map of text keys, "source" and "config_sha256" (export.filemeta). Far from
# the small ones compactor writes there (-1 in its gold file), so no reader takes one for the other.
DNSPROBE_ORIGIN = -100

# -- Block --
BLOCK_PREAMBLE = 0
BLOCK_STATISTICS = 1
BLOCK_TABLES = 2
QUERY_RESPONSES = 3
ADDRESS_EVENT_COUNTS = 4
MALFORMED_MESSAGES = 5

# -- BlockPreamble --
EARLIEST_TIME = 0  # [seconds, ticks]
BLOCK_PARAMETERS_INDEX = 1

# -- BlockStatistics --
PROCESSED_MESSAGES = 0
QR_DATA_ITEMS = 1
UNMATCHED_QUERIES = 2
UNMATCHED_RESPONSES = 3
DISCARDED_OPCODE = 4
MALFORMED_ITEMS = 5

# -- BlockTables --
IP_ADDRESS = 0
CLASSTYPE = 1
NAME_RDATA = 2
QR_SIG = 3
QLIST = 4
QRR = 5
RRLIST = 6
RR = 7
MALFORMED_MESSAGE_DATA = 8

# -- ClassType --
TYPE = 0
CLASS = 1

# -- QueryResponseSignature --
SERVER_ADDRESS_INDEX = 0
SERVER_PORT = 1
QR_TRANSPORT_FLAGS = 2
QR_TYPE = 3
QR_SIG_FLAGS = 4
QUERY_OPCODE = 5
QR_DNS_FLAGS = 6
QUERY_RCODE = 7
QUERY_CLASSTYPE_INDEX = 8
QUERY_QDCOUNT = 9
QUERY_ANCOUNT = 10
QUERY_NSCOUNT = 11
QUERY_ARCOUNT = 12
QUERY_EDNS_VERSION = 13
QUERY_UDP_SIZE = 14
QUERY_OPT_RDATA_INDEX = 15
RESPONSE_RCODE = 16

# TransportFlags / QueryResponseTransportFlags: bit 0 IP version, bits 1..4 the transport, bit 5 trailing data.
TRANSPORT_IPV6 = 1 << 0
TRANSPORT_SHIFT = 1
TRANSPORT_MASK = 0xF << TRANSPORT_SHIFT
TRANSPORT_UDP = 0
TRANSPORT_TCP = 1
TRANSPORT_TLS = 2
TRANSPORT_DTLS = 3
TRANSPORT_HTTPS = 4
TRANSPORT_NON_STANDARD = 15
TRANSPORT_QUERY_TRAILINGDATA = 1 << 5

# QueryResponseType values, by CDDL name
QR_TYPES = {"stub": 0, "client": 1, "resolver": 2, "auth": 3, "forwarder": 4, "tool": 5}

# QueryResponseFlagValues (qr-sig-flags)
QR_HAS_QUERY = 1 << 0
QR_HAS_RESPONSE = 1 << 1
QR_QUERY_HAS_OPT = 1 << 2
QR_RESPONSE_HAS_OPT = 1 << 3
QR_QUERY_HAS_NO_QUESTION = 1 << 4
QR_RESPONSE_HAS_NO_QUESTION = 1 << 5

# DNSFlagValues (qr-dns-flags): query header flags in bits 0..6, query DO in 7, response flags in 8..14.
DNS_FLAG_BITS = {
    "query-cd": 0,
    "query-ad": 1,
    "query-z": 2,
    "query-ra": 3,
    "query-rd": 4,
    "query-tc": 5,
    "query-aa": 6,
    "query-do": 7,
    "response-cd": 8,
    "response-ad": 9,
    "response-z": 10,
    "response-ra": 11,
    "response-rd": 12,
    "response-tc": 13,
    "response-aa": 14,
}
QUERY_DO = 1 << 7
RESPONSE_FLAGS_SHIFT = 8  # response flag = query flag bit + 8 (no response DO in C-DNS 1.0)

# -- Question (qrr) --
NAME_INDEX = 0
CLASSTYPE_INDEX = 1

# -- RR --
# NAME_INDEX = 0 and CLASSTYPE_INDEX = 1, as for Question
TTL = 2
RDATA_INDEX = 3

# -- MalformedMessageData --
MM_SERVER_ADDRESS_INDEX = 0
MM_SERVER_PORT = 1
MM_TRANSPORT_FLAGS = 2
MM_PAYLOAD = 3

# -- QueryResponse --
TIME_OFFSET = 0
CLIENT_ADDRESS_INDEX = 1
CLIENT_PORT = 2
TRANSACTION_ID = 3
QR_SIGNATURE_INDEX = 4
CLIENT_HOPLIMIT = 5
RESPONSE_DELAY = 6
QUERY_NAME_INDEX = 7
QUERY_SIZE = 8
RESPONSE_SIZE = 9
RESPONSE_PROCESSING_DATA = 10
QUERY_EXTENDED = 11
RESPONSE_EXTENDED = 12

# -- ResponseProcessingData --
BAILIWICK_INDEX = 0
PROCESSING_FLAGS = 1
PROCESSING_FROM_CACHE = 1 << 0

# -- QueryResponseExtended --
QUESTION_INDEX = 0
ANSWER_INDEX = 1
AUTHORITY_INDEX = 2
ADDITIONAL_INDEX = 3

# -- AddressEventCount --
AE_TYPE = 0
AE_CODE = 1
AE_ADDRESS_INDEX = 2
AE_TRANSPORT_FLAGS = 3
AE_COUNT = 4

# AddressEventType
AE_TCP_RESET = 0
AE_ICMP_TIME_EXCEEDED = 1
AE_ICMP_DEST_UNREACHABLE = 2
AE_ICMPV6_TIME_EXCEEDED = 3
AE_ICMPV6_DEST_UNREACHABLE = 4
AE_ICMPV6_PACKET_TOO_BIG = 5
ADDRESS_EVENT_TYPES = {
    AE_TCP_RESET: "tcp-reset",
    AE_ICMP_TIME_EXCEEDED: "icmp-time-exceeded",
    AE_ICMP_DEST_UNREACHABLE: "icmp-dest-unreachable",
    AE_ICMPV6_TIME_EXCEEDED: "icmpv6-time-exceeded",
    AE_ICMPV6_DEST_UNREACHABLE: "icmpv6-dest-unreachable",
    AE_ICMPV6_PACKET_TOO_BIG: "icmpv6-packet-too-big",
}

# -- MalformedMessage --
# TIME_OFFSET = 0, CLIENT_ADDRESS_INDEX = 1, CLIENT_PORT = 2 as for QueryResponse
MESSAGE_DATA_INDEX = 3

# File name suffixes of the whole-file compressions.
COMPRESSION_SUFFIXES = {"none": "", "gzip": ".gz", "xz": ".xz", "zstd": ".zst"}

# The RR types dnsprobe's writer declares in storage-parameters rr-types: every type IANA has assigned
# (RFC 6895 registry). RRs of other (unassigned, private-use) types are recorded too, RDATA as is.
RECORDED_RR_TYPES = (
    tuple(range(1, 54)) + tuple(range(55, 67)) + tuple(range(99, 110)) + tuple(range(249, 263)) + (32768, 32769)
)

# Layout of the RDATA of the RR types that carry domain names, so that a writer can expand compression
# pointers inside RDATA (RFC 1035's types, those RFC 3597 section 4 lists, and later types with names) and a
# reader can compress them again. Items: an int is that many fixed bytes, "N" a domain name, "S" a
# <character-string> (length byte + bytes), "*" the rest as is. RDATA that does not fit its layout is kept
# as recorded.
RDATA_NAME_LAYOUT = {
    2: ("N",),  # NS
    3: ("N",),  # MD
    4: ("N",),  # MF
    5: ("N",),  # CNAME
    6: ("N", "N", 20),  # SOA: MNAME RNAME SERIAL REFRESH RETRY EXPIRE MINIMUM
    7: ("N",),  # MB
    8: ("N",),  # MG
    9: ("N",),  # MR
    12: ("N",),  # PTR
    14: ("N", "N"),  # MINFO
    15: (2, "N"),  # MX
    17: ("N", "N"),  # RP
    18: (2, "N"),  # AFSDB
    21: (2, "N"),  # RT
    24: (18, "N", "*"),  # SIG: type covered .. key tag, signer's name, signature
    26: (2, "N", "N"),  # PX
    30: ("N", "*"),  # NXT
    33: (6, "N"),  # SRV: priority weight port target
    35: (4, "S", "S", "S", "N"),  # NAPTR: order preference flags services regexp replacement
    36: (2, "N"),  # KX
    39: ("N",),  # DNAME
    46: (18, "N", "*"),  # RRSIG
    47: ("N", "*"),  # NSEC
}


def bits(names, table):
    """The uint with the bits of `names` (CDDL names) set, from one of the *_BITS tables."""
    value = 0
    for name in names:
        value |= 1 << table[name]
    return value


def bit_names(value, table):
    """The CDDL names of the bits set in `value`, in bit order."""
    return [name for name, bit in sorted(table.items(), key=lambda kv: kv[1]) if value >> bit & 1]
