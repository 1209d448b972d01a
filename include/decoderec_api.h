/* The C API that probe.decode._decoderec gives the other decoders (a capsule, the CPython way): the writer of a
 * message record, so that the dnstap decoder (probe/decode/_dnstap.c) fills the DNS part and the tail of its
 * records exactly as the packet decoder does, with the one DNS walker (include/wire.h). */
#ifndef DNSPROBE_DECODEREC_API_H
#define DNSPROBE_DECODEREC_API_H

#include "records.h"

#define DECODEREC_CAPSULE "probe.decode._decoderec._C_API"
#define DECODEREC_API_VERSION 1

/* The network part of a message (probe.model NET_FIELDS) with its scope and origin, as a record stores them. */
typedef struct {
    int64_t ts, wirelen;            /* wirelen -1: None */
    int ipv, proto, transport;      /* 0: None */
    const unsigned char *src, *dst; /* NULL: None */
    int32_t sport, dport, ttl, udp_sum, vlan; /* -1: None */
    int has_rtt;
    double rtt;
    int family, query_copy;         /* dnstap: see Rec; 0 for a packet's message */
    const char *identity, *scope_name; /* dnstap: UTF-8 text (identity NULL: None) */
    size_t identity_len, scope_name_len;
} MsgNet;

typedef struct {
    int version; /* DECODEREC_API_VERSION */
    /* The record of the DNS message p[0..n) with the network part net, appended to out (raw kept with keep_raw);
     * *flags: the header's flags word or -1, *malformed: its malformed flag. -1 with an exception set. */
    int (*put_record)(MsgBatch *out, const MsgNet *net, const unsigned char *p, Py_ssize_t n, int keep_raw,
                      int32_t *flags, int *malformed);
} DecoderecApi;

#endif
