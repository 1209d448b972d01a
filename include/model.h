/* The layout of a message tuple (probe/model.py MESSAGE_FIELDS, DNS_FIELDS, EDNS_FIELDS) as C indexes, for the
 * extensions that make or read those tuples. Generated from probe/model.py: python -m probe.cli.docs --update
 * (tests/cli/test_docs.py fails when it is stale). */
#ifndef DNSPROBE_MODEL_H
#define DNSPROBE_MODEL_H

/* BEGIN layout (generated: python -m probe.cli.docs --update) */
/* MESSAGE_FIELDS (NET_FIELDS, then DNS_FIELDS) */
enum {
    M_TS_NS = 0, M_WIRELEN = 1, M_IPV = 2, M_PROTO = 3, M_SRC = 4, M_SPORT = 5, M_DST = 6, M_DPORT = 7, M_TTL = 8,
    M_UDP_SUM = 9, M_VLAN = 10, M_TCP_RTT_MS = 11, M_TRANSPORT = 12, M_SCOPE = 13, M_ORIGIN = 14, M_DNS_LEN = 15,
    M_ID = 16, M_FLAGS = 17, M_QDCOUNT = 18, M_ANCOUNT = 19, M_NSCOUNT = 20, M_ARCOUNT = 21, M_QNAME = 22,
    M_QTYPE = 23, M_QCLASS = 24, M_LABELS = 25, M_EDNS = 26, M_MALFORMED = 27, M_LAST_AN_TYPE = 28, M_RAW = 29,
    N_NET_FIELDS = 15, N_MESSAGE_FIELDS = 30,
};
/* DNS_FIELDS: the DNS tuple (probe.decode.dnswire.parse_message) */
enum {
    D_DNS_LEN = 0, D_ID = 1, D_FLAGS = 2, D_QDCOUNT = 3, D_ANCOUNT = 4, D_NSCOUNT = 5, D_ARCOUNT = 6, D_QNAME = 7,
    D_QTYPE = 8, D_QCLASS = 9, D_LABELS = 10, D_EDNS = 11, D_MALFORMED = 12, D_LAST_AN_TYPE = 13, D_RAW = 14,
    N_DNS_FIELDS = 15,
};
/* EDNS_FIELDS: the edns field's tuple */
enum {
    E_UDP_SIZE = 0, E_VERSION = 1, E_DO = 2, E_EXT_RCODE = 3, E_NSID = 4, E_DAU = 5, E_DHU = 6, E_N3U = 7,
    E_CLIENT_SUBNET = 8, E_OTHER = 9, E_EDE = 10, E_COOKIE = 11, E_RDATA = 12, N_EDNS_FIELDS = 13,
};
/* END layout */

/* probe.model TRANSPORTS codes of packets' messages */
#define TRANSPORT_UDP 1
#define TRANSPORT_TCP 2

#endif
