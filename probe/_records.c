/* probe._records: DNS messages as C records (include/records.h) and the batches the C stages pass each other. Its
 * Python reference: the message and transaction tuples of probe/model.py (rec_to_tuple gives exactly them).
 *
 * Why: a message as a tuple of 30 Python objects cost more to allocate, free and read back than to decode. In
 * the columnar pipeline, frames are decoded into records in a MsgBatch (probe.decode._decoderec), matched into
 * a TxBatch (probe.match._matchrec) and written to Parquet from it (export.parquet._parquetrec), with no Python
 * object per message or transaction. This module makes the two batch types, converts between records and the
 * message tuples of probe.model (the frames the Python decoder handles join a batch that way; the tests read
 * batches back as tuples), and gives the other extensions their functions through a capsule.
 *
 * MsgBatch()                 an empty batch; len(b); b.clear(); b.to_tuples() -> [message tuple, ...];
 *                            b.append(t) / b.extend(ts): add message tuples as records; b.counts(start);
 *                            b.last_ts().
 * TxBatch()                  an empty batch; len(b); b.clear(); b.to_tuples(start, stop) -> [(q, r, messages),
 *                            ...] with q and r message tuples or None; b.append((q, r, messages)); b.time_ns(i).
 * Frames()                   a FrameBatch's frames packed (FrameBatch.packed): len(f); f.lists(start, stop) ->
 *                            (ts_ns, wirelen, data); f.add(data, ts_ns, wirelen, tag=0); f.clear(); f.last_ts().
 * utf8_backslashreplace(b)   bytes.decode("utf-8", "backslashreplace"), as UTF-8 bytes, computed here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

#define RECORDS_MODULE
#include "records.h"
#include "valuetext.h"

/* ---------------------------------------------------------------------------------------------
 * Buffers */

/* Room for an item (a record, a transaction) of `bytes`; past 4 GiB an OverflowError: their sizes and offsets are
 * 32-bit. */
static int recbuf_reserve(RecBuf *b, size_t bytes)
{
    if (bytes > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "message record or transaction over 4 GiB");
        return -1;
    }
    if (b->len + bytes <= b->cap)
        return 0;
    char *p = ext_grow(b->buf, &b->cap, b->len + bytes, 1, 1 << 16);
    if (p == NULL)
        return -1;
    b->buf = p;
    return 0;
}

static int recbuf_push(RecBuf *b, size_t start)
{
    if ((size_t)b->n == b->n_cap) {
        size_t *at = ext_grow(b->at, &b->n_cap, b->n_cap + 1, sizeof *at, 1024);
        if (at == NULL)
            return -1;
        b->at = at;
    }
    b->at[b->n++] = start;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Text */

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0: the rules of CPython's decoder (RFC 3629: no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F))
            return 0;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F))
            return 0;
        return 4;
    }
    return 0;
}

/* Each byte that is not part of a valid sequence becomes \xNN, as the backslashreplace handler writes every
 * byte of an error range (a range is a lead byte and continuation bytes, none of which starts a valid
 * sequence, so going on at the next byte gives the same ranges). */
static size_t utf8_backslashreplace(const unsigned char *s, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0, o;
    uint64_t w;
    /* The common case, ASCII: eight bytes at a time as long as no byte has its high bit set. */
    while (i + 8 <= n && (memcpy(&w, s + i, 8), (w & 0x8080808080808080ULL) == 0))
        i += 8;
    memcpy(out, s, i);
    o = i;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        size_t k = utf8_sequence(s + i, n - i);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[s[i] >> 4];
            out[o++] = hex[s[i] & 15];
            i++;
        }
    }
    return o;
}

static PyObject *py_utf8_backslashreplace(PyObject *Py_UNUSED(self), PyObject *arg)
{
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    char *out = PyMem_Malloc(4 * (size_t)v.len + 1);
    if (out == NULL) {
        PyBuffer_Release(&v);
        return PyErr_NoMemory();
    }
    size_t len = utf8_backslashreplace(v.buf, (size_t)v.len, out);
    PyObject *r = PyBytes_FromStringAndSize(out, (Py_ssize_t)len);
    PyMem_Free(out);
    PyBuffer_Release(&v);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Records -> tuples */

static PyObject *int_or_none(int32_t v)
{
    return v < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(v);
}

static PyObject *span_str(const Rec *r, Span s)
{
    if (s.len == SPAN_NONE)
        return Py_NewRef(Py_None);
    return PyUnicode_DecodeUTF8(rec_at(r, s), s.len, "strict");
}

static PyObject *span_bytes(const Rec *r, Span s)
{
    if (s.len == SPAN_NONE)
        return Py_NewRef(Py_None);
    return PyBytes_FromStringAndSize(rec_at(r, s), s.len);
}

static PyObject *edns_tuple(const Rec *r)
{
    PyObject *ede = PyTuple_New(r->e_ede.len);
    const unsigned char *codes = (const unsigned char *)rec_at(r, r->e_ede);
    for (uint32_t k = 0; ede != NULL && k < r->e_ede.len; k++) {
        uint16_t code;
        memcpy(&code, codes + 2 * k, 2);
        ext_set_item(&ede, k, PyLong_FromLong(code));
    }
    if (ede == NULL)
        return NULL;
    PyObject *v[N_EDNS_FIELDS] = {
        [E_UDP_SIZE] = PyLong_FromLong(r->e_udp), [E_VERSION] = PyLong_FromLong(r->e_version),
        [E_DO] = PyBool_FromLong(r->e_do), [E_EXT_RCODE] = PyLong_FromLong(r->e_ext_rcode),
        [E_NSID] = span_str(r, r->e_nsid), [E_DAU] = span_str(r, r->e_dau), [E_DHU] = span_str(r, r->e_dhu),
        [E_N3U] = span_str(r, r->e_n3u), [E_CLIENT_SUBNET] = span_str(r, r->e_ecs),
        [E_OTHER] = span_str(r, r->e_other), [E_EDE] = ede, [E_COOKIE] = PyBool_FromLong(r->e_cookie),
        [E_RDATA] = span_bytes(r, r->e_rdata),
    };
    return tuple_of(v, N_EDNS_FIELDS);
}

static PyObject *query_copy_type; /* probe.model.QueryCopy */
static PyObject *family_str[N_FAMILIES]; /* FAMILY_NAMES as str objects (0: NULL) */

static PyObject *address(const Rec *r, int absent_bit, const uint8_t *a)
{
    if (r->absent & absent_bit)
        return Py_NewRef(Py_None);
    return PyBytes_FromStringAndSize((const char *)a, addr_len(r));
}

/* The scope and origin of a dnstap message: (transport, family, identity or else producer), (family, identity). */
static int dnstap_scope(const Rec *r, PyObject **scope, PyObject **origin)
{
    PyObject *fam = family_str[r->family < N_FAMILIES ? r->family : 0];
    if (fam == NULL) {
        PyErr_Format(PyExc_ValueError, "message record of an unknown dnstap family %d", r->family);
        return -1;
    }
    PyObject *sv[3] = {r->transport ? PyLong_FromLong(r->transport) : Py_NewRef(Py_None), Py_NewRef(fam),
                       PyUnicode_DecodeUTF8(rec_at(r, r->scope_name), r->scope_name.len, "surrogatepass")};
    PyObject *ov[2] = {Py_NewRef(fam), span_str(r, r->identity)};
    *scope = tuple_of(sv, 3);
    *origin = tuple_of(ov, 2);
    if (*scope == NULL || *origin == NULL) {
        Py_CLEAR(*scope);
        Py_CLEAR(*origin);
        return -1;
    }
    return 0;
}

static PyObject *rec_to_tuple(const Rec *r)
{
    PyObject *scope, *origin;
    if (r->family == 0) {
        scope = r->proto ? PyLong_FromLong(r->proto) : Py_NewRef(Py_None); /* a packet's is its IP protocol */
        origin = Py_NewRef(Py_None);
    } else if (dnstap_scope(r, &scope, &origin) < 0) {
        return NULL;
    }
    PyObject *v[N_MESSAGE_FIELDS] = {
        [M_TS_NS] = PyLong_FromLongLong(r->ts_ns),
        [M_WIRELEN] = r->wirelen < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(r->wirelen),
        [M_IPV] = r->ipv ? PyLong_FromLong(r->ipv) : Py_NewRef(Py_None),
        [M_PROTO] = r->proto ? PyLong_FromLong(r->proto) : Py_NewRef(Py_None),
        [M_SRC] = address(r, ABSENT_SRC, r->src),
        [M_SPORT] = int_or_none(r->sport),
        [M_DST] = address(r, ABSENT_DST, r->dst),
        [M_DPORT] = int_or_none(r->dport),
        [M_TTL] = int_or_none(r->ttl),
        [M_UDP_SUM] = int_or_none(r->udp_sum),
        [M_VLAN] = int_or_none(r->vlan),
        [M_TCP_RTT_MS] = r->has_rtt ? PyFloat_FromDouble(r->rtt_ms) : Py_NewRef(Py_None),
        [M_TRANSPORT] = r->transport ? PyLong_FromLong(r->transport) : Py_NewRef(Py_None),
        [M_SCOPE] = scope,
        [M_ORIGIN] = origin,
        [M_DNS_LEN] = PyLong_FromLongLong(r->dns_len),
        [M_ID] = int_or_none(r->id),
        [M_FLAGS] = int_or_none(r->flags),
        [M_QDCOUNT] = int_or_none(r->qdcount),
        [M_ANCOUNT] = int_or_none(r->ancount),
        [M_NSCOUNT] = int_or_none(r->nscount),
        [M_ARCOUNT] = int_or_none(r->arcount),
        [M_QNAME] = span_str(r, r->qname),
        [M_QTYPE] = int_or_none(r->qtype),
        [M_QCLASS] = int_or_none(r->qclass),
        [M_LABELS] = int_or_none(r->labels),
        [M_EDNS] = r->has_edns ? edns_tuple(r) : Py_NewRef(Py_None),
        [M_MALFORMED] = PyBool_FromLong(r->malformed),
        [M_LAST_AN_TYPE] = int_or_none(r->last_an),
        [M_RAW] = span_bytes(r, r->raw),
    };
    PyObject *t = tuple_of(v, N_MESSAGE_FIELDS);
    if (t == NULL || !r->query_copy)
        return t;
    PyObject *copy = PyObject_CallOneArg(query_copy_type, t);
    Py_DECREF(t);
    return copy;
}

/* ---------------------------------------------------------------------------------------------
 * Tuples -> records (the frames the Python decoder handled) */

static int bad_value(const char *field, PyObject *v)
{
    PyErr_Format(PyExc_TypeError, "message field %s: unexpected value %R", field, v);
    return -1;
}

static int get_i64(PyObject *v, const char *field, int64_t *out)
{
    if (!PyLong_CheckExact(v))
        return bad_value(field, v);
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* An int in 0..max, or None (-1) where none_ok. */
static int get_i32(PyObject *v, const char *field, long max, int none_ok, int32_t *out)
{
    if (v == Py_None && none_ok) {
        *out = -1;
        return 0;
    }
    if (!PyLong_CheckExact(v))
        return bad_value(field, v);
    long x = PyLong_AsLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < 0 || x > max)
        return bad_value(field, v);
    *out = (int32_t)x;
    return 0;
}

static int get_bool(PyObject *v, const char *field, uint8_t *out)
{
    if (v != Py_True && v != Py_False)
        return bad_value(field, v);
    *out = v == Py_True;
    return 0;
}

/* A str (as UTF-8) or bytes value, or None where none_ok: its data and length (SPAN_NONE for None). */
static int get_data(PyObject *v, const char *field, int is_str, int none_ok, const char **data, uint32_t *len)
{
    if (v == Py_None && none_ok) {
        *data = NULL;
        *len = SPAN_NONE;
        return 0;
    }
    Py_ssize_t n;
    if (is_str) {
        if (!PyUnicode_CheckExact(v))
            return bad_value(field, v);
        *data = PyUnicode_AsUTF8AndSize(v, &n);
        if (*data == NULL)
            return -1;
    } else {
        if (!PyBytes_CheckExact(v))
            return bad_value(field, v);
        *data = PyBytes_AS_STRING(v);
        n = PyBytes_GET_SIZE(v);
    }
    if ((size_t)n >= SPAN_NONE)
        return bad_value(field, v);
    *len = (uint32_t)n;
    return 0;
}

enum { S_QNAME, S_RAW, S_NSID, S_DAU, S_DHU, S_N3U, S_ECS, S_OTHER, S_RDATA, S_EDE, S_IDENTITY, S_SCOPE, N_SPANS };

/* The family code of a family name (FAMILY_NAMES), or -1 with an exception. */
static int family_code(PyObject *v)
{
    for (int k = 1; k < N_FAMILIES; k++) {
        if (v == family_str[k] || (PyUnicode_CheckExact(v) && PyUnicode_Compare(v, family_str[k]) == 0))
            return k;
    }
    if (PyErr_Occurred())
        return -1;
    return bad_value("family", v);
}

/* The scope name's UTF-8, with surrogatepass: a producer's name may be a file name that is not UTF-8 (Python keeps
 * its bytes as surrogates); *hold: the bytes object it is in. */
static int get_scope_name(PyObject *v, const char **data, uint32_t *len, PyObject **hold)
{
    if (!PyUnicode_CheckExact(v))
        return bad_value("scope", v);
    *hold = PyUnicode_AsEncodedString(v, "utf-8", "surrogatepass");
    if (*hold == NULL)
        return -1;
    return get_data(*hold, "scope", 0, 0, data, len);
}

/* scope and origin into r and the identity and scope name texts: a packet's (proto, None), or a dnstap message's
 * ((transport, family, identity or producer), (family, identity)). */
static int get_scope(PyObject *scope, PyObject *origin, Rec *r, const char **data, uint32_t *len, PyObject **hold)
{
    if (origin == Py_None) {
        if (!PyLong_CheckExact(scope) || r->proto == 0 || PyLong_AsLong(scope) != r->proto)
            return bad_value("scope", scope);
        return 0;
    }
    if (!PyTuple_CheckExact(scope) || PyTuple_GET_SIZE(scope) != 3)
        return bad_value("scope", scope);
    if (!PyTuple_CheckExact(origin) || PyTuple_GET_SIZE(origin) != 2)
        return bad_value("origin", origin);
    PyObject *transport = PyTuple_GET_ITEM(scope, 0);
    if (transport == Py_None ? r->transport != 0
                             : !PyLong_CheckExact(transport) || PyLong_AsLong(transport) != r->transport)
        return bad_value("scope", scope);
    int family = family_code(PyTuple_GET_ITEM(scope, 1));
    if (family < 0)
        return -1;
    if (family_code(PyTuple_GET_ITEM(origin, 0)) != family)
        return PyErr_Occurred() ? -1 : bad_value("origin", origin);
    r->family = (uint8_t)family;
    if (get_scope_name(PyTuple_GET_ITEM(scope, 2), &data[S_SCOPE], &len[S_SCOPE], hold) < 0
        || get_data(PyTuple_GET_ITEM(origin, 1), "origin", 1, 1, &data[S_IDENTITY], &len[S_IDENTITY]) < 0)
        return -1;
    return 0;
}

/* An address of the message: packed bytes of its IP version's length, or None. */
static int get_address(PyObject *a, const char *field, Rec *r, int absent_bit, uint8_t *out)
{
    if (a == Py_None) {
        r->absent |= absent_bit;
        return 0;
    }
    if (!PyBytes_CheckExact(a) || r->ipv == 0 || PyBytes_GET_SIZE(a) != addr_len(r))
        return bad_value(field, a);
    memcpy(out, PyBytes_AS_STRING(a), addr_len(r));
    return 0;
}

/* msgbatch_append_tuple's work; *hold: an object the record's texts may be in until it is written. */
static int append_tuple(MsgBatch *b, PyObject *t, PyObject **hold)
{
    static const char *names[] = {"qname", "raw", "nsid", "dau", "dhu", "n3u", "client_subnet", "other", "rdata"};
    int copy = Py_TYPE(t) == (PyTypeObject *)query_copy_type;
    if ((!PyTuple_CheckExact(t) && !copy) || PyTuple_GET_SIZE(t) != N_MESSAGE_FIELDS)
        return bad_value("(the message)", t);
    PyObject **m = &PyTuple_GET_ITEM(t, 0);
    Rec r;
    memset(&r, 0, sizeof r);
    r.query_copy = (uint8_t)copy;
    const char *data[N_SPANS] = {NULL};
    uint32_t len[N_SPANS];
    int32_t v32;
    for (int k = 0; k < N_SPANS; k++)
        len[k] = SPAN_NONE;
    r.wirelen = -1;
    if (get_i64(m[M_TS_NS], "ts_ns", &r.ts_ns) < 0
        || (m[M_WIRELEN] != Py_None && get_i64(m[M_WIRELEN], "wirelen", &r.wirelen) < 0))
        return -1;
    if (get_i32(m[M_IPV], "ipv", 6, 1, &v32) < 0)
        return -1;
    if (v32 != 4 && v32 != 6 && v32 != -1)
        return bad_value("ipv", m[M_IPV]);
    r.ipv = v32 < 0 ? 0 : (uint8_t)v32;
    if (get_i32(m[M_PROTO], "proto", 255, 1, &v32) < 0)
        return -1;
    if (v32 == 0)
        return bad_value("proto", m[M_PROTO]);
    r.proto = v32 < 0 ? 0 : (uint8_t)v32;
    if (get_address(m[M_SRC], "src", &r, ABSENT_SRC, r.src) < 0
        || get_address(m[M_DST], "dst", &r, ABSENT_DST, r.dst) < 0)
        return -1;
    if (get_i32(m[M_SPORT], "sport", 65535, 1, &r.sport) < 0 || get_i32(m[M_DPORT], "dport", 65535, 1, &r.dport) < 0
        || get_i32(m[M_TTL], "ttl", 255, 1, &r.ttl) < 0 || get_i32(m[M_UDP_SUM], "udp_sum", 65535, 1, &r.udp_sum) < 0
        || get_i32(m[M_VLAN], "vlan", 4095, 1, &r.vlan) < 0)
        return -1;
    if (m[M_TCP_RTT_MS] != Py_None) {
        if (!PyFloat_CheckExact(m[M_TCP_RTT_MS]))
            return bad_value("tcp_rtt_ms", m[M_TCP_RTT_MS]);
        r.has_rtt = 1;
        r.rtt_ms = PyFloat_AS_DOUBLE(m[M_TCP_RTT_MS]);
    }
    if (get_i32(m[M_TRANSPORT], "transport", 255, 1, &v32) < 0)
        return -1;
    if (v32 == 0)
        return bad_value("transport", m[M_TRANSPORT]);
    r.transport = v32 < 0 ? 0 : (uint8_t)v32;
    if (get_scope(m[M_SCOPE], m[M_ORIGIN], &r, data, len, hold) < 0)
        return -1;
    if (get_i64(m[M_DNS_LEN], "dns_len", &r.dns_len) < 0)
        return -1;
    int32_t *hdr[] = {&r.id, &r.flags, &r.qdcount, &r.ancount, &r.nscount, &r.arcount};
    static const char *hdr_names[] = {"id", "flags", "qdcount", "ancount", "nscount", "arcount"};
    for (int k = 0; k < 6; k++) {
        if (get_i32(m[M_ID + k], hdr_names[k], 65535, 1, hdr[k]) < 0)
            return -1;
    }
    if (get_data(m[M_QNAME], "qname", 1, 1, &data[S_QNAME], &len[S_QNAME]) < 0
        || get_i32(m[M_QTYPE], "qtype", 65535, 1, &r.qtype) < 0
        || get_i32(m[M_QCLASS], "qclass", 65535, 1, &r.qclass) < 0
        || get_i32(m[M_LABELS], "labels", 255, 1, &r.labels) < 0
        || get_bool(m[M_MALFORMED], "malformed", &r.malformed) < 0
        || get_i32(m[M_LAST_AN_TYPE], "last_an_type", 65535, 1, &r.last_an) < 0
        || get_data(m[M_RAW], "raw", 0, 1, &data[S_RAW], &len[S_RAW]) < 0)
        return -1;
    PyObject *e = m[M_EDNS];
    if (e != Py_None) {
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != N_EDNS_FIELDS)
            return bad_value("edns", e);
        PyObject **f = &PyTuple_GET_ITEM(e, 0);
        r.has_edns = 1;
        if (get_i32(f[E_UDP_SIZE], "udp_size", 65535, 0, &r.e_udp) < 0
            || get_i32(f[E_VERSION], "version", 255, 0, &r.e_version) < 0 || get_bool(f[E_DO], "do", &r.e_do) < 0
            || get_i32(f[E_EXT_RCODE], "ext_rcode", 255, 0, &r.e_ext_rcode) < 0
            || get_bool(f[E_COOKIE], "cookie", &r.e_cookie) < 0)
            return -1;
        for (int k = 0; k < 6; k++) {
            if (get_data(f[E_NSID + k], names[S_NSID + k], 1, 0, &data[S_NSID + k], &len[S_NSID + k]) < 0)
                return -1;
        }
        if (get_data(f[E_RDATA], "rdata", 0, 0, &data[S_RDATA], &len[S_RDATA]) < 0)
            return -1;
        if (!PyTuple_CheckExact(f[E_EDE]))
            return bad_value("ede", f[E_EDE]);
        len[S_EDE] = (uint32_t)PyTuple_GET_SIZE(f[E_EDE]);
    }
    size_t tail = 0;
    for (int k = 0; k < N_SPANS; k++) {
        if (len[k] != SPAN_NONE)
            tail += k == S_EDE ? 2 * (size_t)len[k] : len[k];
    }
    size_t size = align8(sizeof(Rec) + tail);
    RecBuf *rb = &b->recs;
    if (recbuf_reserve(rb, size) < 0)
        return -1;
    size_t start = rb->len;
    char *base = rb->buf + start;
    Span *spans[N_SPANS] = {&r.qname, &r.raw, &r.e_nsid, &r.e_dau, &r.e_dhu, &r.e_n3u, &r.e_ecs, &r.e_other,
                            &r.e_rdata, &r.e_ede, &r.identity, &r.scope_name};
    size_t off = sizeof(Rec);
    for (int k = 0; k < N_SPANS; k++) {
        spans[k]->off = (uint32_t)off;
        spans[k]->len = len[k];
        if (len[k] == SPAN_NONE)
            continue;
        if (k == S_EDE) {
            PyObject *codes = PyTuple_GET_ITEM(e, E_EDE);
            for (uint32_t j = 0; j < len[k]; j++) {
                int32_t code;
                if (get_i32(PyTuple_GET_ITEM(codes, j), "ede", 65535, 0, &code) < 0)
                    return -1;
                uint16_t c16 = (uint16_t)code;
                memcpy(base + off + 2 * j, &c16, 2);
            }
            off += 2 * (size_t)len[k];
        } else {
            memcpy(base + off, data[k], len[k]);
            off += len[k];
        }
    }
    r.size = (uint32_t)size;
    memcpy(base, &r, sizeof r);
    memset(base + off, 0, size - off);
    rb->len += size;
    return recbuf_push(rb, start);
}

static int msgbatch_append_tuple(MsgBatch *b, PyObject *t)
{
    PyObject *hold = NULL;
    int rc = append_tuple(b, t, &hold);
    Py_XDECREF(hold);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * MsgBatch and TxBatch alike: an object and the one RecBuf after its head (its messages, its transactions) */

_Static_assert(offsetof(MsgBatch, recs) == offsetof(TxBatch, txs), "a batch's RecBuf at one place");
#define BATCH_BUF(self) ((RecBuf *)((char *)(self) + offsetof(MsgBatch, recs)))

static PyObject *batch_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (PyTuple_GET_SIZE(args) || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments", type->tp_name);
        return NULL;
    }
    return type->tp_alloc(type, 0); /* zeroed: an empty RecBuf (a batch), no frames (Frames) */
}

static void batch_dealloc(PyObject *self)
{
    PyMem_Free(BATCH_BUF(self)->buf);
    PyMem_Free(BATCH_BUF(self)->at);
    Py_TYPE(self)->tp_free(self);
}

static Py_ssize_t batch_len(PyObject *self)
{
    return BATCH_BUF(self)->n;
}

static PyObject *batch_clear(PyObject *self, PyObject *Py_UNUSED(unused))
{
    BATCH_BUF(self)->len = 0;
    BATCH_BUF(self)->n = 0;
    Py_RETURN_NONE;
}

static PySequenceMethods batch_sequence = {.sq_length = batch_len};

/* ---------------------------------------------------------------------------------------------
 * MsgBatch */

static PyObject *msgbatch_to_tuples(PyObject *self, PyObject *Py_UNUSED(unused))
{
    MsgBatch *b = (MsgBatch *)self;
    PyObject *list = PyList_New(b->recs.n);
    for (Py_ssize_t i = 0; list != NULL && i < b->recs.n; i++)
        ext_set_item(&list, i, rec_to_tuple(msgbatch_get(b, i)));
    return list;
}

static PyObject *msgbatch_append(PyObject *self, PyObject *t)
{
    if (msgbatch_append_tuple((MsgBatch *)self, t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *msgbatch_extend(PyObject *self, PyObject *seq)
{
    PyObject *fast = PySequence_Fast(seq, "extend takes a sequence of message tuples");
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        if (msgbatch_append_tuple((MsgBatch *)self, PySequence_Fast_GET_ITEM(fast, i)) < 0) {
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

static PyMethodDef msgbatch_methods[] = {
    {"clear", batch_clear, METH_NOARGS, "Remove every message."},
    {"to_tuples", msgbatch_to_tuples, METH_NOARGS, "The messages as probe.model message tuples."},
    {"append", msgbatch_append, METH_O, "Add a message tuple."},
    {"extend", msgbatch_extend, METH_O, "Add message tuples."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MsgBatch_Type = EXT_TYPE(MsgBatch, "probe._records.MsgBatch", 0,
    "Decoded DNS messages as records, in capture order.", .tp_new = batch_new, .tp_dealloc = batch_dealloc,
    .tp_as_sequence = &batch_sequence, .tp_methods = msgbatch_methods);

/* ---------------------------------------------------------------------------------------------
 * TxBatch */

static int txbatch_add(TxBatch *b, const Rec *q, const Rec *r, int32_t messages)
{
    if (q == NULL && r == NULL) { /* every reader of a transaction takes one of its sides */
        PyErr_SetString(PyExc_ValueError, "a transaction has a query, a response or both");
        return -1;
    }
    size_t size = sizeof(TxHead) + (q ? q->size : 0) + (r ? r->size : 0);
    RecBuf *tb = &b->txs;
    if (recbuf_reserve(tb, size) < 0)
        return -1;
    size_t start = tb->len;
    TxHead *t = (TxHead *)(tb->buf + start);
    t->size = (uint32_t)size;
    t->messages = messages;
    t->q = q ? sizeof(TxHead) : 0;
    t->r = r ? (uint32_t)(sizeof(TxHead) + (q ? q->size : 0)) : 0;
    /* A transaction's messages are never query copies: a copy that is matched is matched as the query itself
     * (TransactionTable._query_copy adds tuple(m)). */
    if (q) {
        memcpy((char *)t + t->q, q, q->size);
        ((Rec *)((char *)t + t->q))->query_copy = 0;
    }
    if (r) {
        memcpy((char *)t + t->r, r, r->size);
        ((Rec *)((char *)t + t->r))->query_copy = 0;
    }
    tb->len += size;
    return recbuf_push(tb, start);
}

static PyObject *tx_tuple(const TxHead *t)
{
    const Rec *q = tx_query(t), *r = tx_response(t);
    PyObject *v[3] = {q ? rec_to_tuple(q) : Py_NewRef(Py_None), r ? rec_to_tuple(r) : Py_NewRef(Py_None),
                      PyLong_FromLong(t->messages)};
    return tuple_of(v, 3);
}

static PyObject *txbatch_to_tuples(PyObject *self, PyObject *args)
{
    TxBatch *b = (TxBatch *)self;
    Py_ssize_t start = 0, stop = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "|nn:to_tuples", &start, &stop))
        return NULL;
    start = start < 0 ? 0 : Py_MIN(start, b->txs.n);
    stop = Py_MAX(start, Py_MIN(stop, b->txs.n));
    PyObject *list = PyList_New(stop - start);
    for (Py_ssize_t i = start; list != NULL && i < stop; i++)
        ext_set_item(&list, i - start, tx_tuple(txbatch_get(b, i)));
    return list;
}

/* append((q, r, messages)): a transaction of message tuples (for tests and the Python matcher's output). */
static PyObject *txbatch_append(PyObject *self, PyObject *tx)
{
    if (!PyTuple_Check(tx) || PyTuple_GET_SIZE(tx) != 3) {
        PyErr_SetString(PyExc_TypeError, "a transaction is a (query, response, messages) tuple");
        return NULL;
    }
    MsgBatch *tmp = (MsgBatch *)PyObject_CallNoArgs((PyObject *)&MsgBatch_Type);
    if (tmp == NULL)
        return NULL;
    const Rec *side[2] = {NULL, NULL};
    int32_t messages;
    PyObject *rc = NULL;
    for (int k = 0; k < 2; k++) {
        PyObject *m = PyTuple_GET_ITEM(tx, k);
        if (m == Py_None)
            continue;
        if (msgbatch_append_tuple(tmp, m) < 0)
            goto done;
    }
    for (int k = 0, i = 0; k < 2; k++) {
        if (PyTuple_GET_ITEM(tx, k) != Py_None)
            side[k] = msgbatch_get(tmp, i++);
    }
    if (get_i32(PyTuple_GET_ITEM(tx, 2), "messages", INT32_MAX, 0, &messages) < 0)
        goto done;
    if (txbatch_add((TxBatch *)self, side[0], side[1], messages) < 0)
        goto done;
    rc = Py_NewRef(Py_None);
done:
    Py_DECREF(tmp);
    return rc;
}

/* time_ns(i): the capture time of transaction i (its query's, else its response's), as export.base.tx_time_ns. */
static PyObject *txbatch_time_ns(PyObject *self, PyObject *arg)
{
    TxBatch *b = (TxBatch *)self;
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= b->txs.n) {
        PyErr_SetString(PyExc_IndexError, "transaction index out of range");
        return NULL;
    }
    const TxHead *t = txbatch_get(b, i);
    /* never NULL: txbatch_add makes no transaction without either side (gcc -fanalyzer cannot see it) */
    const Rec *m = tx_query(t) ? tx_query(t) : tx_response(t);
    return PyLong_FromLongLong(m->ts_ns);
}

static PyMethodDef txbatch_methods[] = {
    {"clear", batch_clear, METH_NOARGS, "Remove every transaction."},
    {"to_tuples", txbatch_to_tuples, METH_VARARGS,
     "to_tuples(start=0, stop=len) -> [(query tuple or None, response tuple or None, messages), ...]."},
    {"append", txbatch_append, METH_O, "Add a (query, response, messages) transaction of message tuples."},
    {"time_ns", txbatch_time_ns, METH_O, "time_ns(i): capture time of transaction i (query, else response)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TxBatch_Type = EXT_TYPE(TxBatch, "probe._records.TxBatch", 0,
    "Completed transactions of message records, in completion order.", .tp_new = batch_new,
    .tp_dealloc = batch_dealloc, .tp_as_sequence = &batch_sequence, .tp_methods = txbatch_methods);

/* ---------------------------------------------------------------------------------------------
 * Frames */

static int frames_add(Frames *f, const unsigned char *ptr, uint32_t caplen, uint32_t wirelen, int64_t ts,
                      uint32_t tag)
{
    if (f->n == f->cap) {
        Py_ssize_t cap = f->cap ? 2 * f->cap : 1024;
        const unsigned char **p = PyMem_Realloc(f->ptr, cap * sizeof *p);
        if (p != NULL)
            f->ptr = p;
        uint32_t *c = p ? PyMem_Realloc(f->caplen, cap * sizeof *c) : NULL;
        if (c != NULL)
            f->caplen = c;
        uint32_t *w = c ? PyMem_Realloc(f->wirelen, cap * sizeof *w) : NULL;
        if (w != NULL)
            f->wirelen = w;
        uint32_t *g = w ? PyMem_Realloc(f->tag, cap * sizeof *g) : NULL;
        if (g != NULL)
            f->tag = g;
        int64_t *t = g ? PyMem_Realloc(f->ts, cap * sizeof *t) : NULL;
        if (t == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        f->ts = t;
        f->cap = cap;
    }
    Py_ssize_t i = f->n++;
    f->ptr[i] = ptr;
    f->caplen[i] = caplen;
    f->wirelen[i] = wirelen;
    f->ts[i] = ts;
    f->tag[i] = tag;
    return 0;
}

static int frames_own(Frames *f, PyObject *obj)
{
    Py_ssize_t k = PyList_GET_SIZE(f->owners);
    if (k && PyList_GET_ITEM(f->owners, k - 1) == obj)
        return 0;
    return PyList_Append(f->owners, obj);
}

static PyObject *frames_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Frames *f = (Frames *)batch_new(type, args, kw);
    if (f != NULL && (f->owners = PyList_New(0)) == NULL)
        Py_CLEAR(f);
    return (PyObject *)f;
}

static void frames_dealloc(PyObject *self)
{
    Frames *f = (Frames *)self;
    Py_XDECREF(f->owners);
    PyMem_Free(f->ptr);
    PyMem_Free(f->caplen);
    PyMem_Free(f->wirelen);
    PyMem_Free(f->tag);
    PyMem_Free(f->ts);
    Py_TYPE(self)->tp_free(self);
}

static Py_ssize_t frames_len(PyObject *self)
{
    return ((Frames *)self)->n;
}

/* The frame's bytes as a bytes object, with a taken-off VLAN tag put back at offset 12. */
static PyObject *frame_bytes(const Frames *f, Py_ssize_t i)
{
    uint32_t n = f->caplen[i];
    if (f->tag[i] == 0 || n < 12)
        return PyBytes_FromStringAndSize((const char *)f->ptr[i], n);
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n + 4);
    if (b != NULL)
        frame_with_tag(f, i, (unsigned char *)PyBytes_AS_STRING(b));
    return b;
}

/* lists(start=0, stop=len) -> (ts_ns, wirelen, data): frames start..stop-1 as FrameBatch's three lists. */
static PyObject *frames_lists(PyObject *self, PyObject *args)
{
    Frames *f = (Frames *)self;
    Py_ssize_t start = 0, stop = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "|nn:lists", &start, &stop))
        return NULL;
    start = start < 0 ? 0 : Py_MIN(start, f->n);
    stop = Py_MAX(start, Py_MIN(stop, f->n));
    PyObject *ts = PyList_New(stop - start), *wl = PyList_New(stop - start), *data = PyList_New(stop - start);
    for (Py_ssize_t i = start; ts != NULL && wl != NULL && data != NULL && i < stop; i++) {
        int tagged = f->tag[i] != 0 && f->caplen[i] >= 12;
        /* (the 4 bytes of a tag put back added in 64 bits: a wire length near 2^32 must not wrap) */
        ext_set_item(&ts, i - start, PyLong_FromLongLong(f->ts[i]));
        ext_set_item(&wl, i - start, PyLong_FromUnsignedLongLong((unsigned long long)f->wirelen[i] + (tagged ? 4 : 0)));
        ext_set_item(&data, i - start, frame_bytes(f, i));
    }
    if (ts != NULL && wl != NULL && data != NULL)
        return Py_BuildValue("(NNN)", ts, wl, data);
    Py_XDECREF(ts);
    Py_XDECREF(wl);
    Py_XDECREF(data);
    return NULL;
}

static PyObject *frames_clear(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Frames *f = (Frames *)self;
    if (f->decoding) {
        PyErr_SetString(PyExc_RuntimeError, "Frames.clear() while the frames are being decoded");
        return NULL;
    }
    f->n = 0;
    if (PyList_SetSlice(f->owners, 0, PyList_GET_SIZE(f->owners), NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A frame held by the bytes object data. */
static int frames_add_bytes(Frames *f, PyObject *data, long long ts, unsigned long long wirelen,
                            unsigned long long tag)
{
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "a frame must be bytes");
        return -1;
    }
    if (PyBytes_GET_SIZE(data) > UINT32_MAX || wirelen > UINT32_MAX || tag > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "frame length or tag over 32 bits");
        return -1;
    }
    if (frames_own(f, data) < 0)
        return -1;
    return frames_add(f, (const unsigned char *)PyBytes_AS_STRING(data), (uint32_t)PyBytes_GET_SIZE(data),
                      (uint32_t)wirelen, ts, (uint32_t)tag);
}

/* add(data, ts_ns, wirelen, tag=0): a frame held by the bytes object data (for tests and Python sources). */
static PyObject *frames_py_add(PyObject *self, PyObject *args)
{
    PyObject *data;
    long long ts;
    unsigned long long wirelen, tag = 0;
    if (!PyArg_ParseTuple(args, "OLK|K:add", &data, &ts, &wirelen, &tag)
        || frames_add_bytes((Frames *)self, data, ts, wirelen, tag) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* extend(ts_ns, wirelen, data): the frames of a FrameBatch's three lists (packets.py packed). */
static PyObject *frames_extend(PyObject *self, PyObject *args)
{
    PyObject *ts, *wl, *data;
    if (!PyArg_ParseTuple(args, "O!O!O!:extend", &PyList_Type, &ts, &PyList_Type, &wl, &PyList_Type, &data))
        return NULL;
    /* (the lengths read at each frame: an int's __index__ is Python code that may change the lists) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(data) && i < PyList_GET_SIZE(ts) && i < PyList_GET_SIZE(wl); i++) {
        PyObject *d = Py_NewRef(PyList_GET_ITEM(data, i));
        long long t = PyLong_AsLongLong(PyList_GET_ITEM(ts, i));
        unsigned long long w = t == -1 && PyErr_Occurred() ? 0 : PyLong_AsUnsignedLongLong(PyList_GET_ITEM(wl, i));
        int bad = PyErr_Occurred() || frames_add_bytes((Frames *)self, d, t, w, 0) < 0;
        Py_DECREF(d);
        if (bad)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *frames_last_ts(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Frames *f = (Frames *)self;
    if (f->n == 0)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(f->ts[f->n - 1]);
}

static PyMethodDef frames_methods[] = {
    {"lists", frames_lists, METH_VARARGS, "lists(start=0, stop=len) -> (ts_ns, wirelen, data) of those frames."},
    {"clear", frames_clear, METH_NOARGS, "Remove every frame (and let go of what they point into)."},
    {"add", frames_py_add, METH_VARARGS, "add(data, ts_ns, wirelen, tag=0): a frame held by a bytes object."},
    {"extend", frames_extend, METH_VARARGS, "extend(ts_ns, wirelen, data): the frames of three lists (bytes)."},
    {"last_ts", frames_last_ts, METH_NOARGS, "Capture time of the last frame, or None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Frames_Type = EXT_TYPE(Frames, "probe._records.Frames", 0,
    "Frames(): a batch's frames packed (probe.model.FrameBatch.packed), pointing into their buffers.",
    .tp_new = frames_new, .tp_dealloc = frames_dealloc, .tp_as_sequence = &(PySequenceMethods){.sq_length = frames_len},
    .tp_methods = frames_methods);

/* ---------------------------------------------------------------------------------------------
 * The module */

static PyMethodDef methods[] = {
    {"utf8_backslashreplace", py_utf8_backslashreplace, METH_O,
     "bytes.decode('utf-8', 'backslashreplace').encode() computed in C."},
    {NULL, NULL, 0, NULL},
};

static const RecordsApi api = {
    &MsgBatch_Type, &TxBatch_Type, &Frames_Type, frames_add, frames_own,
    recbuf_reserve, recbuf_push, txbatch_add, utf8_backslashreplace,
};

PyMODINIT_FUNC PyInit__records(void)
{
    PyObject *model = PyImport_ImportModule("probe.model");
    query_copy_type = model ? PyObject_GetAttrString(model, "QueryCopy") : NULL;
    Py_XDECREF(model);
    if (query_copy_type == NULL)
        return NULL;
    PyObject *families = PyTuple_New(N_FAMILIES - 1);
    if (families == NULL)
        return NULL;
    for (int k = 1; k < N_FAMILIES; k++) {
        if ((family_str[k] = PyUnicode_InternFromString(FAMILY_NAMES[k])) == NULL) {
            Py_DECREF(families);
            return NULL;
        }
        PyTuple_SET_ITEM(families, k - 1, Py_NewRef(family_str[k]));
    }
    PyObject *mod = ext_module("probe._records", NULL, methods,
                               (PyTypeObject *[]){&MsgBatch_Type, &TxBatch_Type, &Frames_Type, NULL},
                               RECORDS_CAPSULE, (void *)&api);
    if (mod != NULL && (PyModule_AddIntConstant(mod, "RECORD_SIZE", sizeof(Rec)) < 0
                        || PyModule_AddObjectRef(mod, "FAMILIES", families) < 0))
        Py_CLEAR(mod);
    Py_DECREF(families);
    return mod;
}
