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
 * parquet_columns(txs, names, late=None) -> [(null_count, validity or None, buffers...), ...]
 *   One result per name in `names` (export/parquet/schema.py SCHEMA names but the enrichment ones and answers,
 *   and r_raw: the response's DNS bytes as binary, for the answers column; ValueError for another), with the
 *   buffers of Arrow's layout (fixed width and bool: (data,); strings and binary: (offsets, data); list<int32>:
 *   (offsets, values)). late: None, every transaction's row; true, only the late ones (a query without response,
 *   not malformed: made once the query timed out, match.query_timeout after its time); false, only the others.
 *   (Why here: export.time_order writes the late rows in row groups of their own; selecting them before the
 *   columns exist costs one look at each transaction, not a copy of every row of every column.)
 *
 * Its cost (issue 33): the transactions are read once, a chunk at a time, the late ones selected as the chunk is
 * gathered, and prefetched (their sizes vary: the hardware's stride prefetch does not follow them); the buffers are
 * made for every transaction of the batch and cut to the rows written at the end, and zeroed only where fill does
 * not write every row; an address column keeps the text of 16 addresses (a few servers alternate row to row).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
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
    C_TRANSPORT, C_DNSTAP_TYPE, C_SERVER_IDENTITY, C_R_RAW,
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
    {"server_identity", C_SERVER_IDENTITY, K_STR},
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
    /* bytes objects written in place: data and validity sized for every transaction of the batch (cut to the rows
     * written at the end), var (strings: the text; lists: the int32 values) grown as it fills */
    PyObject *validity, *data, *var_obj;
    char *bits, *out, *var;
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
    if (cap > (size_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    if (c->var_obj == NULL)
        c->var_obj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    else if (_PyBytes_Resize(&c->var_obj, (Py_ssize_t)cap) < 0)
        return -1; /* (var_obj released and NULL) */
    if (c->var_obj == NULL)
        return -1;
    c->var = PyBytes_AS_STRING(c->var_obj);
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
 * identity columns (the query, else the response); the rows of the batch at most (var_grow's first size). */
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

static void free_cols(Col *cols, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(cols[k].validity);
        Py_XDECREF(cols[k].data);
        Py_XDECREF(cols[k].var_obj);
        PyMem_Free(cols[k].memo);
    }
    PyMem_Free(cols);
}

/* The next chunk of rows, from transaction *next on: those that late selects (-1: every one; 1: the late ones, a
 * query without response, not malformed, exported once the query timed out; 0: the others). Selected here, as the
 * chunk is gathered, the transactions are read once, while the chunk's columns are written. */
#define PREFETCH_AHEAD 8

static void next_rows(Rows *w, const TxBatch *txs, Py_ssize_t *next, int late)
{
    Py_ssize_t k = 0, j = *next;
    for (; k < CHUNK && j < txs->txs.n; j++) {
        const TxHead *t = txbatch_get(txs, j);
        /* Prefetched: the transactions' sizes vary, the hardware's stride prefetch misses them. The header of the
         * transaction 2 * PREFETCH_AHEAD on, then, once it has come, the whole transaction. */
        if (j + 2 * PREFETCH_AHEAD < txs->txs.n)
            __builtin_prefetch(txbatch_get(txs, j + 2 * PREFETCH_AHEAD));
        if (late != 1 && j + PREFETCH_AHEAD < txs->txs.n) { /* (the late ones are few: their headers only) */
            const char *ahead = (const char *)txbatch_get(txs, j + PREFETCH_AHEAD);
            for (uint32_t at = 64; at < ((const TxHead *)ahead)->size; at += 64)
                __builtin_prefetch(ahead + at);
        }
        const Rec *q = tx_query(t), *r = tx_response(t);
        if (late >= 0 && (q != NULL && r == NULL && !q->malformed) != late)
            continue;
        w->t[k] = t;
        w->q[k] = q;
        w->r[k] = r;
        w->m[k] = q ? q : r;
        k++;
    }
    *next = j;
    w->n = k;
}

/* Bytes of column c's data for n rows. */
static Py_ssize_t data_size(const Col *c, Py_ssize_t n)
{
    return c->kind == K_I64 || c->kind == K_F64 ? 8 * n
           : c->kind == K_I32                  ? 4 * n
           : c->kind == K_BOOL                 ? (n + 7) / 8
                                               : 4 * (n + 1);
}

/* Column k of `names`: its source and kind, and its buffers for `most` rows (data's first offset 0: the rest is
 * written chunk by chunk). -1 with an exception. */
static int start_column(Col *c, PyObject *name, Py_ssize_t most)
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
    c->data = PyBytes_FromStringAndSize(NULL, data_size(c, most));
    c->validity = PyBytes_FromStringAndSize(NULL, (most + 7) / 8);
    if (c->data == NULL || c->validity == NULL)
        return -1;
    c->out = PyBytes_AS_STRING(c->data);
    c->bits = PyBytes_AS_STRING(c->validity);
    if (c->kind == K_STR || c->kind == K_LIST)
        memset(c->out, 0, 4);
    if ((c->source == C_SRC || c->source == C_DST)
        && (c->memo = PyMem_Calloc(1 << ADDRESS_MEMO_BITS, sizeof *c->memo)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Column c's item of the results: (null count, validity or None, data[, var]), its buffers cut to n rows. */
static PyObject *column_result(Col *c, Py_ssize_t n, Py_ssize_t most)
{
    if (n < most && (_PyBytes_Resize(&c->data, data_size(c, n)) < 0
                     || _PyBytes_Resize(&c->validity, (n + 7) / 8) < 0))
        return NULL;
    if (c->kind != K_STR && c->kind != K_LIST)
        return Py_BuildValue("(nOO)", c->nulls, c->nulls ? c->validity : Py_None, c->data);
    if (c->var_obj == NULL)
        c->var_obj = PyBytes_FromStringAndSize(NULL, 0);
    else if ((size_t)PyBytes_GET_SIZE(c->var_obj) != c->var_len)
        (void)_PyBytes_Resize(&c->var_obj, (Py_ssize_t)c->var_len);
    if (c->var_obj == NULL)
        return NULL;
    return Py_BuildValue("(nOOO)", c->nulls, c->nulls ? c->validity : Py_None, c->data, c->var_obj);
}

static PyObject *parquet_columns(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"txs", "names", "late", NULL};
    TxBatch *txs;
    PyObject *names, *late_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|O:parquet_columns", keywords, records->txbatch_type, &txs,
                                     &names, &late_arg))
        return NULL;
    int late = late_arg == Py_None ? -1 : PyObject_IsTrue(late_arg);
    if (late_arg != Py_None && late < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(names, "names must be a sequence");
    if (seq == NULL)
        return NULL;
    /* The buffers are made for every transaction's row, and cut to the rows selected once they are known. */
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq), most = txs->txs.n, n = 0, next = 0;
    PyObject *result = NULL;
    Col *cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Col));
    Rows *w = PyMem_Malloc(sizeof *w);
    if (cols == NULL || w == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < ncols; k++) {
        if (start_column(&cols[k], PySequence_Fast_GET_ITEM(seq, k), most) < 0)
            goto done;
    }
    w->most = most;
    for (;;) {
        next_rows(w, txs, &next, late);
        if (w->n == 0)
            break;
        w->lo = n;
        for (Py_ssize_t k = 0; k < ncols; k++) {
            start_chunk(&cols[k], w);
            if (fill(&cols[k], w) < 0)
                goto done;
        }
        n += w->n;
    }
    result = PyList_New(ncols);
    for (Py_ssize_t k = 0; result != NULL && k < ncols; k++) {
        PyObject *item = column_result(&cols[k], n, most);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, k, item);
    }
done:
    if (cols != NULL)
        free_cols(cols, ncols);
    PyMem_Free(w);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"parquet_columns", (PyCFunction)(void (*)(void))parquet_columns, METH_VARARGS | METH_KEYWORDS,
     "parquet_columns(txs, names, late=None) -> [(nulls, validity, buffers...)]: the Arrow buffers of the "
     "named Parquet columns of the TxBatch (late: None, every row; true, the rows of late transactions, queries "
     "without response that are not malformed; false, the others)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__parquetrec(void)
{
    return records_import() < 0 ? NULL : ext_module("export.parquet._parquetrec", NULL, methods, NULL, NULL, NULL);
}
