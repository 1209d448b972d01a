/* Message records: the C form of a decoded DNS message (probe.model MESSAGE_FIELDS), and the batches of them
 * that flow between the stages in C (probe.decode._decoderec -> probe.match._matchrec -> export.parquet.
 * _parquetrec), made by probe._records (probe/_records.c), whose functions the others reach through a capsule
 * (records_import below).
 *
 * Why: a message as a tuple of 30 Python objects cost more to allocate, free and read back than to decode;
 * a record is one contiguous struct with its strings in a tail behind it, so a batch of them is one buffer,
 * a pending query one allocation, and a transaction two memcpy's. Every field of MESSAGE_FIELDS has its
 * slot: rec_to_tuple gives exactly the tuple the Python decoder makes, and rec_from_tuple takes one (the
 * frames decoded by the Python code join the batch that way, in capture order).
 *
 * None: -1 in the int32 (and wirelen) fields that can be None, 0 in ipv, proto and transport, the ABSENT_ bits
 * for the addresses, SPAN_NONE in a span's length, 0 in the has_ flags. A packet's message has none of those
 * None but vlan, rtt and the DNS ones; a dnstap message (probe/decode/_dnstap.c) has no frame: wirelen, ttl,
 * udp_sum None, and the addresses, ports, ipv and proto when its producer did not send them.
 */
#ifndef DNSPROBE_RECORDS_H
#define DNSPROBE_RECORDS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "extmodule.h"
#include "model.h"

#define SPAN_NONE 0xFFFFFFFFu

/* The message tuple's layout (M_, E_ indexes) is model.h's. A packet's message (family 0) has its proto as scope
 * and no origin; a dnstap message has the scope (transport, family, identity or else producer) and the origin
 * (family, identity), made of the fields family, transport, identity and scope_name. */

/* dnstap message families (the origin's first item), by code: probe.decode.dnstap_types FAMILIES, whose code is
 * its index + 1; 0 is a packet's message, which has no origin. */
static const char *const FAMILY_NAMES[] = {NULL, "auth", "resolver", "client", "forwarder", "stub", "tool", "update"};
#define N_FAMILIES ((int)(sizeof FAMILY_NAMES / sizeof FAMILY_NAMES[0]))

/* Rec.absent: the address is None (dnstap) */
#define ABSENT_SRC 1
#define ABSENT_DST 2

/* A string or bytes value in the record's tail: offset from the record's start, length (SPAN_NONE: None). */
typedef struct {
    uint32_t off, len;
} Span;

typedef struct {
    uint32_t size; /* bytes of the record and its tail, a multiple of 8 */
    uint8_t ipv, proto, malformed, has_edns;
    uint8_t has_rtt, e_do, e_cookie, transport; /* transport: probe.model TRANSPORTS code, 0: None */
    uint8_t family;     /* dnstap: the origin's message family (FAMILY_NAMES); 0: a packet's message, no origin */
    uint8_t absent;     /* ABSENT_SRC, ABSENT_DST */
    uint8_t query_copy; /* a probe.model.QueryCopy: the query a dnstap response carries (matching: _matchrec.c) */
    uint8_t pad_;
    int32_t vlan; /* -1: None */
    int64_t ts_ns, wirelen, dns_len; /* wirelen -1: None */
    double rtt_ms;
    int32_t sport, dport, ttl, udp_sum;                    /* -1: None */
    int32_t id, flags, qdcount, ancount, nscount, arcount; /* -1: None */
    int32_t qtype, qclass, labels, last_an;                /* -1: None */
    int32_t e_udp, e_version, e_ext_rcode;                 /* EDNS (has_edns) */
    uint8_t src[16], dst[16];                              /* 4 bytes used for IPv4 */
    Span qname;                                            /* UTF-8 text of the Python str */
    Span raw;
    Span e_nsid, e_dau, e_dhu, e_n3u, e_ecs, e_other, e_rdata;
    Span e_ede; /* len: the number of codes, uint16 each */
    /* dnstap (SPAN_NONE in a packet's message): the server identity (the origin's second item; SPAN_NONE: None),
     * and the scope's third item, the identity or else the producer's name. Matching compares the scope as
     * TransactionTable compares the tuple: transport, family and this text, byte for byte (the texts are
     * UTF-8 of Python str, equal exactly when the str are), so no id has to be kept unique anywhere. */
    Span identity, scope_name;
} Rec;

static inline const char *rec_at(const Rec *r, Span s)
{
    return (const char *)r + s.off;
}

/* Records and transactions are 8-byte aligned in their buffers. */
static inline size_t align8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

static inline int addr_len(const Rec *r)
{
    return r->ipv == 6 ? 16 : 4;
}

/* A growable buffer of records (or of transactions) and the offsets where each starts. */
typedef struct {
    char *buf;
    size_t len, cap;
    size_t *at;
    Py_ssize_t n;
    size_t n_cap;
} RecBuf;

/* MsgBatch: the messages of a batch of frames, in capture order. */
typedef struct {
    PyObject_HEAD RecBuf recs;
} MsgBatch;

/* A transaction: a header, then the query record (if any), then the response record (if any). */
typedef struct {
    uint32_t size;      /* bytes of the whole transaction, a multiple of 8 */
    int32_t messages;   /* response messages (zone transfers: more than 1) */
    uint32_t q, r;      /* offsets of the records from the header; 0: None */
} TxHead;

static inline const Rec *tx_query(const TxHead *t)
{
    return t->q ? (const Rec *)((const char *)t + t->q) : NULL;
}

static inline const Rec *tx_response(const TxHead *t)
{
    return t->r ? (const Rec *)((const char *)t + t->r) : NULL;
}

/* TxBatch: completed transactions, in completion order. */
typedef struct {
    PyObject_HEAD RecBuf txs;
} TxBatch;

static inline const TxHead *txbatch_get(const TxBatch *b, Py_ssize_t i)
{
    return (const TxHead *)(b->txs.buf + b->txs.at[i]);
}

static inline const Rec *msgbatch_get(const MsgBatch *b, Py_ssize_t i)
{
    return (const Rec *)(b->recs.buf + b->recs.at[i]);
}

/* Frames: a FrameBatch's frames without a Python object per frame (FrameBatch.packed). Each frame points into
 * memory that one of `owners` holds (a pcap file buffer, a copied ring block). A tag other than 0 is an
 * 802.1Q/802.1ad tag the kernel took off the frame (VLAN offload): TPID << 16 | TCI; the frame is read as if
 * the tag were back at offset 12 (and 4 bytes longer on the wire), as the Python ring reader rebuilds it. */
typedef struct {
    PyObject_HEAD PyObject *owners; /* a list */
    const unsigned char **ptr;
    uint32_t *caplen, *wirelen, *tag;
    int64_t *ts;
    Py_ssize_t n, cap;
    int decoding; /* decode_packed calls under way: clear() would free the frames they read (refused) */
} Frames;

/* Frame i of f, whose tag was taken off (tag != 0, caplen >= 12), with the tag put back at offset 12: its
 * caplen + 4 bytes written at d. */
static inline void frame_with_tag(const Frames *f, Py_ssize_t i, unsigned char *d)
{
    uint32_t n = f->caplen[i], tag = f->tag[i];
    memcpy(d, f->ptr[i], 12);
    d[12] = (unsigned char)(tag >> 24);
    d[13] = (unsigned char)(tag >> 16);
    d[14] = (unsigned char)(tag >> 8);
    d[15] = (unsigned char)tag;
    memcpy(d + 16, f->ptr[i] + 12, n - 12);
}

/* What probe._records gives the other extensions (its capsule RECORDS_CAPSULE). */
typedef struct {
    PyTypeObject *msgbatch_type, *txbatch_type, *frames_type;
    /* a frame of `caplen` bytes at ptr (memory an owner holds: see frames_own) */
    int (*frames_add)(Frames *f, const unsigned char *ptr, uint32_t caplen, uint32_t wirelen, int64_t ts,
                      uint32_t tag);
    /* keep obj alive as long as the frames (once: when it is not already the last owner) */
    int (*frames_own)(Frames *f, PyObject *obj);
    /* room for an item of `bytes` more at b->buf + b->len (-1 with an exception; OverflowError past 4 GiB) */
    int (*reserve)(RecBuf *b, size_t bytes);
    /* an item (record or transaction) that starts at `start` */
    int (*push)(RecBuf *b, size_t start);
    /* a transaction of copies of q and r (either may be NULL) with `messages` response messages */
    int (*txbatch_add)(TxBatch *b, const Rec *q, const Rec *r, int32_t messages);
    /* bytes.decode("utf-8", "backslashreplace") as UTF-8 at out (room for 4 * n bytes); its length */
    size_t (*utf8_backslashreplace)(const unsigned char *s, size_t n, char *out);
} RecordsApi;

#define RECORDS_CAPSULE "probe._records.api"

#ifndef RECORDS_MODULE
/* In the extensions that use records: set by records_import() in their module init. */
static const RecordsApi *records;

static int records_import(void)
{
    records = ext_import_capsule("probe._records", RECORDS_CAPSULE);
    return records == NULL ? -1 : 0;
}

/* records->reserve and records->push with their usual case inline (the room is there): a call through the capsule
 * for each record cost more than the test. */
static inline int recbuf_room(RecBuf *b, size_t bytes)
{
    if (bytes <= UINT32_MAX && b->len + bytes <= b->cap)
        return 0;
    return records->reserve(b, bytes);
}

static inline int recbuf_add(RecBuf *b, size_t start)
{
    if ((size_t)b->n < b->n_cap) {
        b->at[b->n++] = start;
        return 0;
    }
    return records->push(b, start);
}
#endif

#endif
