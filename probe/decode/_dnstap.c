/* probe.decode._dnstap: the dnstap decoder's loop (probe/decode/dnstap.py DnstapDecoder._run) in C.
 *
 * Why: the Python decoder spent most of its time neither in protobuf's parser (upb) nor in the DNS walker
 * but in making a Python object for each field it read and in the interpreter around them (figures:
 * docs/performance.md). Here the protobuf wire format is read in place for the fields the mapping needs, and
 * each message becomes a message record (include/records.h) written by the packet decoder's record writer
 * (probe/decode/_decoderec.c, its C API include/decoderec_api.h: the one DNS walker), with no Python object per
 * message: the scope, origin, transport and server identity are record fields. It is a translation of the
 * Python decoder, rule for rule, which stays the reference (and the fallback); tests/decode/test_dnstap_c.py
 * checks that both give equal messages (the records read back as tuples), and that this reader accepts and
 * refuses exactly the bytes upb accepts and refuses, on real and on mutated frames.
 *
 * Protobuf as upb reads proto2 (dnstap.proto): a field's last occurrence wins; a message field seen twice
 * is merged; a known field with another wire type, an enum value outside its enum, and any other field
 * (groups included) are unknown fields, skipped but checked for well-formedness; field number 0 (but inside a
 * group) or above 2^29-1, a truncated value, an end-group without its start, wire types 6 and 7, and nesting (messages and
 * groups) deeper than 100 are errors. A Policy is checked, not read. Required fields are not enforced.
 *
 * decode(spans, producer, out, counts, type_counts, types, keep4, keep6, keep_raw) -> (stop, max_ts)
 *   DnstapDecoder._run over the frames of a probe.model.DataFrames (its spans: (buffer, start, end, count), whole
 *   Frame Streams data frames walked in place) of one producer (its name, a str): the message records are
 *   appended to the MsgBatch out, counts (a list in the order of dnstap.COUNTS) and type_counts (a list indexed by
 *   message type) added to. types: a tuple indexed by message type of (selected, family, response) or None;
 *   keep4, keep6: the IP lists' callables (client address, server address) -> keep, or None; keep_raw: fill the
 *   raw field. It stops at the first frame protobuf refuses: stop is its index (-1 when none), left with its
 *   counters to the Python loop; max_ts is the latest message time seen (0: none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "decoderec_api.h"
#include "records.h"

static const DecoderecApi *writer; /* the record writer of probe.decode._decoderec */

/* dnstap.COUNTS, in its order (the tests compare them with COUNT_NAMES). */
enum { C_FRAMES, C_DECODE_ERRORS, C_DISCARDED, C_NOT_MESSAGE, C_UNKNOWN_TYPE, C_FILTERED, C_NO_TIME, C_NO_DNS,
       C_BAD_ADDRESS, C_EMBEDDED, C_IP_FILTERED, C_MESSAGES, C_QUERIES, C_RESPONSES, C_MALFORMED, N_COUNTS };
static const char *COUNT_NAMES[N_COUNTS] = {
    "dnstap_frames", "dnstap_decode_errors", "dnstap_frames_discarded", "dnstap_not_message",
    "dnstap_unknown_type", "dnstap_filtered", "dnstap_no_time", "dnstap_no_dns", "dnstap_bad_address",
    "dnstap_embedded_queries", "ip_filtered", "dns_messages", "queries", "responses", "malformed"};

#define N_TYPES 15   /* dnstap Message.Type 1..14 */
#define FIELD_MAX 536870911u /* 2^29 - 1: protobuf's largest field number */
#define DEPTH 100            /* upb's nesting limit (messages and groups) */
#define NS 1000000000ull
#define TS_MAX 9223372036854775807ull /* later times do not fit int64 nanoseconds */
#define TRANSPORT_DOH 4
#define HTTP3 3

/* IP protocol by transport (probe.model TRANSPORTS; the tests compare them) */
static const int PROTO_OF[8] = {0, 17, 6, 6, 6, 17, 6, 17};

typedef struct {
    const uint8_t *p; /* NULL: the field is absent (a present one points into its frame, even when empty) */
    uint32_t n;       /* (within a frame, whose length is 32 bits) */
} Bytes;

/* What the mapping reads of one frame. Small (120 bytes) and zeroed per frame: a larger one was zeroed by
 * `rep stos`, whose start-up cost was a seventh of the decoder's time (perf). */
typedef struct {
    uint64_t qsec, rsec;
    Bytes identity, qaddr, raddr, qmsg, rmsg;
    uint32_t qnsec, rnsec, qport, rport;
    uint8_t dnstap_type, has_message;
    uint8_t type, family, protocol, http; /* 0: absent (or outside the enum) */
    uint8_t has_qsec, has_rsec;
} Frame;

/* ---------------------------------------------------------------------------------------------
 * The wire format */

/* A varint of at most max_bytes bytes (a value: 10; a key or a length: 5, as upb reads them: it refuses a
 * longer encoding even of a small number, found by fuzzing). */
static inline int varint_of(const uint8_t **pp, const uint8_t *end, uint64_t *out, int max_bytes)
{
    const uint8_t *p = *pp;
    if (p < end && !(*p & 0x80)) { /* one byte: every key and length of a dnstap message, most values */
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
        if (p >= end)
            return -1;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift; /* bits beyond 64 are dropped, as upb drops them */
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

static inline int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    return varint_of(pp, end, out, 10);
}

/* A key or a length. */
static inline int varint5(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    return varint_of(pp, end, out, 5);
}

/* A field's key; in_group: inside a group, where upb takes field number 0 (found by fuzzing: a message it
 * refuses there, at any depth of groups, it accepts). */
static inline int key_of(const uint8_t **pp, const uint8_t *end, uint64_t *field, int *wt, int in_group)
{
    uint64_t k;
    if (varint5(pp, end, &k))
        return -1;
    *field = k >> 3;
    *wt = (int)(k & 7);
    return (*field == 0 && !in_group) || *field > FIELD_MAX ? -1 : 0;
}

static int key(const uint8_t **pp, const uint8_t *end, uint64_t *field, int *wt)
{
    return key_of(pp, end, field, wt, 0);
}

static int skip(const uint8_t **pp, const uint8_t *end, int wt, uint64_t field, int depth);

/* The fields of a group up to its end tag (the same field number). */
static int skip_group(const uint8_t **pp, const uint8_t *end, uint64_t field, int depth)
{
    if (depth < 1)
        return -1;
    while (*pp < end) {
        uint64_t f;
        int wt;
        if (key_of(pp, end, &f, &wt, 1))
            return -1;
        if (wt == 4)
            return f == field ? 0 : -1;
        if (skip(pp, end, wt, f, depth - 1))
            return -1;
    }
    return -1;
}

/* Skip one value of wire type wt (of field `field`); -1 when malformed. */
static int skip(const uint8_t **pp, const uint8_t *end, int wt, uint64_t field, int depth)
{
    uint64_t v;
    switch (wt) {
    case 0:
        return varint(pp, end, &v);
    case 1:
        if (end - *pp < 8)
            return -1;
        *pp += 8;
        return 0;
    case 2:
        if (varint5(pp, end, &v) || v > (uint64_t)(end - *pp))
            return -1;
        *pp += v;
        return 0;
    case 3:
        return skip_group(pp, end, field, depth);
    case 5:
        if (end - *pp < 4)
            return -1;
        *pp += 4;
        return 0;
    default: /* an end-group without its start, 6, 7 */
        return -1;
    }
}

/* A message whose fields are not read (Policy): well-formed or not. */
static int check_fields(const uint8_t *p, const uint8_t *end, int depth)
{
    while (p < end) {
        uint64_t f;
        int wt;
        if (key(&p, end, &f, &wt) || skip(&p, end, wt, f, depth))
            return -1;
    }
    return 0;
}

static inline int len_delimited(const uint8_t **pp, const uint8_t *end, Bytes *s)
{
    uint64_t v;
    if (varint5(pp, end, &v) || v > (uint64_t)(end - *pp))
        return -1;
    s->p = *pp;
    s->n = (uint32_t)v;
    *pp += v;
    return 0;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* An enum's value as upb reads it (int32), kept when inside 1..max, else unknown (*out unchanged). */
static void enum_value(uint64_t v, int max, uint8_t *out)
{
    int32_t e = (int32_t)(uint32_t)v;
    if (e >= 1 && e <= max)
        *out = (uint8_t)e;
}

#define KEY(field, wt) ((uint64_t)(field) << 3 | (wt))

/* A varint field's value into *out; -1 when malformed. */
#define VARINT_TO(out)                  \
    do {                                \
        if (varint(&p, end, &v))        \
            return -1;                  \
        out;                            \
    } while (0)

static int decode_message(const uint8_t *p, const uint8_t *end, Frame *f, int depth)
{
    while (p < end) {
        uint64_t field, v;
        int wt;
        if (key(&p, end, &field, &wt))
            return -1;
        switch (KEY(field, wt)) { /* a known field with another wire type is an unknown field: skipped */
        case KEY(1, 0): VARINT_TO(enum_value(v, 14, &f->type)); break;
        case KEY(2, 0): VARINT_TO(enum_value(v, 2, &f->family)); break;
        case KEY(3, 0): VARINT_TO(enum_value(v, 7, &f->protocol)); break;
        case KEY(6, 0): VARINT_TO(f->qport = (uint32_t)v); break;
        case KEY(7, 0): VARINT_TO(f->rport = (uint32_t)v); break;
        case KEY(8, 0): VARINT_TO((f->qsec = v, f->has_qsec = 1)); break;
        case KEY(12, 0): VARINT_TO((f->rsec = v, f->has_rsec = 1)); break;
        case KEY(16, 0): VARINT_TO(enum_value(v, 3, &f->http)); break;
        case KEY(9, 5):
        case KEY(13, 5):
            if (end - p < 4)
                return -1;
            *(field == 9 ? &f->qnsec : &f->rnsec) = le32(p);
            p += 4;
            break;
        case KEY(4, 2): if (len_delimited(&p, end, &f->qaddr)) return -1; break;
        case KEY(5, 2): if (len_delimited(&p, end, &f->raddr)) return -1; break;
        case KEY(10, 2): if (len_delimited(&p, end, &f->qmsg)) return -1; break;
        case KEY(14, 2): if (len_delimited(&p, end, &f->rmsg)) return -1; break;
        case KEY(15, 2): {
            Bytes policy;
            if (len_delimited(&p, end, &policy) || depth < 1
                || check_fields(policy.p, policy.p + policy.n, depth - 1))
                return -1;
            break;
        }
        default:
            if (skip(&p, end, wt, field, depth))
                return -1;
        }
    }
    return 0;
}

/* The fields of a Dnstap message the mapping reads; -1 where upb refuses the bytes. */
static int decode_frame(const uint8_t *p, const uint8_t *end, Frame *f)
{
    static const Frame empty;
    *f = empty;
    int depth = DEPTH;
    while (p < end) {
        uint64_t field, v;
        int wt;
        if (key(&p, end, &field, &wt))
            return -1;
        if (wt == 2 && field == 1) {
            if (len_delimited(&p, end, &f->identity))
                return -1;
        } else if (wt == 2 && field == 14) {
            Bytes m;
            if (len_delimited(&p, end, &m) || depth < 1 || decode_message(m.p, m.p + m.n, f, depth - 1))
                return -1;
            f->has_message = 1;
        } else if (wt == 0 && field == 15) {
            if (varint(&p, end, &v))
                return -1;
            enum_value(v, 1, &f->dnstap_type);
        } else if (skip(&p, end, wt, field, depth)) {
            return -1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The mapping (DnstapDecoder._message) */

typedef struct {
    MsgBatch *out;
    PyObject *types, *keep4, *keep6;
    const char *producer; /* its UTF-8 text */
    Py_ssize_t producer_len;
    int keep_raw;
    uint8_t selected[N_TYPES], response[N_TYPES]; /* types' (selected, _, response), read once per call */
    MsgNet net; /* the record's network part: its constant fields set once per call, the others per message */
    long long counts[N_COUNTS], type_counts[N_TYPES];
    unsigned long long max_ts;
} Run;

static PyObject *bytes_of(const Bytes *s)
{
    return PyBytes_FromStringAndSize((const char *)s->p, s->n);
}

/* sec and nsec make a time of at most TS_MAX ns (nsec below a second) */
static int time_ok(uint64_t sec, uint32_t nsec)
{
    return nsec < NS && sec <= TS_MAX / NS && sec * NS + nsec <= TS_MAX;
}

/* The IP lists' verdict on the client and server addresses: 1 keep, 0 drop, -1 error. */
static int keep(PyObject *fn, const Bytes *client, const Bytes *server)
{
    PyObject *qa = bytes_of(client), *ra = bytes_of(server);
    PyObject *r = qa && ra ? PyObject_CallFunctionObjArgs(fn, qa, ra, NULL) : NULL;
    Py_XDECREF(qa);
    Py_XDECREF(ra);
    if (r == NULL)
        return -1;
    int yes = PyObject_IsTrue(r);
    Py_DECREF(r);
    return yes;
}

/* The identity's text, as identity.decode("utf-8", "replace") (ASCII, nearly always, as it is; else through
 * Python's decoder, held in *obj). -1 with an exception. */
static int identity_text(const Bytes *id, MsgNet *net, PyObject **obj)
{
    uint64_t high = 0, w; /* the high bits of every byte, 8 at a time (the last 8 overlapping the others) */
    Py_ssize_t i = 0, len = id->n;
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, id->p + i, 8);
        high |= w;
    }
    if (i < len && len >= 8) {
        memcpy(&w, id->p + len - 8, 8);
        high |= w;
    } else {
        for (; i < len; i++)
            high |= id->p[i];
    }
    if (!(high & 0x8080808080808080ull)) {
        net->identity = (const char *)id->p;
        net->identity_len = (size_t)id->n;
        return 0;
    }
    *obj = PyUnicode_DecodeUTF8((const char *)id->p, id->n, "replace");
    Py_ssize_t n;
    net->identity = *obj ? PyUnicode_AsUTF8AndSize(*obj, &n) : NULL;
    if (net->identity == NULL)
        return -1;
    net->identity_len = (size_t)n;
    return 0;
}

/* DnstapDecoder._ends: the IP version (0: None), or -1 when an address does not fit it or a port is too big. */
static int ends(const Frame *f)
{
    int ipv = 0;
    if (f->family) {
        ipv = f->family == 1 ? 4 : 6;
    } else {
        const Bytes *a = f->qaddr.n ? &f->qaddr : f->raddr.n ? &f->raddr : NULL;
        if (a != NULL) {
            if (a->n != 4 && a->n != 16)
                return -1;
            ipv = a->n == 4 ? 4 : 6;
        }
    }
    Py_ssize_t want = ipv == 4 ? 4 : 16;
    if ((f->qaddr.n && f->qaddr.n != want) || (f->raddr.n && f->raddr.n != want) || f->qport > 65535
        || f->rport > 65535)
        return -1;
    return ipv;
}

/* The IP protocol of the frame's transport (0: none), as DnstapDecoder._message: DoH over HTTP/3 is UDP. */
static int proto_of(const Frame *f)
{
    if (!f->protocol)
        return 0;
    return f->protocol == TRANSPORT_DOH && f->http == HTTP3 ? 17 : PROTO_OF[f->protocol];
}

/* The records of frame f's message (the query it carries first) appended to run->out, or the frame counted as
 * dropped. -1: error. */
static int map_frame(Run *run, const Frame *f)
{
    if (!f->dnstap_type || !f->has_message) {
        run->counts[C_NOT_MESSAGE]++;
        return 0;
    }
    if (!f->type) {
        run->counts[C_UNKNOWN_TYPE]++;
        return 0;
    }
    run->type_counts[f->type]++;
    if (!run->selected[f->type]) {
        run->counts[C_FILTERED]++;
        return 0;
    }
    int response = run->response[f->type];
    int has_time = response ? f->has_rsec : f->has_qsec;
    uint64_t sec = response ? f->rsec : f->qsec;
    uint32_t nsec = response ? f->rnsec : f->qnsec;
    if (!has_time || !time_ok(sec, nsec)) {
        run->counts[C_NO_TIME]++;
        return 0;
    }
    const Bytes *dns = response ? &f->rmsg : &f->qmsg;
    if (dns->p == NULL) {
        run->counts[C_NO_DNS]++;
        return 0;
    }
    int ipv = ends(f);
    if (ipv < 0) {
        run->counts[C_BAD_ADDRESS]++;
        return 0;
    }
    PyObject *keep_fn = ipv == 4 ? run->keep4 : ipv == 6 ? run->keep6 : Py_None;
    if (keep_fn != Py_None && f->qaddr.n && f->raddr.n) {
        int yes = keep(keep_fn, &f->qaddr, &f->raddr);
        if (yes <= 0) {
            run->counts[C_IP_FILTERED] += yes == 0;
            return yes;
        }
    }
    unsigned long long ts = sec * NS + nsec;
    if (ts > run->max_ts)
        run->max_ts = ts;
    const unsigned char *qa = f->qaddr.n ? f->qaddr.p : NULL, *ra = f->raddr.n ? f->raddr.p : NULL;
    int32_t qp = f->qport ? (int32_t)f->qport : -1, rp = f->rport ? (int32_t)f->rport : -1;
    /* Each field that varies set here, the others once by init_net (no per-message zeroing of the whole). The
     * message family's code is the type's pair: probe.decode.dnstap_types FAMILIES (the tests check it). */
    MsgNet *net = &run->net;
    net->ts = (int64_t)ts;
    net->ipv = ipv;
    net->proto = proto_of(f);
    net->transport = f->protocol;
    net->src = qa, net->dst = ra, net->sport = qp, net->dport = rp;
    net->family = (f->type + 1) / 2;
    net->query_copy = 0;
    net->identity = NULL;
    net->identity_len = 0;
    PyObject *text = NULL;
    if (f->identity.n && identity_text(&f->identity, net, &text) < 0)
        return -1;
    net->scope_name = net->identity ? net->identity : run->producer;
    net->scope_name_len = net->identity ? net->identity_len : (size_t)run->producer_len;
    int32_t flags;
    int malformed, rc = 0;
    if (response && f->qmsg.p != NULL) {
        run->counts[C_EMBEDDED]++;
        if (f->has_qsec && time_ok(f->qsec, f->qnsec))
            net->ts = (int64_t)(f->qsec * NS + f->qnsec);
        net->query_copy = 1;
        rc = writer->put_record(run->out, net, f->qmsg.p, f->qmsg.n, run->keep_raw, &flags, &malformed);
        net->ts = (int64_t)ts;
        net->query_copy = 0;
    }
    if (rc == 0 && response) { /* server -> client */
        net->src = ra, net->dst = qa, net->sport = rp, net->dport = qp;
    }
    if (rc == 0)
        rc = writer->put_record(run->out, net, dns->p, dns->n, run->keep_raw, &flags, &malformed);
    Py_XDECREF(text);
    if (rc < 0)
        return -1;
    run->counts[C_MESSAGES]++;
    run->counts[flags >= 0 && (flags & 0x8000) ? C_RESPONSES : C_QUERIES]++;
    run->counts[C_MALFORMED] += malformed;
    return 0;
}

/* counts[k] += add[k] (Python ints). */
static int add_counts(PyObject *counts, const long long *add, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!add[k])
            continue;
        PyObject *old = PyList_GetItem(counts, k);
        PyObject *inc = old ? PyLong_FromLongLong(add[k]) : NULL;
        PyObject *sum = inc ? PyNumber_Add(old, inc) : NULL;
        Py_XDECREF(inc);
        if (sum == NULL || PyList_SetItem(counts, k, sum) < 0)
            return -1;
    }
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* One frame: decoded, mapped and counted. 1: protobuf refuses it; -1: error. */
static int run_frame(Run *run, const uint8_t *p, Py_ssize_t n)
{
    Frame f;
    if (decode_frame(p, p + n, &f) < 0)
        return 1;
    run->counts[C_FRAMES]++;
    return map_frame(run, &f);
}

/* The frames of one span (buffer, start, end, count) of a DataFrames; *index counts
 * the frames passed. 1: stopped at a frame protobuf refuses (*index is its index); -1: error. */
static int run_span(Run *run, PyObject *span, Py_ssize_t *index)
{
    PyObject *buf;
    Py_ssize_t start, end, count;
    if (!PyTuple_Check(span) || !PyArg_ParseTuple(span, "O!nnn:span", &PyBytes_Type, &buf, &start, &end, &count))
        return -1;
    Py_ssize_t size = PyBytes_GET_SIZE(buf);
    if (start < 0 || end > size || start > end) {
        PyErr_SetString(PyExc_ValueError, "a span outside its buffer");
        return -1;
    }
    Py_INCREF(buf); /* the span's tuple is the caller's; the IP lists' callables may run any Python code */
    const uint8_t *base = (const uint8_t *)PyBytes_AS_STRING(buf), *p = base + start, *stop = base + end;
    int rc = 0;
    while (p < stop) {
        if (stop - p < 4 || be32(p) > (uint64_t)(stop - p - 4)) {
            PyErr_SetString(PyExc_ValueError, "a span that is not whole data frames");
            rc = -1;
            break;
        }
        Py_ssize_t n = be32(p);
        rc = run_frame(run, p + 4, n);
        if (rc != 0)
            break;
        p += 4 + n;
        ++*index;
    }
    Py_DECREF(buf);
    return rc;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *spans, *counts, *type_counts, *producer;
    Run run;
    memset(&run, 0, sizeof run);
    if (!PyArg_ParseTuple(args, "O!UO!O!O!O!OOp:decode", &PyList_Type, &spans, &producer, records->msgbatch_type,
                          &run.out, &PyList_Type, &counts, &PyList_Type, &type_counts, &PyTuple_Type, &run.types,
                          &run.keep4, &run.keep6, &run.keep_raw))
        return NULL;
    if (PyList_GET_SIZE(counts) != N_COUNTS || PyList_GET_SIZE(type_counts) != N_TYPES
        || PyTuple_GET_SIZE(run.types) != N_TYPES) {
        PyErr_SetString(PyExc_ValueError, "counts, type_counts or types of the wrong length");
        return NULL;
    }
    for (Py_ssize_t t = 1; t < N_TYPES; t++) {
        PyObject *info = PyTuple_GET_ITEM(run.types, t);
        if (!PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 3) {
            PyErr_SetString(PyExc_ValueError, "types: (selected, family, response) for every type 1..14");
            return NULL;
        }
        run.selected[t] = PyTuple_GET_ITEM(info, 0) == Py_True;
        run.response[t] = PyTuple_GET_ITEM(info, 2) == Py_True;
    }
    /* what a dnstap message never has: frame length, TTL, UDP checksum, VLAN, RTT (None) */
    run.net.wirelen = -1;
    run.net.ttl = run.net.udp_sum = run.net.vlan = -1;
    /* (surrogatepass: a file's name that is not UTF-8 has surrogates in Python; _records reads it back so) */
    PyObject *name = PyUnicode_AsEncodedString(producer, "utf-8", "surrogatepass");
    if (name == NULL)
        return NULL;
    run.producer = PyBytes_AS_STRING(name);
    run.producer_len = PyBytes_GET_SIZE(name);
    Py_INCREF(spans);
    Py_ssize_t index = 0;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyList_GET_SIZE(spans); i++) {
        PyObject *span = PyList_GET_ITEM(spans, i);
        Py_INCREF(span);
        rc = run_span(&run, span, &index);
        Py_DECREF(span);
    }
    Py_DECREF(spans);
    Py_DECREF(name);
    /* An error (an IP list's callable raised, a span refused): its exception goes up as it is, the counts not
     * added (no more calls into Python with an exception set; the Python loop's own counts are lost too). */
    if (rc < 0 || add_counts(counts, run.counts, N_COUNTS) < 0
        || add_counts(type_counts, run.type_counts, N_TYPES) < 0)
        return NULL;
    return Py_BuildValue("(nK)", rc ? index : (Py_ssize_t)-1, run.max_ts);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(spans, producer, out, counts, type_counts, types, keep4, keep6, keep_raw) -> (stop, max_ts): "
     "DnstapDecoder._run in C, writing message records into the MsgBatch out (see the module source)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__dnstap(void)
{
    if (records_import() < 0)
        return NULL;
    writer = ext_import_capsule("probe.decode._decoderec", DECODEREC_CAPSULE);
    if (writer == NULL)
        return NULL;
    if (writer->version != DECODEREC_API_VERSION) {
        PyErr_SetString(PyExc_ImportError, "probe.decode._decoderec has another C API version: rebuild both");
        return NULL;
    }
    PyObject *mod = ext_module("probe.decode._dnstap", "The dnstap decoder's loop, in C.", methods, NULL, NULL, NULL);
    if (mod == NULL)
        return NULL;
    PyObject *names = PyTuple_New(N_COUNTS), *protos = PyTuple_New(8);
    for (int k = 0; names != NULL && k < N_COUNTS; k++)
        ext_set_item(&names, k, PyUnicode_FromString(COUNT_NAMES[k]));
    for (int k = 0; protos != NULL && k < 8; k++)
        ext_set_item(&protos, k, PyLong_FromLong(PROTO_OF[k]));
    if (names == NULL || protos == NULL || PyModule_AddObject(mod, "COUNT_NAMES", names) < 0) {
        Py_XDECREF(names);
        Py_XDECREF(protos);
        Py_DECREF(mod);
        return NULL;
    }
    if (PyModule_AddObject(mod, "PROTO_OF", protos) < 0) {
        Py_DECREF(protos);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
