/* export.parquet._parquetrec: a TxBatch of message records -> the Arrow buffers of the Parquet columns
 * (export/parquet/schema.py), in one pass, derived columns included. Its Python reference: RowBuilder.build in
 * export/parquet/rows.py.
 *
 * Why: a record builder over transaction tuples (a column pass, then Arrow compute kernels for the derived columns)
 * waited on the scattered tuples for most of its time; the records of a TxBatch are contiguous, and
 * every column, the derived ones too (times, flag bits, opcode, RCODE with its extended bits, the delay, the
 * domain name, address text), is written here from them. RowBuilder.build over the transaction tuples stays
 * the reference; tests/export/test_parquetrec.py checks that both give equal tables.
 *
 * parquet_arrays(txs, names, apart=False) -> [(capsule, address), ...]
 *   The columns `names` (export/parquet/schema.py SCHEMA names but answers, and r_raw: the response's DNS bytes as
 *   binary, for the answers column; ValueError for another) of every transaction's row, as one struct array of the
 *   Arrow C data interface, which pyarrow imports without a copy (RecordBatch._import_from_c(address, schema): the
 *   schema, of the same names and types, is made once in export/parquet/rows.py); the capsule ("arrow_array") owns
 *   it until then. apart: two, the rows on time, then the late ones (a query without response, not malformed: made
 *   once the query timed out, match.query_timeout after its time), which export.time_order writes in row groups of
 *   their own, both from the one pass: one look at each transaction sends it to its table's chunk.
 *   (Why the C data interface: wrapping ~70 columns a table in pyarrow arrays from Python cost ~0.3 ms a table.)
 *
 * Its cost (issue 33): the transactions are read once, a chunk at a time, the late ones sent to their own chunks as
 * they are gathered, and prefetched (their sizes vary: the hardware's stride prefetch does not follow them); the
 * buffers are made for every transaction of the batch (the late ones' for a chunk, grown), and zeroed only where
 * fill does not write every row; an address column keeps the text of 16 addresses (a few servers alternate row to row).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "valuetext.h"
#include "records.h"

enum { FLAG_AA = 0x0400, FLAG_TC = 0x0200, FLAG_RD = 0x0100, FLAG_RA = 0x0080, FLAG_Z = 0x0040, FLAG_AD = 0x0020,
       FLAG_CD = 0x0010 };

typedef enum { K_I32, K_I64, K_F64, K_BOOL, K_STR, K_LIST } Kind;

/* Every column the pass can write, by name (the SCHEMA of export/parquet/schema.py; the tests compare them). */
typedef enum {
    C_ID, C_UNIXTIME, C_TIME, C_QNAME, C_DOMAINNAME, C_LEN, C_ZERO, C_TTL, C_IPV, C_PROT, C_SRC, C_SRCP, C_DST,
    C_DSTP, C_UDP_SUM, C_DNS_LEN, C_AA, C_TC, C_RD, C_RA, C_Z, C_AD, C_CD, C_ANCOUNT, C_ARCOUNT, C_NSCOUNT,
    C_QDCOUNT, C_OPCODE, C_RCODE, C_QTYPE, C_QCLASS, C_EMPTY, C_EDNS_UDP, C_EDNS_VERSION, C_EDNS_DO, C_FALSE,
    C_EDNS_NSID, C_DAU, C_DHU, C_N3U, C_ECS, C_OTHER, C_LABELS, C_RES_LEN, C_TIME_MICRO, C_DNS_RES_LEN, C_RTT,
    C_Q_PRESENT, C_R_PRESENT, C_DELAY, C_Q_TIME, C_R_TIME, C_VLAN, C_EDE, C_MALFORMED, C_MESSAGES, C_RES_EDNS_UDP,
    C_TRANSPORT, C_DNSTAP_TYPE, C_SERVER_IDENTITY, C_NULL, C_R_RAW,
} Source;

static const struct {
    const char *name;
    Source source;
    Kind kind;
} COLUMNS[] = {
    {"id", C_ID, K_I32}, {"unixtime", C_UNIXTIME, K_I64}, {"time", C_TIME, K_I64}, {"qname", C_QNAME, K_STR},
    {"domainname", C_DOMAINNAME, K_STR}, {"len", C_LEN, K_I32}, {"frag", C_ZERO, K_I32}, {"ttl", C_TTL, K_I32},
    {"ipv", C_IPV, K_I32}, {"prot", C_PROT, K_I32}, {"src", C_SRC, K_STR}, {"srcp", C_SRCP, K_I32},
    {"dst", C_DST, K_STR}, {"dstp", C_DSTP, K_I32}, {"udp_sum", C_UDP_SUM, K_I32}, {"dns_len", C_DNS_LEN, K_I32},
    {"aa", C_AA, K_BOOL}, {"tc", C_TC, K_BOOL}, {"rd", C_RD, K_BOOL}, {"ra", C_RA, K_BOOL}, {"z", C_Z, K_BOOL},
    {"ad", C_AD, K_BOOL}, {"cd", C_CD, K_BOOL}, {"ancount", C_ANCOUNT, K_I32}, {"arcount", C_ARCOUNT, K_I32},
    {"nscount", C_NSCOUNT, K_I32}, {"qdcount", C_QDCOUNT, K_I32}, {"opcode", C_OPCODE, K_I32},
    {"rcode", C_RCODE, K_I32}, {"qtype", C_QTYPE, K_I32}, {"qclass", C_QCLASS, K_I32}, {"country", C_EMPTY, K_STR},
    {"asn", C_EMPTY, K_STR}, {"edns_udp", C_EDNS_UDP, K_I32}, {"edns_version", C_EDNS_VERSION, K_I32},
    {"edns_do", C_EDNS_DO, K_BOOL}, {"edns_ping", C_FALSE, K_BOOL}, {"edns_nsid", C_EDNS_NSID, K_STR},
    {"edns_dnssec_dau", C_DAU, K_STR}, {"edns_dnssec_dhu", C_DHU, K_STR}, {"edns_dnssec_n3u", C_N3U, K_STR},
    {"edns_client_subnet", C_ECS, K_STR}, {"edns_other", C_OTHER, K_STR}, {"edns_client_subnet_asn", C_EMPTY, K_STR},
    {"edns_client_subnet_country", C_EMPTY, K_STR}, {"labels", C_LABELS, K_I32}, {"res_len", C_RES_LEN, K_I32},
    {"time_micro", C_TIME_MICRO, K_I64}, {"resp_frag", C_ZERO, K_I32}, {"proc_time", C_ZERO, K_I32},
    {"is_google", C_FALSE, K_BOOL}, {"is_opendns", C_FALSE, K_BOOL}, {"dns_res_len", C_DNS_RES_LEN, K_I32},
    {"server_location", C_EMPTY, K_STR}, {"tcp_hs_rtt", C_RTT, K_F64}, {"timestamp", C_TIME, K_I64} /* (time's µs) */,
    {"query_present", C_Q_PRESENT, K_BOOL},
    {"response_present", C_R_PRESENT, K_BOOL}, {"response_delay_us", C_DELAY, K_I64},
    {"query_time", C_Q_TIME, K_I64}, {"response_time", C_R_TIME, K_I64}, {"vlan", C_VLAN, K_I32},
    {"edns_ede", C_EDE, K_LIST}, {"malformed", C_MALFORMED, K_BOOL}, {"response_messages", C_MESSAGES, K_I32},
    {"res_edns_udp", C_RES_EDNS_UDP, K_I32}, {"transport", C_TRANSPORT, K_STR}, {"dnstap_type", C_DNSTAP_TYPE, K_STR},
    {"server_identity", C_SERVER_IDENTITY, K_STR}, {"public_resolver", C_NULL, K_STR} /* (export.enrich's) */,
    {"registered_domain", C_NULL, K_STR}, {"public_suffix", C_NULL, K_STR},
    {"r_raw", C_R_RAW, K_STR},          /* (binary: not a column, what the answers column is made of) */
};

/* The transport column's text by transport code (probe.model TRANSPORTS); 0: None (null). */
static const char *const TRANSPORT_NAMES[] = {NULL, "udp", "tcp", "dot", "doh", "dnscrypt-udp", "dnscrypt-tcp", "doq"};
#define N_TRANSPORT_NAMES ((int)(sizeof TRANSPORT_NAMES / sizeof TRANSPORT_NAMES[0]))
#define N_KNOWN ((int)(sizeof COLUMNS / sizeof COLUMNS[0]))

/* The most bytes an address text takes in the column's text, with the NUL that ipv4_text and ipv6_text write
 * after it (INET6_ADDRSTRLEN). */
#define ADDRESS_ROOM 48

/* An address and its text, remembered by an address column: a few servers' addresses (and often a few clients')
 * alternate from row to row. */
typedef struct {
    char text[ADDRESS_ROOM];
    uint8_t addr[16];
    Py_ssize_t len;
    int ipv; /* 4 or 6; 0: none yet */
} AddressText;

#define ADDRESS_MEMO_BITS 4 /* 16 entries, by a hash of the address */

typedef struct {
    Source source;
    Kind kind;
    /* malloc'd, written in place, then handed to Arrow (to_arrow): data and validity for `rows` rows (a stream's
     * first size: every transaction of the batch for the rows on time, a chunk for the late ones; grown by
     * room_for_rows), var (strings: the text; lists: the int32 values) grown as it fills */
    char *bits, *out, *var;
    Py_ssize_t rows;
    size_t var_len, var_cap;
    Py_ssize_t nulls;
    AddressText *memo; /* the address columns' (1 << ADDRESS_MEMO_BITS entries) */
} Col;

/* Room for n more bytes of var; its first size is room for `rows` rows of 16 bytes, enough for most columns of
 * text (addresses, names) without growing. */
static int var_grow(Col *c, size_t n, Py_ssize_t rows)
{
    size_t cap = c->var_cap ? c->var_cap : Py_MAX((size_t)1 << 12, 16 * (size_t)rows);
    while (cap < c->var_len + n)
        cap *= 2;
    char *var = cap > (size_t)PY_SSIZE_T_MAX ? NULL : realloc(c->var, cap);
    if (var == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->var = var;
    c->var_cap = cap;
    return 0;
}

static inline int var_room(Col *c, size_t n, Py_ssize_t rows)
{
    return c->var_len + n <= c->var_cap ? 0 : var_grow(c, n, rows);
}

static inline void set_null(Col *c, Py_ssize_t i)
{
    c->nulls++;
    c->bits[i >> 3] &= (char)~(1 << (i & 7));
}

/* Coalesce of an int32 field that can be None (-1): the query's, else the response's. */
#define COALESCE(q, r, f) ((q) != NULL && (q)->f >= 0 ? (q)->f : (r) != NULL ? (r)->f : -1)
/* The same of a field whose None is 0 (ipv, proto). */
#define COALESCE0(q, r, f) ((q) != NULL && (q)->f ? (q)->f : (r) != NULL ? (r)->f : 0)

static inline void put_i32(Col *c, Py_ssize_t i, int32_t v, int present)
{
    ((int32_t *)c->out)[i] = present ? v : 0;
    if (!present)
        set_null(c, i);
}

/* A length (int64 in the record, capped to int32 by the stages that sum them). */
static inline int put_len(Col *c, Py_ssize_t i, int64_t v, int present)
{
    if (present && (v < INT32_MIN || v > INT32_MAX)) {
        PyErr_Format(PyExc_OverflowError, "value %lld does not fit in int32", (long long)v);
        return -1;
    }
    put_i32(c, i, (int32_t)v, present);
    return 0;
}

static inline void put_i64(Col *c, Py_ssize_t i, int64_t v, int present)
{
    ((int64_t *)c->out)[i] = present ? v : 0;
    if (!present)
        set_null(c, i);
}

static inline void put_bool(Col *c, Py_ssize_t i, int v, int present)
{
    if (!present)
        set_null(c, i);
    else if (v)
        c->out[i >> 3] |= (char)(1 << (i & 7));
}

/* Row i's end offset (the text's end; a list's, in values). Its range is checked once a chunk, at fill's end. */
static inline void close_value(Col *c, Py_ssize_t i)
{
    ((int32_t *)c->out)[i + 1] = (int32_t)(c->kind == K_LIST ? c->var_len / 4 : c->var_len);
}

static inline int put_text(Col *c, Py_ssize_t i, const char *s, size_t n, Py_ssize_t rows)
{
    if (n != 0) { /* (c->var may still be NULL: no memcpy to it) */
        if (var_room(c, n, rows) < 0)
            return -1;
        memcpy(c->var + c->var_len, s, n);
        c->var_len += n;
    }
    close_value(c, i);
    return 0;
}

static inline void put_null_var(Col *c, Py_ssize_t i)
{
    set_null(c, i);
    close_value(c, i);
}

/* An EDNS text of message m (its field at byte offset `field` of the record), "" when m has no OPT record
 * (DNS Probe's fill), null without the message. */
static inline int put_edns_text(Col *c, Py_ssize_t i, const Rec *m, size_t field, Py_ssize_t rows)
{
    if (m == NULL || !m->has_edns) {
        if (m == NULL)
            set_null(c, i);
        close_value(c, i);
        return 0;
    }
    const Span *s = (const Span *)((const char *)m + field);
    return put_text(c, i, rec_at(m, *s), s->len, rows);
}

/* The text of address a (ipv 6, else 4), written in room already made (ADDRESS_ROOM), through the memo. */
static inline void put_address_text(Col *c, Py_ssize_t i, const uint8_t *a, int ipv)
{
    uint32_t h, w;
    memcpy(&h, a, 4);
    if (ipv == 6) {
        for (int k = 4; k < 16; k += 4) {
            memcpy(&w, a + k, 4);
            h ^= w;
        }
    }
    AddressText *e = &c->memo[(h * 0x9E3779B1u) >> (32 - ADDRESS_MEMO_BITS)]; /* (Fibonacci hashing) */
    if (ipv == 6 ? e->ipv != 6 || memcmp(a, e->addr, 16) != 0 : e->ipv != 4 || memcmp(a, e->addr, 4) != 0) {
        e->ipv = ipv == 6 ? 6 : 4;
        e->len = e->ipv == 6 ? ipv6_text(a, e->text) : ipv4_text(a, e->text);
        memcpy(e->addr, a, e->ipv == 6 ? 16 : 4);
    }
    memcpy(c->var + c->var_len, e->text, ADDRESS_ROOM); /* (a fixed size: a few vector moves) */
    c->var_len += (size_t)e->len;
    close_value(c, i);
}

/* The address text of the query's field (qa: src or dst, ABSENT_ bit qbit), else of the response's (ra, rbit);
 * null where both are None (dnstap). */
static inline void put_address(Col *c, Py_ssize_t i, const Rec *q, const uint8_t *qa, int qbit, const Rec *r,
                               const uint8_t *ra, int rbit)
{
    if (q != NULL && !(q->absent & qbit))
        put_address_text(c, i, qa, q->ipv);
    else if (r != NULL && !(r->absent & rbit))
        put_address_text(c, i, ra, r->ipv);
    else
        put_null_var(c, i);
}

/* Text or null: a span of the query, else of the response (origin's items: the same in both, or one side). */
static inline int put_span(Col *c, Py_ssize_t i, const Rec *q, const Rec *r, size_t field, Py_ssize_t rows)
{
    const Span *qs = q ? (const Span *)((const char *)q + field) : NULL;
    const Span *rs = r ? (const Span *)((const char *)r + field) : NULL;
    if (qs != NULL && qs->len != SPAN_NONE)
        return put_text(c, i, rec_at(q, *qs), qs->len, rows);
    if (rs != NULL && rs->len != SPAN_NONE)
        return put_text(c, i, rec_at(r, *rs), rs->len, rows);
    put_null_var(c, i);
    return 0;
}

/* Rows per chunk: the pass goes column by column within a chunk, whose transactions stay in the cache. A multiple
 * of 8, so that a chunk's bits start a byte. */
#define CHUNK 256

/* The rows of a chunk: their transactions, queries and responses (NULL: none) and the message that gives the
 * identity columns (the query, else the response); the stream's first size in rows (var_grow's first size). */
typedef struct {
    Py_ssize_t lo, n, most;
    const TxHead *t[CHUNK];
    const Rec *q[CHUNK], *r[CHUNK], *m[CHUNK];
} Rows;

#define ROWS for (Py_ssize_t k = 0; k < w->n; k++) {                                                          \
        Py_ssize_t i = w->lo + k;                                                                             \
        const Rec *q = w->q[k], *r = w->r[k], *m = w->m[k];                                                   \
        (void)q, (void)r, (void)m;
#define END_ROWS }
#define CHECK(x)                                                                                               \
    if ((x) < 0)                                                                                               \
        return -1;

/* The chunk's part of column c's buffers that fill does not write row by row: validity all valid, bool bits and the
 * constant columns zero. */
static void start_chunk(Col *c, const Rows *w)
{
    Py_ssize_t bytes = (w->n + 7) / 8;
    memset(c->bits + w->lo / 8, 0xff, bytes);
    if (c->kind == K_BOOL)
        memset(c->out + w->lo / 8, 0, bytes);
    else if (c->source == C_ZERO)
        memset(c->out + 4 * w->lo, 0, 4 * w->n);
    else if (c->source == C_EMPTY)
        memset(c->out + 4 * (w->lo + 1), 0, 4 * w->n);
}

/* Column c's rows of a chunk that vary. One loop per source, so that the choice is made once per column and chunk. */
static int fill(Col *c, const Rows *w)
{
    Py_ssize_t most = w->most;
    switch (c->source) {
    case C_ID: ROWS int32_t v = COALESCE(q, r, id); put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_QTYPE: ROWS int32_t v = COALESCE(q, r, qtype); put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_QCLASS: ROWS int32_t v = COALESCE(q, r, qclass); put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_LABELS: ROWS int32_t v = COALESCE(q, r, labels); put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_VLAN: ROWS int32_t v = COALESCE(q, r, vlan); put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_UNIXTIME: ROWS put_i64(c, i, m->ts_ns / 1000000000, 1); END_ROWS break;
    case C_TIME: ROWS put_i64(c, i, m->ts_ns / 1000, 1); END_ROWS break;
    case C_TIME_MICRO: /* (Arrow's integer division truncates, as C's) */
        ROWS int64_t us = m->ts_ns / 1000, sec = m->ts_ns / 1000000000;
        put_i64(c, i, (int64_t)((uint64_t)us - (uint64_t)sec * 1000000u), 1);
        END_ROWS break;
    case C_QNAME:
        ROWS const Rec *n = q && q->qname.len != SPAN_NONE ? q : r && r->qname.len != SPAN_NONE ? r : NULL;
        if (n == NULL)
            put_null_var(c, i);
        else
            CHECK(put_text(c, i, rec_at(n, n->qname), n->qname.len, most));
        END_ROWS break;
    case C_DOMAINNAME:
        ROWS const Rec *n = q && q->qname.len != SPAN_NONE ? q : r && r->qname.len != SPAN_NONE ? r : NULL;
        if (n == NULL) {
            put_null_var(c, i);
            continue;
        }
        if (n->qname.len != 0) {
            CHECK(var_room(c, n->qname.len, most));
            c->var_len += domain_name(rec_at(n, n->qname), n->qname.len, c->var + c->var_len);
        }
        close_value(c, i);
        END_ROWS break;
    case C_LEN: ROWS CHECK(put_len(c, i, q ? q->wirelen : 0, q && q->wirelen >= 0)); END_ROWS break;
    case C_RES_LEN: ROWS CHECK(put_len(c, i, r ? r->wirelen : 0, r && r->wirelen >= 0)); END_ROWS break;
    case C_DNS_LEN: ROWS CHECK(put_len(c, i, q ? q->dns_len : 0, q != NULL)); END_ROWS break;
    case C_DNS_RES_LEN: ROWS CHECK(put_len(c, i, r ? r->dns_len : 0, r != NULL)); END_ROWS break;
    case C_ZERO: break; /* zeros (start_chunk), all valid */
    case C_TTL: ROWS put_i32(c, i, q ? q->ttl : 0, q && q->ttl >= 0); END_ROWS break;
    case C_UDP_SUM: ROWS put_i32(c, i, q ? q->udp_sum : 0, q && q->udp_sum >= 0); END_ROWS break;
    case C_IPV: ROWS int v = COALESCE0(q, r, ipv); put_i32(c, i, v, v != 0); END_ROWS break;
    case C_PROT: ROWS int v = COALESCE0(q, r, proto); put_i32(c, i, v, v != 0); END_ROWS break;
    case C_SRCP:
        ROWS int32_t v = q && q->sport >= 0 ? q->sport : r ? r->dport : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_DSTP:
        ROWS int32_t v = q && q->dport >= 0 ? q->dport : r ? r->sport : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_SRC:
        CHECK(var_room(c, ADDRESS_ROOM * (size_t)w->n, most));
        ROWS put_address(c, i, q, q ? q->src : NULL, ABSENT_SRC, r, r ? r->dst : NULL, ABSENT_DST); END_ROWS
        break;
    case C_DST:
        CHECK(var_room(c, ADDRESS_ROOM * (size_t)w->n, most));
        ROWS put_address(c, i, q, q ? q->dst : NULL, ABSENT_DST, r, r ? r->src : NULL, ABSENT_SRC); END_ROWS
        break;
    case C_AA: ROWS int32_t f = r ? r->flags : -1; put_bool(c, i, f & FLAG_AA, f >= 0); END_ROWS break;
    case C_TC: ROWS int32_t f = r ? r->flags : -1; put_bool(c, i, f & FLAG_TC, f >= 0); END_ROWS break;
    case C_RD: ROWS int32_t f = q ? q->flags : -1; put_bool(c, i, f & FLAG_RD, f >= 0); END_ROWS break;
    case C_RA: ROWS int32_t f = q ? q->flags : -1; put_bool(c, i, f & FLAG_RA, f >= 0); END_ROWS break;
    case C_Z: ROWS int32_t f = q ? q->flags : -1; put_bool(c, i, f & FLAG_Z, f >= 0); END_ROWS break;
    case C_AD: ROWS int32_t f = q ? q->flags : -1; put_bool(c, i, f & FLAG_AD, f >= 0); END_ROWS break;
    case C_CD: ROWS int32_t f = q ? q->flags : -1; put_bool(c, i, f & FLAG_CD, f >= 0); END_ROWS break;
    case C_ANCOUNT: ROWS int32_t v = r ? r->ancount : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_ARCOUNT: ROWS int32_t v = r ? r->arcount : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_NSCOUNT: ROWS int32_t v = r ? r->nscount : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_QDCOUNT: ROWS int32_t v = q ? q->qdcount : -1; put_i32(c, i, v, v >= 0); END_ROWS break;
    case C_OPCODE:
        ROWS int32_t f = q && q->flags >= 0 ? q->flags : r ? r->flags : -1;
        put_i32(c, i, (f >> 11) & 0xF, f >= 0);
        END_ROWS break;
    case C_RCODE:
        ROWS int32_t f = r ? r->flags : -1, ext = r && r->has_edns ? r->e_ext_rcode : 0;
        put_i32(c, i, (f & 0xF) | (ext << 4), f >= 0);
        END_ROWS break;
    case C_EMPTY: break; /* empty strings: offsets all 0 (start_chunk), all valid */
    case C_FALSE: break; /* false (start_chunk), all valid */
    case C_EDNS_UDP: ROWS put_i32(c, i, q && q->has_edns ? q->e_udp : 0, q != NULL); END_ROWS break;
    case C_EDNS_VERSION: ROWS put_i32(c, i, q && q->has_edns ? q->e_version : 0, q != NULL); END_ROWS break;
    case C_RES_EDNS_UDP: ROWS put_i32(c, i, r && r->has_edns ? r->e_udp : 0, r != NULL); END_ROWS break;
    case C_EDNS_DO: ROWS put_bool(c, i, q && q->has_edns && q->e_do, q != NULL); END_ROWS break;
    case C_EDNS_NSID: ROWS CHECK(put_edns_text(c, i, r, offsetof(Rec, e_nsid), most)); END_ROWS break;
    case C_DAU: ROWS CHECK(put_edns_text(c, i, q, offsetof(Rec, e_dau), most)); END_ROWS break;
    case C_DHU: ROWS CHECK(put_edns_text(c, i, q, offsetof(Rec, e_dhu), most)); END_ROWS break;
    case C_N3U: ROWS CHECK(put_edns_text(c, i, q, offsetof(Rec, e_n3u), most)); END_ROWS break;
    case C_ECS: ROWS CHECK(put_edns_text(c, i, q, offsetof(Rec, e_ecs), most)); END_ROWS break;
    case C_OTHER: ROWS CHECK(put_edns_text(c, i, q, offsetof(Rec, e_other), most)); END_ROWS break;
    case C_RTT:
        ROWS const Rec *s = q && q->has_rtt ? q : r && r->has_rtt ? r : NULL;
        ((double *)c->out)[i] = s ? s->rtt_ms : 0.0;
        if (s == NULL)
            set_null(c, i);
        END_ROWS break;
    case C_Q_PRESENT: ROWS put_bool(c, i, q != NULL, 1); END_ROWS break;
    case C_R_PRESENT: ROWS put_bool(c, i, r != NULL, 1); END_ROWS break;
    case C_DELAY:
        ROWS put_i64(c, i, q && r ? (int64_t)((uint64_t)r->ts_ns - (uint64_t)q->ts_ns) / 1000 : 0, q && r);
        END_ROWS break;
    case C_Q_TIME: ROWS put_i64(c, i, q ? q->ts_ns / 1000 : 0, q != NULL); END_ROWS break; /* µs */
    case C_R_TIME: ROWS put_i64(c, i, r ? r->ts_ns / 1000 : 0, r != NULL); END_ROWS break;
    case C_EDE:
        ROWS if (r == NULL) {
            put_null_var(c, i);
            continue;
        }
        uint32_t n = r->has_edns ? r->e_ede.len : 0;
        if (n != 0)
            CHECK(var_room(c, 4 * (size_t)n, most));
        for (uint32_t j = 0; j < n; j++) {
            uint16_t code;
            memcpy(&code, rec_at(r, r->e_ede) + 2 * j, 2);
            int32_t v = code;
            memcpy(c->var + c->var_len, &v, 4);
            c->var_len += 4;
        }
        close_value(c, i);
        END_ROWS break;
    case C_MALFORMED: ROWS put_bool(c, i, m->malformed, 1); END_ROWS break;
    case C_MESSAGES: ROWS put_i32(c, i, w->t[k]->messages, r != NULL); END_ROWS break;
    case C_TRANSPORT:
        ROWS int code = q && q->transport ? q->transport : r ? r->transport : 0;
        if (code == 0) {
            put_null_var(c, i);
            continue;
        }
        if (code >= N_TRANSPORT_NAMES) {
            PyErr_Format(PyExc_ValueError, "transport code %d is not in probe.model TRANSPORTS", code);
            return -1;
        }
        CHECK(put_text(c, i, TRANSPORT_NAMES[code], strlen(TRANSPORT_NAMES[code]), most));
        END_ROWS break;
    case C_DNSTAP_TYPE:
        ROWS int f = q && q->family ? q->family : r ? r->family : 0;
        if (f == 0) {
            put_null_var(c, i);
            continue;
        }
        if (f >= N_FAMILIES) {
            PyErr_Format(PyExc_ValueError, "dnstap family code %d is not in include/records.h FAMILY_NAMES", f);
            return -1;
        }
        CHECK(put_text(c, i, FAMILY_NAMES[f], strlen(FAMILY_NAMES[f]), most));
        END_ROWS break;
    case C_SERVER_IDENTITY: ROWS CHECK(put_span(c, i, q, r, offsetof(Rec, identity), most)); END_ROWS break;
    case C_NULL: ROWS put_null_var(c, i); END_ROWS break;
    case C_R_RAW:
        ROWS if (r == NULL || r->raw.len == SPAN_NONE)
            put_null_var(c, i);
        else
            CHECK(put_text(c, i, rec_at(r, r->raw), r->raw.len, most));
        END_ROWS break;
    }
    /* (the offsets are int32: written unchecked above, found wrong here before they are used) */
    size_t most_var = c->kind == K_LIST ? 4 * (size_t)INT32_MAX : INT32_MAX;
    if ((c->kind == K_STR || c->kind == K_LIST) && c->var_len > most_var) {
        PyErr_SetString(PyExc_OverflowError, "column data over 2 GiB");
        return -1;
    }
    return 0;
}

/* The Arrow C data interface's array (Arrow's specification, "The Arrow C data interface"): what pyarrow imports
 * (RecordBatch._import_from_c), without a copy, the schema given apart (export/parquet/rows.py). */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};
#endif

/* What an array owns: its buffers (malloc'd) and its children. Each array owns its own, so that Arrow may move a
 * child out and release it alone; release only calls free, so that it is right in whichever thread drops the last
 * reference to the data, without the GIL. */
typedef struct {
    const void *buffers[3];
    struct ArrowArray **children;
    struct ArrowArray *child;
} Owned;

static void release_array(struct ArrowArray *a)
{
    Owned *owned = a->private_data;
    for (int64_t k = 0; k < a->n_children; k++) {
        if (owned->child[k].release != NULL) /* (NULL: moved out by the consumer, or never made) */
            owned->child[k].release(&owned->child[k]);
    }
    for (int64_t k = 0; k < a->n_buffers; k++)
        free((void *)owned->buffers[k]);
    free(owned->children);
    free(owned->child);
    free(owned);
    a->release = NULL;
}

/* Array a, with its buffers (NULL: set by the caller, which hands them over) and its children (released: filled by
 * the caller). -1 with an exception. */
static int start_array(struct ArrowArray *a, int64_t length, int64_t nulls, int n_buffers, int n_children)
{
    Owned *owned = calloc(1, sizeof *owned);
    struct ArrowArray **children = calloc(n_children ? n_children : 1, sizeof *children);
    struct ArrowArray *child = calloc(n_children ? n_children : 1, sizeof *child);
    if (owned == NULL || children == NULL || child == NULL) {
        free(owned);
        free(children);
        free(child);
        PyErr_NoMemory();
        return -1;
    }
    for (int k = 0; k < n_children; k++)
        children[k] = &child[k];
    owned->children = children;
    owned->child = child;
    *a = (struct ArrowArray){.length = length, .null_count = nulls, .n_buffers = n_buffers, .n_children = n_children,
                             .buffers = owned->buffers, .children = children, .release = release_array,
                             .private_data = owned};
    return 0;
}

/* malloc of at least a byte (a buffer of no rows is still a pointer Arrow reads nothing through). */
static void *alloc(size_t n)
{
    return malloc(n ? n : 1);
}

static void free_cols(Col *cols, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; cols != NULL && k < n; k++) {
        free(cols[k].bits);
        free(cols[k].out);
        free(cols[k].var);
        PyMem_Free(cols[k].memo);
    }
    PyMem_Free(cols);
}

/* Bytes of column c's data for n rows. */
static size_t data_size(const Col *c, Py_ssize_t n)
{
    return c->kind == K_I64 || c->kind == K_F64 ? 8 * (size_t)n
           : c->kind == K_I32                  ? 4 * (size_t)n
           : c->kind == K_BOOL                 ? ((size_t)n + 7) / 8
                                               : 4 * ((size_t)n + 1);
}

/* Column c (`name`): its source and kind, and its buffers for `rows` rows (data's first offset 0: the rest is
 * written chunk by chunk). -1 with an exception. */
static int start_column(Col *c, PyObject *name, Py_ssize_t rows)
{
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    int found = -1;
    for (int j = 0; s != NULL && j < N_KNOWN && found < 0; j++) {
        if (strcmp(COLUMNS[j].name, s) == 0)
            found = j;
    }
    if (found < 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "no Parquet column %R in the record pass", name);
        return -1;
    }
    c->source = COLUMNS[found].source;
    c->kind = COLUMNS[found].kind;
    c->rows = rows;
    c->out = alloc(data_size(c, rows));
    c->bits = alloc(((size_t)rows + 7) / 8);
    if (c->out == NULL || c->bits == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (c->kind == K_STR || c->kind == K_LIST)
        memset(c->out, 0, 4);
    if ((c->source == C_SRC || c->source == C_DST)
        && (c->memo = PyMem_Calloc(1 << ADDRESS_MEMO_BITS, sizeof *c->memo)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Room in column c's data and validity for `rows` rows (the late rows' stream grows as they come). */
static int room_for_rows(Col *c, Py_ssize_t rows)
{
    if (rows <= c->rows)
        return 0;
    Py_ssize_t cap = Py_MAX(rows, 2 * c->rows);
    char *out = realloc(c->out, data_size(c, cap));
    if (out != NULL)
        c->out = out;
    char *bits = out == NULL ? NULL : realloc(c->bits, ((size_t)cap + 7) / 8);
    if (bits == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    c->bits = bits;
    c->rows = cap;
    return 0;
}

/* Column c's n rows as Arrow's array a (empty, released), its buffers handed over. -1 with an exception. */
static int to_arrow(Col *c, Py_ssize_t n, struct ArrowArray *a)
{
    if ((c->kind == K_STR || c->kind == K_LIST) && c->var == NULL && var_grow(c, 1, 0) < 0)
        return -1;
    /* Room made for more rows than written given back (the rows on time of a batch of mostly late ones: a table
     * waits for its row group's other rows, a flood of unanswered queries would hold that room long). */
    if (c->var_cap > c->var_len + ((size_t)1 << 16)) {
        char *var = realloc(c->var, c->var_len ? c->var_len : 1);
        if (var != NULL)
            c->var = var;
    }
    if (c->rows > n + n / 4 + CHUNK) {
        char *out = realloc(c->out, data_size(c, n) ? data_size(c, n) : 1);
        char *bits = out == NULL ? NULL : realloc(c->bits, n ? ((size_t)n + 7) / 8 : 1);
        if (out != NULL)
            c->out = out;
        if (bits != NULL)
            c->bits = bits;
    }
    if (start_array(a, n, c->nulls, c->kind == K_STR ? 3 : 2, c->kind == K_LIST) < 0)
        return -1;
    Owned *owned = a->private_data;
    if (c->kind == K_LIST) {
        if (start_array(&owned->child[0], (int64_t)(c->var_len / 4), 0, 2, 0) < 0)
            return -1;
        ((Owned *)owned->child[0].private_data)->buffers[1] = c->var;
        c->var = NULL;
    }
    if (c->nulls == 0) /* (no validity: every row valid) */
        free(c->bits);
    owned->buffers[0] = c->nulls ? c->bits : NULL;
    owned->buffers[1] = c->out;
    if (c->kind == K_STR)
        owned->buffers[2] = c->var;
    c->bits = c->out = NULL;
    if (c->kind == K_STR)
        c->var = NULL;
    return 0;
}

/* The rows of one table: its columns, the chunk being gathered, the rows written. */
typedef struct {
    Col *cols;
    Rows w;
    Py_ssize_t n;
} Stream;

static int start_stream(Stream *s, PyObject *seq, Py_ssize_t ncols, Py_ssize_t rows)
{
    s->w.most = rows;
    if ((s->cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Col))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < ncols; k++) {
        if (start_column(&s->cols[k], PySequence_Fast_GET_ITEM(seq, k), rows) < 0)
            return -1;
    }
    return 0;
}

/* The stream's gathered chunk, written to its columns. */
static int write_chunk(Stream *s, Py_ssize_t ncols)
{
    Rows *w = &s->w;
    w->lo = s->n;
    for (Py_ssize_t k = 0; k < ncols && w->n; k++) {
        if (room_for_rows(&s->cols[k], s->n + w->n) < 0)
            return -1;
        start_chunk(&s->cols[k], w);
        if (fill(&s->cols[k], w) < 0)
            return -1;
    }
    s->n += w->n;
    w->n = 0;
    return 0;
}

#define PREFETCH_AHEAD 8

/* Transactions from *next on, each to its stream's chunk (apart: the late ones, a query without response, not
 * malformed, exported once the query timed out, to streams[1]; the others to streams[0]), until a chunk is full or
 * the batch ends. One look at each transaction selects its stream, as its chunk is gathered. */
static void gather(Stream *streams, int apart, const TxBatch *txs, Py_ssize_t *next)
{
    Py_ssize_t j = *next;
    for (int full = 0; !full && j < txs->txs.n; j++) {
        const TxHead *t = txbatch_get(txs, j);
        /* Prefetched: the transactions' sizes vary, the hardware's stride prefetch misses them. The header of the
         * transaction 2 * PREFETCH_AHEAD on, then, once it has come, the whole transaction. */
        if (j + 2 * PREFETCH_AHEAD < txs->txs.n)
            __builtin_prefetch(txbatch_get(txs, j + 2 * PREFETCH_AHEAD));
        if (j + PREFETCH_AHEAD < txs->txs.n) {
            const char *ahead = (const char *)txbatch_get(txs, j + PREFETCH_AHEAD);
            for (uint32_t at = 64; at < ((const TxHead *)ahead)->size; at += 64)
                __builtin_prefetch(ahead + at);
        }
        const Rec *q = tx_query(t), *r = tx_response(t);
        Rows *w = &streams[apart && q != NULL && r == NULL && !q->malformed].w;
        w->t[w->n] = t;
        w->q[w->n] = q;
        w->r[w->n] = r;
        w->m[w->n] = q ? q : r;
        full = ++w->n == CHUNK;
    }
    *next = j;
}

static void free_array_capsule(PyObject *capsule)
{
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a != NULL && a->release != NULL) /* (released: imported, moved to Arrow) */
        a->release(a);
    free(a);
}

/* The stream's rows as (capsule, address) of a struct array of its columns, the capsule owning it until it is
 * imported (then only the struct's memory). */
static PyObject *stream_result(Stream *s, Py_ssize_t ncols)
{
    struct ArrowArray *a = calloc(1, sizeof *a);
    if (a == NULL)
        return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(a, "arrow_array", free_array_capsule), *address = NULL, *result = NULL;
    if (capsule == NULL) {
        free(a);
        return NULL;
    }
    if (start_array(a, s->n, 0, 1, (int)ncols) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < ncols; k++) {
        if (to_arrow(&s->cols[k], s->n, &((Owned *)a->private_data)->child[k]) < 0)
            goto done;
    }
    if ((address = PyLong_FromVoidPtr(a)) != NULL)
        result = PyTuple_Pack(2, capsule, address);
done:
    Py_XDECREF(address);
    Py_DECREF(capsule);
    return result;
}

static PyObject *parquet_arrays(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"txs", "names", "apart", NULL};
    TxBatch *txs;
    PyObject *names;
    int apart = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|p:parquet_arrays", keywords, records->txbatch_type, &txs,
                                     &names, &apart))
        return NULL;
    PyObject *seq = PySequence_Fast(names, "names must be a sequence");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) > INT32_MAX) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "too many columns");
    }
    /* The rows on time: buffers for every transaction's row; the late ones (few): a chunk's, grown as they come. */
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq), next = 0;
    int nstreams = apart ? 2 : 1;
    PyObject *result = NULL;
    Stream *streams = PyMem_Calloc(2, sizeof *streams);
    if (streams == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int k = 0; k < nstreams; k++) {
        if (start_stream(&streams[k], seq, ncols, k ? CHUNK : txs->txs.n) < 0)
            goto done;
    }
    while (next < txs->txs.n) {
        gather(streams, apart, txs, &next);
        for (int k = 0; k < nstreams; k++) {
            if (streams[k].w.n == CHUNK && write_chunk(&streams[k], ncols) < 0)
                goto done;
        }
    }
    for (int k = 0; k < nstreams; k++) {
        if (write_chunk(&streams[k], ncols) < 0)
            goto done;
    }
    result = PyList_New(nstreams);
    for (int k = 0; result != NULL && k < nstreams; k++) {
        PyObject *item = stream_result(&streams[k], ncols);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, k, item);
    }
done:
    for (int k = 0; streams != NULL && k < 2; k++)
        free_cols(streams[k].cols, ncols);
    PyMem_Free(streams);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"parquet_arrays", (PyCFunction)(void (*)(void))parquet_arrays, METH_VARARGS | METH_KEYWORDS,
     "parquet_arrays(txs, names, apart=False) -> [(capsule, address)]: the named Parquet columns of the TxBatch's "
     "rows as an Arrow C data interface struct array (pyarrow.RecordBatch._import_from_c(address, schema)), one "
     "for every row, or apart two: the rows on time, then the late ones (queries without response that are not "
     "malformed)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__parquetrec(void)
{
    return records_import() < 0 ? NULL : ext_module("export.parquet._parquetrec", NULL, methods, NULL, NULL, NULL);
}
