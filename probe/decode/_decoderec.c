/* probe.decode._decoderec: the common-frame fast path of PacketDecoder (probe/decode/packets.py) writing message
 * records (include/records.h) into a MsgBatch: PacketDecoder.decode_into. Its Python reference is PacketDecoder's
 * frame loop (PacketDecoder.decode, message tuples; tests/decode/test_decoderec.py compares the two).
 *
 * The common frames (wire.h classify: Ethernet with VLAN tags, IPv4 without fragments, IPv6 without extension
 * headers, UDP, and TCP through the stream step), with the Python code's checks and counters; it stops at the
 * first frame it does not handle and returns (i, j), the caller decodes frames i..j-1 with the Python code and
 * appends their tuples to the batch. The message walk is
 * wire.h's walk_message; what the Python walker makes objects of (the QNAME text, the EDNS fields) is written
 * into the record's tail here.
 *
 * decode_packed(frames, start, out, portmap, keep4, keep6, counts, tcp, keep_raw) -> (i, j)
 *   frames: a probe._records.Frames (FrameBatch.packed, or the batch's lists packed: packets.py packed), read
 *   with no object per frame; out: the MsgBatch; portmap: 8192 bytes, bit p for a DNS port;
 *   keep4/keep6: the IP lists' callables (src, dst) -> keep?, or None; counts: the list [bytes, messages,
 *   responses, malformed, ip_filtered] added to; tcp: PacketDecoder._tcp_step or None (TCP frames then stop
 *   the loop); keep_raw: fill the raw field (C-DNS).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdio.h>
#include <string.h>

#include "decoderec_api.h"
#include "records.h"
#include "tcpstream_api.h"
#include "valuetext.h"
#include "wire.h"

/* ---------------------------------------------------------------------------------------------
 * The frame loop: its arguments, counts, the IP lists and the TCP stream step, and where it stops, by the rules
 * of the Python frame loop (probe/decode/packets.py). */

/* The C TCP stream step's API, imported at the first (TcpReassembler, on_reset) tcp argument (not at module
 * import: the frame loops also run with the Python step). */
static TcpstreamAPI *tcp_api;

/* The counts list the frame loop adds to (packets.py's c_counts). */
enum { C_BYTES, C_MESSAGES, C_RESPONSES, C_MALFORMED, C_FILTERED, N_COUNTS };

/* The checks of the portmap, counts and tcp arguments. */
static int check_frame_args(Py_ssize_t portmap_len, PyObject *counts, PyObject *tcp)
{
    if (portmap_len != 8192 || PyList_GET_SIZE(counts) != N_COUNTS) {
        PyErr_SetString(PyExc_ValueError, "portmap must have 8192 bytes and counts 5 items");
        return -1;
    }
    if (PyTuple_Check(tcp)) {
        if (tcp_api == NULL) {
            TcpstreamAPI *api = ext_import_capsule("probe.decode._tcpstream", TCPSTREAM_CAPSULE);
            if (api == NULL)
                return -1;
            if (api->version != TCPSTREAM_API_VERSION) {
                PyErr_SetString(PyExc_ImportError, "probe.decode._tcpstream has another C API version");
                return -1;
            }
            tcp_api = api;
        }
        if (PyTuple_GET_SIZE(tcp) != 2 || !PyObject_TypeCheck(PyTuple_GET_ITEM(tcp, 0), tcp_api->type)
            || !PyCallable_Check(PyTuple_GET_ITEM(tcp, 1))) {
            PyErr_SetString(PyExc_TypeError, "tcp must be callable, None or a (TcpReassembler, on_reset) pair");
            return -1;
        }
    } else if (tcp != Py_None && !PyCallable_Check(tcp)) {
        PyErr_SetString(PyExc_TypeError, "tcp must be callable, None or a (TcpReassembler, on_reset) pair");
        return -1;
    }
    return 0;
}

/* counts[i] += add[i]. The counts must be exact ints: anything else could run Python code (__index__) that
 * changes the list under the loop. */
static int add_counts(PyObject *counts, const long long *add)
{
    for (Py_ssize_t i = 0; i < N_COUNTS; i++) {
        if (!add[i])
            continue;
        PyObject *item = i < PyList_GET_SIZE(counts) ? PyList_GET_ITEM(counts, i) : NULL;
        if (item == NULL || !PyLong_CheckExact(item)) {
            PyErr_SetString(PyExc_TypeError, "counts must be a list of 5 ints");
            return -1;
        }
        long long old = PyLong_AsLongLong(item), sum;
        if (old == -1 && PyErr_Occurred())
            return -1;
        if (__builtin_add_overflow(old, add[i], &sum)) {
            PyErr_SetString(PyExc_OverflowError, "a count does not fit in 64 bits");
            return -1;
        }
        PyObject *v = PyLong_FromLongLong(sum);
        if (v == NULL || PyList_SetItem(counts, i, v) < 0)
            return -1;
    }
    return 0;
}

/* The IP lists' verdict on a frame's addresses (keep: the list's callable, or None to keep all): 1 keep,
 * 0 drop (counted as filtered), -1 error. */
static int keep_frame(PyObject *keep, PyObject *src, PyObject *dst, long long *counts)
{
    if (keep == Py_None)
        return 1;
    PyObject *res = PyObject_CallFunctionObjArgs(keep, src, dst, NULL);
    if (res == NULL)
        return -1;
    int yes = PyObject_IsTrue(res);
    Py_DECREF(res);
    if (yes == 0)
        counts[C_FILTERED]++;
    return yes;
}

/* Handles one message the TCP stream step completed: m, a (bytes, ts, wirelen, ttl, rtt_ms) tuple (held). */
typedef int (*TcpMessageFn)(void *ctx, PyObject *m);

/* The TCP segment of frame f through the stream step. tcp is the Python step, tcp(ipv, (src, sport, dst, dport),
 * ts, wirelen, ttl, seq, flags, payload), which does what PacketDecoder._transport does before the messages (the
 * RST count and address event, the stream step) and returns the messages completed, as TcpReassembler.segment
 * returns them; or a (TcpReassembler, on_reset) pair (check_frame_args): on_reset(src, ipv) for a RST, then the
 * C step through its API, with no Python call. Each message goes to fn. */
static int tcp_segment(PyObject *tcp, const unsigned char *f, const Fast *x, PyObject *ipv, PyObject *src,
                       PyObject *sport, PyObject *dst, PyObject *dport, PyObject *ts, PyObject *wl, TcpMessageFn fn,
                       void *ctx)
{
    PyObject *payload = PyBytes_FromStringAndSize((const char *)f + x->dns, x->dns_len);
    PyObject *ttl = NULL, *flags = NULL, *seq = NULL, *key = NULL, *res = NULL, *messages = NULL;
    if (payload != NULL && PyTuple_Check(tcp)) {
        long long ts_ns = PyLong_AsLongLong(ts), wirelen = PyLong_AsLongLong(wl);
        int ok = !PyErr_Occurred();
        if (ok && (x->flags & 0x04)) { /* TCP_RST */
            res = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(tcp, 1), src, ipv, NULL);
            ok = res != NULL;
        }
        if (ok && (messages = PyList_New(0)) != NULL
            && tcp_api->segment(PyTuple_GET_ITEM(tcp, 0), f + x->addr, f + x->addr + x->alen, x->alen, x->sport,
                                x->dport, ts_ns, wirelen, (long)x->ttl, x->seq, (long)x->flags, payload, messages) < 0)
            Py_CLEAR(messages);
    } else if (payload != NULL) {
        ttl = PyLong_FromLong(x->ttl), flags = PyLong_FromLong(x->flags), seq = PyLong_FromUnsignedLong(x->seq);
        key = PyTuple_Pack(4, src, sport, dst, dport);
        if (ttl != NULL && flags != NULL && seq != NULL && key != NULL) {
            PyObject *args[8] = {ipv, key, ts, wl, ttl, seq, flags, payload};
            res = PyObject_Vectorcall(tcp, args, 8, NULL);
            messages = res ? PySequence_Fast(res, "the TCP step must return a sequence") : NULL;
        }
    }
    int r = messages != NULL ? 0 : -1;
    for (Py_ssize_t i = 0; r == 0 && i < PySequence_Fast_GET_SIZE(messages); i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(messages, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5 || !PyBytes_Check(PyTuple_GET_ITEM(m, 0))) {
            PyErr_SetString(PyExc_TypeError, "the TCP step must return (bytes, ts, wirelen, ttl, rtt_ms) tuples");
            r = -1;
            break;
        }
        Py_INCREF(m); /* (fn may run Python code) */
        r = fn(ctx, m) < 0 ? -1 : 0;
        Py_DECREF(m);
    }
    Py_XDECREF(ttl);
    Py_XDECREF(flags);
    Py_XDECREF(seq);
    Py_XDECREF(payload);
    Py_XDECREF(key);
    Py_XDECREF(res);
    Py_XDECREF(messages);
    return r;
}

/* The end of a frame loop's call: the C stream step's counts written to the stats object (once per call, not
 * per segment). result: the call's result, or NULL with an exception set (kept). */
static PyObject *tcp_done(PyObject *tcp, PyObject *result)
{
    if (PyTuple_Check(tcp) && tcp_api->write_stats(PyTuple_GET_ITEM(tcp, 0)) < 0)
        Py_CLEAR(result);
    return result;
}


/* A growing tail: values appended behind the record at base. */
typedef struct {
    char *base;
    size_t off;
} Tail;

static Span tail_put(Tail *t, const void *p, size_t n)
{
    Span s = {(uint32_t)t->off, (uint32_t)n};
    memcpy(t->base + t->off, p, n);
    t->off += n;
    return s;
}

static Span tail_text(Tail *t, const unsigned char *p, size_t n)
{
    Span s = {(uint32_t)t->off, 0};
    s.len = (uint32_t)records->utf8_backslashreplace(p, n, t->base + t->off);
    t->off += s.len;
    return s;
}

/* No byte of s[0..n) has its high bit set (words, the last one overlapping the one before, as copy_short). */
static inline int ascii(const unsigned char *s, size_t n)
{
    uint64_t any = 0, w;
    uint32_t h;
    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&w, s + i, 8);
            any |= w;
        }
        memcpy(&w, s + n - 8, 8);
        any |= w;
    } else if (n >= 4) {
        memcpy(&h, s, 4);
        any = h;
        memcpy(&h, s + n - 4, 4);
        any |= h;
    } else {
        for (size_t i = 0; i < n; i++)
            any |= s[i];
    }
    return !(any & 0x8080808080808080ULL);
}

/* The QNAME text of an uncompressed first question (Walk.qwire bytes at name) made in the tail: the name joined
 * in place (qname_from_wire), and, when it is not all ASCII (seldom), escaped behind itself and moved back (room:
 * 5 bytes per byte). One pass over the name instead of a join and then a copy. (ASCII is judged on the wire,
 * whose length bytes are below 64: words read back from the bytes just written stall the stores.) */
static Span tail_qname(Tail *t, const unsigned char *name, Py_ssize_t qwire)
{
    char *out = t->base + t->off;
    size_t n = (size_t)qname_from_wire(name, qwire, out);
    if (!ascii(name + 1, n)) {
        size_t escaped = records->utf8_backslashreplace((const unsigned char *)out, n, out + n);
        memmove(out, out + n, escaped);
        n = escaped;
    }
    Span s = {(uint32_t)t->off, (uint32_t)n};
    t->off += n;
    return s;
}

/* dnswire.parse_opt over the options of the walk's OPT RR (OptScan: the walk checked them). */
static int tail_opt(Tail *t, Rec *r, const unsigned char *p, const Walk *w)
{
    const Py_ssize_t *last = w->opts.last;
    r->e_cookie = (uint8_t)w->opts.cookie;
    r->e_other = (Span){(uint32_t)t->off, (uint32_t)other_codes_text(p, w, t->base + t->off)};
    t->off += r->e_other.len;
    Span *text[N_OPT_TEXTS] = {&r->e_nsid, &r->e_dau, &r->e_dhu, &r->e_n3u, &r->e_ecs};
    for (int k = 0; k < N_OPT_TEXTS; k++) {
        Py_ssize_t n = 0; /* (an option not there: "") */
        char *out = t->base + t->off;
        if (last[k] >= 0) {
            const unsigned char *v = p + last[k] + 4;
            unsigned olen = rd16(p + last[k] + 2);
            n = k == AT_NSID ? (Py_ssize_t)records->utf8_backslashreplace(v, olen, out)
                : k == AT_ECS ? ecs_text(v, olen, out) : algorithms_text(v, olen, out);
        }
        if (n < 0)
            return -1;
        *text[k] = (Span){(uint32_t)t->off, (uint32_t)n};
        t->off += n;
    }
    r->e_ede.off = (uint32_t)t->off;
    r->e_ede.len = (uint32_t)w->opts.n_ede;
    for (Py_ssize_t pos = w->opt_start; pos < w->opt_end; pos += 4 + rd16(p + pos + 2)) {
        if (rd16(p + pos) == OPT_EDE) {
            uint16_t info = (uint16_t)rd16(p + pos + 4);
            memcpy(t->base + t->off, &info, 2);
            t->off += 2;
        }
    }
    r->e_rdata = tail_put(t, p + w->opt_start, w->opt_end - w->opt_start);
    return 0;
}

/* The network part, scope and origin of a record (its dnstap texts into the tail). */
static void set_net(Rec *r, Tail *t, const MsgNet *net)
{
    r->ts_ns = net->ts;
    r->wirelen = net->wirelen;
    r->ipv = (uint8_t)net->ipv;
    r->proto = (uint8_t)net->proto;
    r->transport = (uint8_t)net->transport;
    /* (copies of a constant length: moves, no call) */
    if (net->ipv == 6) {
        if (net->src)
            memcpy(r->src, net->src, 16);
        if (net->dst)
            memcpy(r->dst, net->dst, 16);
    } else {
        if (net->src)
            memcpy(r->src, net->src, 4);
        if (net->dst)
            memcpy(r->dst, net->dst, 4);
    }
    r->absent = (net->src ? 0 : ABSENT_SRC) | (net->dst ? 0 : ABSENT_DST);
    r->sport = net->sport;
    r->dport = net->dport;
    r->ttl = net->ttl;
    r->udp_sum = net->udp_sum;
    r->vlan = net->vlan;
    r->has_rtt = (uint8_t)net->has_rtt;
    r->rtt_ms = net->rtt;
    r->family = (uint8_t)net->family;
    r->query_copy = (uint8_t)net->query_copy;
    r->identity.len = r->scope_name.len = SPAN_NONE;
    if (net->family) {
        if (net->identity)
            r->identity = tail_put(t, net->identity, net->identity_len);
        r->scope_name = tail_put(t, net->scope_name, net->scope_name_len);
    }
}

/* A record zeroed with 16-byte stores, written out (a loop of them, as memset of the fixed size, is compiled
 * into a `rep stos`, whose start-up cost per record was a fifth of put_record's time). */
static inline void zero_rec(Rec *r)
{
    typedef uint64_t Zero16 __attribute__((vector_size(16), aligned(8), may_alias));
    _Static_assert(sizeof(Rec) == 16 * 16, "zero_rec writes sixteen 16-byte words");
    Zero16 *z = (Zero16 *)r, zero = {0, 0};
    z[0] = z[1] = z[2] = z[3] = z[4] = z[5] = z[6] = z[7] = zero;
    z[8] = z[9] = z[10] = z[11] = z[12] = z[13] = z[14] = z[15] = zero;
}

/* The record of the message p[0..n) with the network part net, appended to out (the capsule's put_record). */
static int put_record(MsgBatch *out, const MsgNet *net, const unsigned char *p, Py_ssize_t n, int keep_raw,
                      int32_t *flags, int *malformed)
{
    Walk w;
    walk_message(p, n, &w);
    size_t opt_len = w.has_opt ? (size_t)(w.opt_end - w.opt_start) : 0;
    /* Bound of the tail: the QNAME escaped (4 bytes per byte, and the joined text before it: tail_qname), the EDNS texts (each option's bytes at most 4
     * times over, the codes of `other` 1.5 times, an ECS text 64), the OPT RDATA, the raw message and the dnstap
     * texts. */
    size_t bound = align8(sizeof(Rec) + 5 * (size_t)w.jlen + 8 * opt_len + 128 + (keep_raw ? (size_t)n : 0)
                          + (net->identity ? net->identity_len : 0) + (net->family ? net->scope_name_len : 0));
    RecBuf *rb = &out->recs;
    if (recbuf_room(rb, bound) < 0)
        return -1;
    size_t start = rb->len;
    Rec *r = (Rec *)(rb->buf + start);
    zero_rec(r);
    Tail t = {(char *)r, sizeof(Rec)};
    set_net(r, &t, net);
    r->dns_len = n;
    r->id = (int32_t)w.id;
    r->flags = (int32_t)w.flags;
    r->qdcount = (int32_t)w.qd;
    r->ancount = (int32_t)w.an;
    r->nscount = (int32_t)w.ns;
    r->arcount = (int32_t)w.ar;
    r->qtype = (int32_t)w.qtype;
    r->qclass = (int32_t)w.qclass;
    r->last_an = (int32_t)w.last_an;
    r->malformed = (uint8_t)w.malformed;
    r->qname.len = r->raw.len = SPAN_NONE;
    r->labels = -1;
    if (w.has_qname) {
        r->qname = w.qwire ? tail_qname(&t, p + 12, w.qwire)
                           : tail_text(&t, (const unsigned char *)w.joined, (size_t)w.jlen);
        r->labels = (int32_t)w.labels;
    }
    if (keep_raw)
        r->raw = tail_put(&t, p, (size_t)n);
    if (w.has_opt) {
        r->has_edns = 1;
        r->e_udp = (int32_t)w.opt_class;
        r->e_version = (w.opt_ttl >> 16) & 0xFF;
        r->e_do = (w.opt_ttl & 0x8000) != 0;
        r->e_ext_rcode = w.opt_ttl >> 24;
        if (tail_opt(&t, r, p, &w) < 0)
            return -1;
    }
    size_t size = align8(t.off);
    /* the padding zeroed by one 8-byte store (the bound leaves room past the tail); a memset of its variable
     * length was a call */
    static const uint64_t zero8 = 0;
    memcpy((char *)r + t.off, &zero8, 8);
    r->size = (uint32_t)size;
    rb->len += size;
    if (recbuf_add(rb, start) < 0)
        return -1;
    *flags = (int32_t)w.flags;
    *malformed = w.malformed;
    return 0;
}

/* put_record, counted. */
static int put_message(MsgBatch *out, const MsgNet *net, const unsigned char *p, Py_ssize_t n, int keep_raw,
                       long long *counts)
{
    int32_t flags;
    int malformed;
    if (put_record(out, net, p, n, keep_raw, &flags, &malformed) < 0)
        return -1;
    counts[C_MESSAGES]++;
    counts[C_RESPONSES] += flags >= 0 && (flags & 0x8000);
    counts[C_MALFORMED] += malformed;
    return 0;
}

/* An int the TCP step returned, into *out (0..max); -1 with an exception otherwise. */
static int step_int(PyObject *v, long long max, int64_t *out)
{
    if (!PyLong_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "the TCP step must return ints for ts, wirelen and ttl");
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < 0 || x > max) {
        PyErr_Format(PyExc_ValueError, "the TCP step returned %lld, out of range", x);
        return -1;
    }
    *out = x;
    return 0;
}

/* A TCP segment's frame: the network fields of its messages, all but those the stream step gives. */
typedef struct {
    const unsigned char *f;
    const Fast *x;
    int keep_raw;
    MsgBatch *out;
    long long *counts;
} TcpFrame;

/* tcp_segment's TcpMessageFn: a record for a message the stream step completed. */
static int tcp_message(void *ctx, PyObject *m)
{
    const TcpFrame *t = ctx;
    const Fast *x = t->x;
    PyObject *rtt = PyTuple_GET_ITEM(m, 4), *data = PyTuple_GET_ITEM(m, 0);
    int64_t mttl;
    MsgNet net = {.ipv = x->ipv, .proto = PROTO_TCP, .transport = TRANSPORT_TCP, .src = t->f + x->addr,
                  .dst = t->f + x->addr + x->alen, .sport = (int32_t)x->sport,
                  .dport = (int32_t)x->dport, .udp_sum = 0, .vlan = (int32_t)x->vlan};
    if (step_int(PyTuple_GET_ITEM(m, 1), INT64_MAX, &net.ts) < 0
        || step_int(PyTuple_GET_ITEM(m, 2), INT64_MAX, &net.wirelen) < 0
        || step_int(PyTuple_GET_ITEM(m, 3), 255, &mttl) < 0)
        return -1;
    net.ttl = (int32_t)mttl;
    if (rtt != Py_None) {
        if (!PyFloat_CheckExact(rtt)) {
            PyErr_SetString(PyExc_TypeError, "the TCP step must return a float or None as rtt_ms");
            return -1;
        }
        net.has_rtt = 1;
        net.rtt = PyFloat_AS_DOUBLE(rtt);
    }
    return put_message(t->out, &net, (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                       t->keep_raw, t->counts);
}

/* A TCP segment through the stream step, with the arguments PacketDecoder._tcp_step takes. */
static int tcp_frame(long long ts_ns, long long wirelen, const unsigned char *f, const Fast *x, PyObject *src,
                     PyObject *dst, PyObject *tcp, int keep_raw, MsgBatch *out, long long *counts)
{
    TcpFrame t = {f, x, keep_raw, out, counts};
    PyObject *ts = PyLong_FromLongLong(ts_ns), *wl = PyLong_FromLongLong(wirelen);
    PyObject *ipv = PyLong_FromLong(x->ipv), *sport = PyLong_FromLong(x->sport), *dport = PyLong_FromLong(x->dport);
    int r = -1;
    if (ipv != NULL && sport != NULL && dport != NULL && ts != NULL && wl != NULL)
        r = tcp_segment(tcp, f, x, ipv, src, sport, dst, dport, ts, wl, tcp_message, &t);
    Py_XDECREF(ipv);
    Py_XDECREF(sport);
    Py_XDECREF(dport);
    Py_XDECREF(ts);
    Py_XDECREF(wl);
    return r;
}

/* The network part of a UDP frame's message, field by field: an initializer that leaves fields to zero was
 * compiled into a `rep stos` of the struct, a fifth of the frame loop's own time. */
static inline void udp_net(MsgNet *net, long long ts_ns, long long wirelen, const unsigned char *f, const Fast *x)
{
    net->ts = ts_ns;
    net->wirelen = wirelen;
    net->ipv = x->ipv;
    net->proto = PROTO_UDP;
    net->transport = TRANSPORT_UDP;
    net->src = f + x->addr;
    net->dst = f + x->addr + x->alen;
    net->sport = (int32_t)x->sport;
    net->dport = (int32_t)x->dport;
    net->ttl = (int32_t)x->ttl;
    net->udp_sum = (int32_t)x->csum;
    net->vlan = (int32_t)x->vlan;
    net->has_rtt = 0;
    net->rtt = 0;
    net->family = net->query_copy = 0;
    net->identity = net->scope_name = NULL;
    net->identity_len = net->scope_name_len = 0;
}

/* One frame f that classify accepted: its message records appended to out, or counted as filtered. */
static int fast_frame(long long ts_ns, long long wirelen, const unsigned char *f,
                      const Fast *x, PyObject *keep, PyObject *tcp, int keep_raw, MsgBatch *out, long long *counts)
{
    PyObject *src = NULL, *dst = NULL;
    int r = 1;
    if (keep != Py_None || x->proto == PROTO_TCP) { /* (else no address objects are needed) */
        src = PyBytes_FromStringAndSize((const char *)f + x->addr, x->alen);
        dst = PyBytes_FromStringAndSize((const char *)f + x->addr + x->alen, x->alen);
        r = src != NULL && dst != NULL ? keep_frame(keep, src, dst, counts) : -1;
    }
    if (r > 0 && x->proto == PROTO_TCP) {
        r = tcp_frame(ts_ns, wirelen, f, x, src, dst, tcp, keep_raw, out, counts);
    } else if (r > 0) {
        MsgNet net;
        udp_net(&net, ts_ns, wirelen, f, x);
        r = put_message(out, &net, f + x->dns, x->dns_len, keep_raw, counts);
    }
    Py_XDECREF(src);
    Py_XDECREF(dst);
    return r;
}

/* A frame of f as its reader sees it: its bytes, with a tag the kernel took off put back (into *scratch,
 * grown as needed), and its wire length then 4 bytes more. NULL on no memory. */
static const unsigned char *frame_tagged(const Frames *f, Py_ssize_t i, unsigned char **scratch,
                                         size_t *scratch_len, Py_ssize_t *len, long long *wirelen)
{
    uint32_t n = f->caplen[i];
    if (*scratch == NULL || *scratch_len < (size_t)n + 4) {
        unsigned char *p = PyMem_Realloc(*scratch, (size_t)n + 4);
        if (p == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        *scratch = p;
        *scratch_len = (size_t)n + 4;
    }
    frame_with_tag(f, i, *scratch);
    *len = (Py_ssize_t)n + 4;
    *wirelen += 4;
    return *scratch;
}

/* (the untagged frame, the usual one, inline: frame_tagged the other) */
static inline const unsigned char *frame_at(const Frames *f, Py_ssize_t i, unsigned char **scratch,
                                            size_t *scratch_len, Py_ssize_t *len, long long *wirelen)
{
    uint32_t n = f->caplen[i];
    *len = n;
    *wirelen = f->wirelen[i];
    if (f->tag[i] == 0 || n < 12)
        return f->ptr[i];
    return frame_tagged(f, i, scratch, scratch_len, len, wirelen);
}

/* Frames read straight from where a device put them (DPDK's mbufs, spread over its pool) are not in the cache
 * when their turn comes, unlike a ring block just copied: the first lines of a frame a few places ahead are
 * asked for while this one is decoded. */
enum { PREFETCH_AHEAD = 4, PREFETCH_LINES = 4 };

static inline void prefetch_frame(const unsigned char *p, uint32_t len)
{
    for (uint32_t off = 0; off < len && off < PREFETCH_LINES * 64; off += 64)
        __builtin_prefetch(p + off);
}

/* The frame loop over a packed batch (a probe._records.Frames): no object per frame. Returns (i, j), the index
 * of the first frame it does not handle and of the next one it handles (the caller decodes frames i..j-1 in
 * Python and calls again from j: messages stay in capture order), with the counts added to counts_obj. */
static PyObject *decode_packed(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *keep4, *keep6, *counts_obj, *tcp, *result = NULL;
    Frames *frames;
    MsgBatch *out;
    Py_ssize_t start;
    const unsigned char *portmap;
    Py_ssize_t portmap_len;
    int keep_raw;
    if (!PyArg_ParseTuple(args, "O!nO!y#OOO!Op:decode_packed", records->frames_type, &frames, &start,
                          records->msgbatch_type, &out, &portmap, &portmap_len, &keep4, &keep6, &PyList_Type,
                          &counts_obj, &tcp, &keep_raw)
        || check_frame_args(portmap_len, counts_obj, tcp) < 0)
        return NULL;
    int do_tcp = tcp != Py_None;
    long long counts[N_COUNTS] = {0};
    unsigned char *scratch = NULL;
    size_t scratch_len = 0;
    /* keep4/keep6 and tcp are Python code: the frames are held, and their clear() (which lets go of the memory
     * the frame being decoded points into) refused until the loop ends. */
    Py_INCREF(frames);
    frames->decoding++;
    Py_ssize_t i = start < 0 ? 0 : start, len;
    long long wirelen;
    Fast x;
    for (; i < frames->n; i++) {
        if (i + PREFETCH_AHEAD < frames->n)
            prefetch_frame(frames->ptr[i + PREFETCH_AHEAD], frames->caplen[i + PREFETCH_AHEAD]);
        const unsigned char *f = frame_at(frames, i, &scratch, &scratch_len, &len, &wirelen);
        if (f == NULL)
            goto done;
        if (!classify(f, len, portmap, do_tcp, &x))
            break;
        if (fast_frame(frames->ts[i], wirelen, f, &x, x.ipv == 4 ? keep4 : keep6, tcp, keep_raw, out,
                       counts) < 0)
            goto done;
        counts[C_BYTES] += wirelen;
    }
    Py_ssize_t j = i;
    for (; j < frames->n; j++) {
        const unsigned char *f = frame_at(frames, j, &scratch, &scratch_len, &len, &wirelen);
        if (f == NULL)
            goto done;
        if (classify(f, len, portmap, do_tcp, &x))
            break;
    }
    result = Py_BuildValue("(nn)", i, j);
    if (result != NULL && add_counts(counts_obj, counts) < 0)
        Py_CLEAR(result);
done:
    PyMem_Free(scratch);
    frames->decoding--;
    Py_DECREF(frames);
    return tcp_done(tcp, result);
}

/* select_share(frames, linktype, k, n) -> Frames: the frames whose flow_hash % n is k (pointers only: the new
 * Frames keeps the owners of the memory they point into). */
static PyObject *select_share(PyObject *Py_UNUSED(self), PyObject *args)
{
    Frames *frames;
    int linktype;
    Py_ssize_t k, n;
    if (!PyArg_ParseTuple(args, "O!inn:select_share", records->frames_type, &frames, &linktype, &k, &n))
        return NULL;
    if (n < 1 || k < 0 || k >= n) {
        PyErr_SetString(PyExc_ValueError, "select_share: worker k of n with 0 <= k < n");
        return NULL;
    }
    Frames *out = (Frames *)PyObject_CallNoArgs((PyObject *)records->frames_type);
    if (out == NULL)
        return NULL;
    unsigned char *scratch = NULL;
    size_t scratch_len = 0;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(frames->owners); j++) {
        if (PyList_Append(out->owners, PyList_GET_ITEM(frames->owners, j)) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < frames->n; i++) {
        /* (a frame with a tag the kernel took off: the tag would sit before the IP header, read it whole) */
        Py_ssize_t len;
        long long wirelen;
        const unsigned char *f = frame_at(frames, i, &scratch, &scratch_len, &len, &wirelen);
        if (f == NULL)
            goto fail;
        if ((Py_ssize_t)(flow_hash(f, len, linktype) % (uint32_t)n) == k
            && records->frames_add(out, frames->ptr[i], frames->caplen[i], frames->wirelen[i], frames->ts[i],
                                   frames->tag[i]) < 0)
            goto fail;
    }
    PyMem_Free(scratch);
    return (PyObject *)out;
fail:
    PyMem_Free(scratch);
    Py_DECREF(out);
    return NULL;
}

/* flow_hash(frame, linktype) -> int: wire.h's flow_hash (for the tests and the BPF fanout program's check). */
static PyObject *py_flow_hash(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer frame;
    int linktype;
    if (!PyArg_ParseTuple(args, "y*i:flow_hash", &frame, &linktype))
        return NULL;
    uint32_t h = flow_hash(frame.buf, frame.len, linktype);
    PyBuffer_Release(&frame);
    return PyLong_FromUnsignedLong(h);
}

static PyMethodDef methods[] = {
    {"select_share", select_share, METH_VARARGS,
     "select_share(frames, linktype, k, n) -> Frames: the frames of worker k of n (flow_hash % n == k)."},
    {"flow_hash", py_flow_hash, METH_VARARGS,
     "flow_hash(frame, linktype) -> int: the symmetric hash of the frame's IP address pair (include/wire.h)."},
    {"decode_packed", decode_packed, METH_VARARGS,
     "decode_packed(frames, start, out, portmap, keep4, keep6, counts, tcp, keep_raw) -> (i, j): the common-frame "
     "fast path of PacketDecoder.decode_into over a probe._records.Frames, records appended to the MsgBatch out."},
    {NULL, NULL, 0, NULL},
};

static const DecoderecApi api = {DECODEREC_API_VERSION, put_record};

PyMODINIT_FUNC PyInit__decoderec(void)
{
    if (records_import() < 0)
        return NULL;
    return ext_module("probe.decode._decoderec", NULL, methods, NULL, DECODEREC_CAPSULE, (void *)&api);
}
