/* probe.decode._tcpstream: the TCP stream step in C, the twin of probe/decode/tcpstream.py (the reference: its
 * comments say why each rule is there; this file does the same, step for step, and the differential tests in
 * tests/decode/test_tcpstream_c.py and fuzz/fuzz_tcpstream.py hold the two to it).
 *
 * TcpReassembler(idle_timeout_ns, max_flows, max_ooo_bytes, max_ooo_segments, stats, max_bytes=None)
 *   .segment(key, ts, wirelen, ttl, seq, flags, payload) -> [(message bytes, first ts, summed wirelen, ttl,
 *       rtt_ms or None)]; key: (src bytes, sport, dst bytes, dport), addresses of at most 16 bytes
 *   .expire(now_ns), .flush(), .held, .flow_count, .flows_state() (what the tests compare with the twin's)
 *
 * Why C: the step ran once per TCP segment in Python (a _Flow object per direction, tuple keys, bytes slices)
 * and cost a tenth of a run's CPU on a common traffic mix. Here a direction is a struct in an insertion-ordered
 * hash table (a keyed SipHash, since the keys come from the network; a doubly linked list for the age order
 * that eviction needs), a message in progress a byte buffer of at most 65,537 bytes, and a segment held ahead
 * of a gap a reference to its payload bytes in a min-heap by stream offset. Counters are added up here and
 * written to the stats object at the end of each call, so that after every call it equals the twin's (the frame
 * loops, through the C API, write them once at their end).
 *
 * Differences from the twin, on input the probe never gives: wirelen must be >= 0 and seq in [0, 2^32), payload
 * bytes, ts, ttl and the bounds C integers, max_flows >= 1 (the twin fails on its first direction then). The
 * summed wirelen saturates at INT64_MAX (the twin's is unbounded; both store at most INT32_MAX). pos, the
 * unwrapped stream offset, is 128-bit: it moves by less than 2^31 per SYN, so it cannot overflow.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "extmodule.h"
#include "tcpstream_api.h"

#define SEQ_MOD ((uint64_t)1 << 32)
#define SEQ_HALF ((uint32_t)1 << 31)
#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10
#define MAX_ADDR 16
#define KEY_LEN (2 * (1 + MAX_ADDR) + 4) /* src length, src, dst length, dst, sport, dport */
#define BUF_KEEP 4096                    /* an emptied message buffer larger than this is freed */

typedef __int128 i128;

/* The stats counters this step adds to (probe/stats.py), in the order of NAMES. */
enum { C_SEGMENTS, C_STREAMS, C_EVICTED, C_DROPPED_BYTES, C_RETRANSMITTED, C_OUT_OF_ORDER, C_OOO_DROPPED, C_RESYNC,
       C_CAPPED, N_COUNTERS };
static const char *const NAMES[N_COUNTERS] = {
    "tcp_segments", "tcp_streams", "tcp_evicted", "tcp_dropped_bytes", "tcp_retransmitted", "tcp_out_of_order",
    "tcp_ooo_dropped", "tcp_resync", "lengths_capped",
};
static PyObject *names[N_COUNTERS]; /* interned */

static uint64_t sip_k0, sip_k1; /* the hash key, random per process */

/* A segment held ahead of a gap: its payload (a reference) and the frame's fields. */
typedef struct {
    i128 offset; /* the stream offset of its first byte */
    PyObject *data;
    long long ts, wirelen;
    long ttl;
} Held;

/* One direction of a connection (the twin's _Flow). */
typedef struct Flow {
    struct Flow *chain;       /* next in its hash bucket */
    struct Flow *prev, *next; /* insertion order: eviction drops the oldest */
    uint64_t hash;
    unsigned char key[KEY_LEN];
    int has_next_seq, has_rtt, has_syn_ts, synack_seen, midstream;
    uint32_t next_seq;
    i128 pos; /* stream offset of next_seq, not wrapped (orders the held segments) */
    unsigned char *buf; /* the message in progress (at most 65,537 bytes) */
    size_t buf_len, buf_cap;
    long long msg_ts, msg_wirelen, last_ts, syn_ts, ooo_bytes;
    long msg_ttl;
    double rtt_ms;
    Held *heap; /* min-heap by offset */
    Py_ssize_t n_held, heap_cap;
} Flow;

typedef struct {
    PyObject_HEAD
    long long idle_timeout_ns, max_ooo_bytes, max_bytes, held;
    Py_ssize_t max_flows, max_ooo_segments, n_flows;
    int has_max_bytes;
    PyObject *stats;
    Flow **table; /* hash buckets, a power of two of them */
    size_t table_size;
    Flow *oldest, *newest;
    long long counts[N_COUNTERS];
} Reassembler;

/* ---- hashing: SipHash-1-3 (keys are chosen by whoever sends packets) ---- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                                       \
    do {                                                                                                               \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                                    \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                                       \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                                       \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                                    \
    } while (0)

static uint64_t siphash13(const unsigned char *in, size_t len)
{
    uint64_t v0 = 0x736f6d6570736575ULL ^ sip_k0, v1 = 0x646f72616e646f6dULL ^ sip_k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ sip_k0, v3 = 0x7465646279746573ULL ^ sip_k1;
    uint64_t b = (uint64_t)len << 56, m;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&m, in + i, 8);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t j = 0; i + j < len; j++)
        b |= (uint64_t)in[i + j] << (8 * j);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- the table of directions ---- */

static Flow *lookup(Reassembler *r, const unsigned char *key, uint64_t hash)
{
    for (Flow *f = r->table[hash & (r->table_size - 1)]; f != NULL; f = f->chain)
        if (f->hash == hash && memcmp(f->key, key, KEY_LEN) == 0)
            return f;
    return NULL;
}

static void free_flow(Flow *f)
{
    for (Py_ssize_t i = 0; i < f->n_held; i++)
        Py_DECREF(f->heap[i].data);
    PyMem_Free(f->heap);
    PyMem_Free(f->buf);
    PyMem_Free(f);
}

/* The twin's _drop: the direction and what it held go (its bytes counted as dropped). */
static void drop(Reassembler *r, Flow *f)
{
    Flow **p = &r->table[f->hash & (r->table_size - 1)];
    while (*p != f)
        p = &(*p)->chain;
    *p = f->chain;
    if (f->prev != NULL)
        f->prev->next = f->next;
    else
        r->oldest = f->next;
    if (f->next != NULL)
        f->next->prev = f->prev;
    else
        r->newest = f->prev;
    r->n_flows--;
    long long lost = (long long)f->buf_len + f->ooo_bytes;
    r->held -= lost;
    r->counts[C_DROPPED_BYTES] += lost;
    free_flow(f);
}

static int grow_table(Reassembler *r)
{
    size_t size = r->table_size * 2;
    Flow **table = PyMem_Calloc(size, sizeof(Flow *));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < r->table_size; i++) {
        for (Flow *f = r->table[i], *next; f != NULL; f = next) {
            next = f->chain;
            f->chain = table[f->hash & (size - 1)];
            table[f->hash & (size - 1)] = f;
        }
    }
    PyMem_Free(r->table);
    r->table = table;
    r->table_size = size;
    return 0;
}

/* The twin's _new_flow: the oldest direction goes first when max_flows are held. */
static Flow *new_flow(Reassembler *r, const unsigned char *key, uint64_t hash, long long ts)
{
    if (r->n_flows >= r->max_flows) {
        drop(r, r->oldest);
        r->counts[C_EVICTED]++;
    }
    /* At most one direction per bucket on average: the table is at most twice max_flows. */
    if ((size_t)r->n_flows >= r->table_size && grow_table(r) < 0)
        return NULL;
    Flow *f = PyMem_Calloc(1, sizeof(Flow));
    if (f == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(f->key, key, KEY_LEN);
    f->hash = hash;
    f->msg_ts = f->last_ts = ts;
    size_t b = hash & (r->table_size - 1);
    f->chain = r->table[b];
    r->table[b] = f;
    f->prev = r->newest;
    if (r->newest != NULL)
        r->newest->next = f;
    else
        r->oldest = f;
    r->newest = f;
    r->n_flows++;
    r->counts[C_STREAMS]++;
    return f;
}

/* ---- the held segments' heap ---- */

static void heap_push(Flow *f, Held h)
{
    Py_ssize_t i = f->n_held++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (f->heap[parent].offset <= h.offset)
            break;
        f->heap[i] = f->heap[parent];
        i = parent;
    }
    f->heap[i] = h;
}

static Held heap_pop(Flow *f)
{
    Held top = f->heap[0], last = f->heap[--f->n_held];
    Py_ssize_t i = 0, n = f->n_held;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && f->heap[c + 1].offset < f->heap[c].offset)
            c++;
        if (last.offset <= f->heap[c].offset)
            break;
        f->heap[i] = f->heap[c];
        i = c;
    }
    if (n > 0)
        f->heap[i] = last;
    return top;
}

static int is_held(const Flow *f, i128 offset)
{
    /* A scan: at most max_ooo_segments (256 by default) entries. */
    for (Py_ssize_t i = 0; i < f->n_held; i++)
        if (f->heap[i].offset == offset)
            return 1;
    return 0;
}

/* ---- the stream ---- */

/* The twin's _restart: pos moves by the signed distance, so that held segments keep their offsets. */
static void restart(Flow *f, uint32_t next_seq)
{
    if (f->has_next_seq) {
        uint32_t jump = next_seq - f->next_seq;
        f->pos += jump >= SEQ_HALF ? (i128)jump - (i128)SEQ_MOD : (i128)jump;
    }
    f->next_seq = next_seq;
    f->has_next_seq = 1;
}

static PyObject *int128_to_py(i128 v)
{
    if (v >= LLONG_MIN && v <= LLONG_MAX)
        return PyLong_FromLongLong((long long)v);
    /* (Not reached by any real stream: 2^32 SYNs on one direction.) */
    PyObject *hi = PyLong_FromLongLong((long long)(v >> 64)), *lo = PyLong_FromUnsignedLongLong((uint64_t)v);
    PyObject *shift = PyLong_FromLong(64), *up = NULL, *sum = NULL;
    if (hi != NULL && lo != NULL && shift != NULL && (up = PyNumber_Lshift(hi, shift)) != NULL)
        sum = PyNumber_Add(up, lo);
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    Py_XDECREF(up);
    return sum;
}

/* Byte i of the message buffer followed by the segment. */
static inline unsigned char at(const Flow *f, const unsigned char *p, size_t i)
{
    return i < f->buf_len ? f->buf[i] : p[i - f->buf_len];
}

/* Bytes [from, from + n) of the message buffer followed by the segment, into dst. */
static void copy_out(const Flow *f, const unsigned char *p, size_t from, size_t n, unsigned char *dst)
{
    if (from < f->buf_len) {
        size_t k = f->buf_len - from < n ? f->buf_len - from : n;
        memcpy(dst, f->buf + from, k);
        dst += k;
        from += k;
        n -= k;
    }
    if (n)
        memcpy(dst, p + (from - f->buf_len), n);
}

static int emit(Reassembler *r, Flow *f, const unsigned char *p, size_t from, size_t mlen, long long wirelen,
                PyObject *out)
{
    PyObject *msg;
    if (from >= f->buf_len) {
        msg = PyBytes_FromStringAndSize((const char *)p + (from - f->buf_len), (Py_ssize_t)mlen);
    } else {
        msg = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)mlen);
        if (msg != NULL)
            copy_out(f, p, from, mlen, (unsigned char *)PyBytes_AS_STRING(msg));
    }
    (void)r;
    PyObject *rtt = f->has_rtt ? PyFloat_FromDouble(f->rtt_ms) : Py_NewRef(Py_None);
    PyObject *ts = PyLong_FromLongLong(f->msg_ts), *wl = PyLong_FromLongLong(wirelen);
    PyObject *ttl = PyLong_FromLong(f->msg_ttl), *t = NULL;
    if (msg != NULL && rtt != NULL && ts != NULL && wl != NULL && ttl != NULL)
        t = PyTuple_Pack(5, msg, ts, wl, ttl, rtt);
    Py_XDECREF(msg);
    Py_XDECREF(rtt);
    Py_XDECREF(ts);
    Py_XDECREF(wl);
    Py_XDECREF(ttl);
    int rc = t != NULL ? PyList_Append(out, t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* The twin's _append: n bytes at p continue the stream; the messages they complete go to out. */
static int append(Reassembler *r, Flow *f, long long ts, long long wirelen, long ttl, const unsigned char *p,
                  size_t n, PyObject *out)
{
    f->next_seq = (uint32_t)(f->next_seq + (uint64_t)n);
    f->pos += (i128)n;
    r->held -= (long long)f->buf_len;
    if (f->buf_len) {
        f->msg_wirelen = f->msg_wirelen > LLONG_MAX - wirelen ? LLONG_MAX : f->msg_wirelen + wirelen;
    } else {
        f->msg_ts = ts;
        f->msg_wirelen = wirelen;
        f->msg_ttl = ttl;
    }
    size_t total = f->buf_len + n, i = 0;
    int rc = 0;
    while (total - i >= 2) {
        size_t mlen = (size_t)at(f, p, i) << 8 | at(f, p, i + 1);
        if (f->midstream && mlen < 12) {
            r->counts[C_RESYNC]++;
            r->counts[C_DROPPED_BYTES] += (long long)(total - i);
            i = total;
            break;
        }
        if (total - i < mlen + 2)
            break;
        long long wl = f->msg_wirelen;
        if (wl > INT32_MAX) {
            r->counts[C_CAPPED]++;
            wl = INT32_MAX;
        }
        if (emit(r, f, p, i + 2, mlen, wl, out) < 0) {
            rc = -1;
            i = total; /* (the rest is lost with the error) */
            break;
        }
        f->midstream = 0;
        i += mlen + 2;
        /* The rest of this segment starts the next message: its frames so far are this segment's only. */
        f->msg_ts = ts;
        f->msg_wirelen = wirelen;
        f->msg_ttl = ttl;
    }
    /* Keep bytes [i, total): fewer than 2, or less than one message (at most 65,536). */
    size_t rest = total - i;
    if (rest > f->buf_cap) {
        unsigned char *buf = ext_grow(f->buf, &f->buf_cap, rest, 1, 256);
        if (buf == NULL) {
            /* (Unreachable in practice: at most 128 KiB.) The bytes are lost, as counted. */
            r->counts[C_DROPPED_BYTES] += (long long)rest;
            f->buf_len = 0;
            return -1;
        }
        f->buf = buf;
    }
    if (rest) {
        if (i < f->buf_len) {
            size_t from_buf = f->buf_len - i;
            memmove(f->buf, f->buf + i, from_buf);
            memcpy(f->buf + from_buf, p, n);
        } else {
            memcpy(f->buf, p + (i - f->buf_len), rest);
        }
    } else if (f->buf_cap > BUF_KEEP) {
        PyMem_Free(f->buf);
        f->buf = NULL;
        f->buf_cap = 0;
    }
    f->buf_len = rest;
    r->held += (long long)rest;
    return rc;
}

/* The twin's _data: payload bytes [0, n) at sequence number seq. */
static int data(Reassembler *r, Flow *f, long long ts, long long wirelen, long ttl, uint32_t seq, PyObject *payload,
                PyObject *out)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(payload);
    size_t n = (size_t)PyBytes_GET_SIZE(payload);
    f->last_ts = ts;
    if (!f->has_next_seq) {
        f->next_seq = seq;
        f->has_next_seq = 1;
    }
    uint32_t delta = seq - f->next_seq;
    if (delta >= SEQ_HALF) {
        /* Starts before what we have: a retransmission, possibly carrying new bytes at its end. */
        uint64_t behind = SEQ_MOD - delta;
        if (behind >= n) {
            r->counts[C_RETRANSMITTED]++;
            return 0;
        }
        p += behind;
        n -= behind;
    } else if (delta) {
        /* Ahead of a gap: hold it (bounded) until the gap is filled. */
        i128 offset = f->pos + delta;
        if (is_held(f, offset)) {
            r->counts[C_RETRANSMITTED]++;
        } else if ((i128)f->ooo_bytes + (i128)n > (i128)r->max_ooo_bytes || f->n_held >= r->max_ooo_segments) {
            r->counts[C_OOO_DROPPED]++;
            r->counts[C_DROPPED_BYTES] += (long long)n;
        } else {
            if (f->n_held >= f->heap_cap) {
                Py_ssize_t cap = f->heap_cap ? f->heap_cap * 2 : 4;
                if (cap > r->max_ooo_segments)
                    cap = r->max_ooo_segments; /* > n_held here */
                Held *heap = PyMem_Realloc(f->heap, (size_t)cap * sizeof(Held));
                if (heap == NULL) {
                    PyErr_NoMemory();
                    return -1;
                }
                f->heap = heap;
                f->heap_cap = cap;
            }
            Py_INCREF(payload);
            heap_push(f, (Held){.offset = offset, .data = payload, .ts = ts, .wirelen = wirelen, .ttl = ttl});
            f->ooo_bytes += (long long)n;
            r->held += (long long)n;
            r->counts[C_OUT_OF_ORDER]++;
        }
        return 0;
    }
    if (append(r, f, ts, wirelen, ttl, p, n, out) < 0)
        return -1;
    /* Release the held segments the stream has reached, in stream order; one it has overtaken gives only its
     * bytes beyond what is there (the first arrival wins). */
    while (f->n_held && f->heap[0].offset <= f->pos) {
        Held h = heap_pop(f);
        size_t len = (size_t)PyBytes_GET_SIZE(h.data);
        f->ooo_bytes -= (long long)len;
        r->held -= (long long)len;
        i128 behind = f->pos - h.offset;
        int rc = 0;
        if (behind < (i128)len)
            rc = append(r, f, h.ts, h.wirelen, h.ttl, (const unsigned char *)PyBytes_AS_STRING(h.data) + (size_t)behind,
                        len - (size_t)behind, out);
        else
            r->counts[C_RETRANSMITTED]++;
        Py_DECREF(h.data);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- the stats object ---- */

/* Adds the counts gathered since the last call to the stats object (an exception pending is kept). */
static int write_stats(Reassembler *r)
{
    long long counts[N_COUNTERS];
    memcpy(counts, r->counts, sizeof counts);
    memset(r->counts, 0, sizeof r->counts);
    if (r->stats == NULL) /* (cleared by the collector: nothing to count in) */
        return PyErr_Occurred() ? -1 : 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int rc = 0;
    for (int i = 0; i < N_COUNTERS && rc == 0; i++) {
        if (counts[i] == 0)
            continue;
        PyObject *old = PyObject_GetAttr(r->stats, names[i]), *add = PyLong_FromLongLong(counts[i]), *sum = NULL;
        if (old != NULL && add != NULL)
            sum = PyNumber_Add(old, add);
        rc = sum != NULL ? PyObject_SetAttr(r->stats, names[i], sum) : -1;
        Py_XDECREF(old);
        Py_XDECREF(add);
        Py_XDECREF(sum);
    }
    if (type != NULL)
        PyErr_Restore(type, value, tb); /* the first error is the one reported */
    return rc < 0 || type != NULL ? -1 : 0;
}

/* ---- the type ---- */

static int parse_addr(PyObject *o, unsigned char *dst)
{
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) > MAX_ADDR) {
        PyErr_SetString(PyExc_TypeError, "key addresses must be bytes of at most 16");
        return -1;
    }
    dst[0] = (unsigned char)PyBytes_GET_SIZE(o);
    memset(dst + 1, 0, MAX_ADDR);
    memcpy(dst + 1, PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
    return 0;
}

static int parse_port(PyObject *o, unsigned char *dst)
{
    long v = PyLong_Check(o) ? PyLong_AsLong(o) : -1;
    if (v < 0 || v > 65535) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "key ports must be ints in [0, 65535]");
        }
        return -1;
    }
    dst[0] = (unsigned char)(v >> 8);
    dst[1] = (unsigned char)v;
    return 0;
}

/* key (src, sport, dst, dport) -> its bytes, and those of the other direction. */
/* The key of the other direction: src | dst | sport | dport swapped. */
static void reverse_key(const unsigned char *k, unsigned char *rev)
{
    const int A = 1 + MAX_ADDR;
    memcpy(rev, k + A, A);
    memcpy(rev + A, k, A);
    memcpy(rev + 2 * A, k + 2 * A + 2, 2);
    memcpy(rev + 2 * A + 2, k + 2 * A, 2);
}

static int parse_key(PyObject *key, unsigned char *k, unsigned char *rev)
{
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 4) {
        PyErr_SetString(PyExc_TypeError, "key must be a (src, sport, dst, dport) tuple");
        return -1;
    }
    const int A = 1 + MAX_ADDR; /* src | dst | sport | dport */
    if (parse_addr(PyTuple_GET_ITEM(key, 0), k) < 0 || parse_addr(PyTuple_GET_ITEM(key, 2), k + A) < 0
        || parse_port(PyTuple_GET_ITEM(key, 1), k + 2 * A) < 0 || parse_port(PyTuple_GET_ITEM(key, 3), k + 2 * A + 2) < 0)
        return -1;
    reverse_key(k, rev);
    return 0;
}

static PyObject *key_to_py(const unsigned char *k)
{
    const int A = 1 + MAX_ADDR;
    return Py_BuildValue("(y#iy#i)", k + 1, (Py_ssize_t)k[0], (int)(k[2 * A] << 8 | k[2 * A + 1]), k + A + 1,
                         (Py_ssize_t)k[A], (int)(k[2 * A + 2] << 8 | k[2 * A + 3]));
}

/* The twin's _segment, without the bound over all directions. */
static int segment(Reassembler *r, const unsigned char *key, const unsigned char *rev, long long ts,
                   long long wirelen, long ttl, uint32_t seq, long flags, PyObject *payload, PyObject *out)
{
    r->counts[C_SEGMENTS]++;
    uint64_t hash = siphash13(key, KEY_LEN);
    Flow *f = lookup(r, key, hash), *peer;
    Py_ssize_t plen = PyBytes_GET_SIZE(payload);
    if (flags & TCP_RST) {
        int rc = 0;
        if (f != NULL && plen)
            rc = data(r, f, ts, wirelen, ttl, seq, payload, out);
        if ((f = lookup(r, key, hash)) != NULL)
            drop(r, f);
        if ((peer = lookup(r, rev, siphash13(rev, KEY_LEN))) != NULL)
            drop(r, peer);
        return rc;
    }
    if (flags & TCP_SYN) {
        if (f == NULL || (f->has_next_seq && f->buf_len)) {
            if (f != NULL)
                drop(r, f);
            if ((f = new_flow(r, key, hash, ts)) == NULL)
                return -1;
        }
        if (!plen || !f->has_next_seq)
            /* (A retransmitted SYN carrying data keeps its place, so the data is seen as a duplicate.) */
            restart(f, seq + 1);
        f->last_ts = ts;
        if (flags & TCP_ACK) {
            /* SYN/ACK from the server: the client's handshake clock keeps running. */
            if ((peer = lookup(r, rev, siphash13(rev, KEY_LEN))) != NULL)
                peer->synack_seen = 1;
        } else {
            f->syn_ts = ts;
            f->has_syn_ts = 1;
        }
        /* TCP Fast Open (RFC 7413): data on the SYN, its first byte at ISN + 1. */
        return plen ? data(r, f, ts, wirelen, ttl, seq + 1, payload, out) : 0;
    }
    if (f == NULL) {
        if (!plen)
            return 0;
        if ((f = new_flow(r, key, hash, ts)) == NULL)
            return -1;
        f->midstream = 1;
    }
    if (f->has_syn_ts && f->synack_seen && !f->has_rtt && (flags & TCP_ACK)) {
        /* Client's ACK completing the handshake: RTT = SYN -> this ACK, in milliseconds. */
        f->rtt_ms = (double)((i128)ts - (i128)f->syn_ts) / 1e6;
        f->has_rtt = 1;
        if ((peer = lookup(r, rev, siphash13(rev, KEY_LEN))) != NULL) {
            peer->rtt_ms = f->rtt_ms;
            peer->has_rtt = 1;
        }
    }
    int rc = plen ? data(r, f, ts, wirelen, ttl, seq, payload, out) : 0;
    if (flags & TCP_FIN)
        drop(r, f);
    return rc;
}

/* segment() as a public call: the bound over all directions after it; the counts pending. */
static int public_segment(Reassembler *r, const unsigned char *key, const unsigned char *rev, long long ts,
                          long long wirelen, long ttl, uint32_t seq, long flags, PyObject *payload, PyObject *out)
{
    int rc = segment(r, key, rev, ts, wirelen, ttl, seq, flags, payload, out);
    if (r->has_max_bytes) {
        /* Over the bound of all directions: the oldest go first (the one just added is the newest). */
        while (r->held > r->max_bytes && r->oldest != NULL) {
            drop(r, r->oldest);
            r->counts[C_EVICTED]++;
        }
    }
    return rc;
}

static int api_write_stats(PyObject *reassembler)
{
    return write_stats((Reassembler *)reassembler);
}

/* The C API's segment (include/tcpstream_api.h): the key from its parts. */
static int api_segment(PyObject *reassembler, const unsigned char *src, const unsigned char *dst, int alen,
                       unsigned sport, unsigned dport, long long ts, long long wirelen, long ttl, uint32_t seq,
                       long flags, PyObject *payload, PyObject *out)
{
    const int A = 1 + MAX_ADDR;
    unsigned char key[KEY_LEN] = {0}, rev[KEY_LEN] = {0};
    if (alen < 0 || alen > MAX_ADDR || sport > 65535 || dport > 65535 || wirelen < 0 || !PyBytes_Check(payload)) {
        PyErr_SetString(PyExc_ValueError, "the TCP step's C API was given a bad segment");
        return -1;
    }
    key[0] = key[A] = (unsigned char)alen;
    memcpy(key + 1, src, (size_t)alen);
    memcpy(key + A + 1, dst, (size_t)alen);
    key[2 * A] = (unsigned char)(sport >> 8);
    key[2 * A + 1] = (unsigned char)sport;
    key[2 * A + 2] = (unsigned char)(dport >> 8);
    key[2 * A + 3] = (unsigned char)dport;
    reverse_key(key, rev);
    return public_segment((Reassembler *)reassembler, key, rev, ts, wirelen, ttl, seq, flags, payload, out);
}

/* An int argument as a long long (0 with an exception set when it is not one). */
static int as_ll(PyObject *o, const char *what, long long *v)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", what);
        return -1;
    }
    *v = PyLong_AsLongLong(o);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *Reassembler_segment(Reassembler *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "segment(key, ts, wirelen, ttl, seq, flags, payload)");
        return NULL;
    }
    unsigned char key[KEY_LEN], rev[KEY_LEN];
    long long ts, wirelen, ttl, seq, flags;
    if (as_ll(args[1], "ts", &ts) < 0 || as_ll(args[2], "wirelen", &wirelen) < 0 || as_ll(args[3], "ttl", &ttl) < 0
        || as_ll(args[4], "seq", &seq) < 0 || as_ll(args[5], "flags", &flags) < 0 || parse_key(args[0], key, rev) < 0)
        return NULL;
    if (wirelen < 0 || seq < 0 || seq >= (long long)SEQ_MOD || ttl < LONG_MIN || ttl > LONG_MAX) {
        PyErr_SetString(PyExc_ValueError, "wirelen must be >= 0 and seq in [0, 2**32)");
        return NULL;
    }
    if (!PyBytes_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "payload must be bytes");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int rc = public_segment(r, key, rev, ts, wirelen, (long)ttl, (uint32_t)seq, (long)flags, args[6], out);
    if (write_stats(r) < 0 || rc < 0)
        Py_CLEAR(out);
    return out;
}

static PyObject *Reassembler_expire(Reassembler *r, PyObject *arg)
{
    long long now = PyLong_AsLongLong(arg);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    i128 cutoff = (i128)now - r->idle_timeout_ns;
    for (Flow *f = r->oldest, *next; f != NULL; f = next) {
        next = f->next;
        if ((i128)f->last_ts < cutoff)
            drop(r, f);
    }
    if (write_stats(r) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Reassembler_flush(Reassembler *r, PyObject *Py_UNUSED(ignored))
{
    while (r->oldest != NULL)
        drop(r, r->oldest);
    if (write_stats(r) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *opt_ll(int has, long long v)
{
    return has ? PyLong_FromLongLong(v) : Py_NewRef(Py_None);
}

/* What the tests compare with the twin's flows_state(): each direction, oldest first. */
static PyObject *Reassembler_flows_state(Reassembler *r, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(0);
    for (Flow *f = r->oldest; list != NULL && f != NULL; f = f->next) {
        i128 *offs = PyMem_Malloc((size_t)(f->n_held ? f->n_held : 1) * sizeof(i128));
        PyObject *held = PyList_New(f->n_held), *item = NULL;
        if (offs == NULL || held == NULL) {
            PyMem_Free(offs);
            Py_XDECREF(held);
            Py_CLEAR(list);
            if (offs == NULL)
                PyErr_NoMemory();
            break;
        }
        for (Py_ssize_t i = 0; i < f->n_held; i++) { /* sorted: an insertion sort of at most max_ooo_segments */
            i128 v = f->heap[i].offset;
            Py_ssize_t j = i;
            for (; j > 0 && offs[j - 1] > v; j--)
                offs[j] = offs[j - 1];
            offs[j] = v;
        }
        int ok = 1;
        for (Py_ssize_t i = 0; i < f->n_held && ok; i++) {
            PyObject *o = int128_to_py(offs[i]);
            ok = o != NULL;
            if (ok)
                PyList_SET_ITEM(held, i, o);
        }
        PyMem_Free(offs);
        PyObject *key = key_to_py(f->key), *pos = int128_to_py(f->pos);
        PyObject *next_seq = opt_ll(f->has_next_seq, f->next_seq), *syn_ts = opt_ll(f->has_syn_ts, f->syn_ts);
        PyObject *rtt = f->has_rtt ? PyFloat_FromDouble(f->rtt_ms) : Py_NewRef(Py_None);
        if (ok && key && pos && next_seq && syn_ts && rtt)
            item = Py_BuildValue("(OOOnLOOOOOLLLl)", key, next_seq, pos, (Py_ssize_t)f->buf_len, f->ooo_bytes, held,
                                 f->midstream ? Py_True : Py_False, rtt, syn_ts, f->synack_seen ? Py_True : Py_False,
                                 f->last_ts, f->msg_ts, f->msg_wirelen, f->msg_ttl);
        Py_XDECREF(key);
        Py_XDECREF(pos);
        Py_XDECREF(next_seq);
        Py_XDECREF(syn_ts);
        Py_XDECREF(rtt);
        Py_DECREF(held);
        if (item == NULL || PyList_Append(list, item) < 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *Reassembler_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"idle_timeout_ns", "max_flows", "max_ooo_bytes", "max_ooo_segments", "stats",
                             "max_bytes", NULL};
    long long idle, max_ooo_bytes;
    Py_ssize_t max_flows, max_ooo_segments;
    PyObject *stats, *max_bytes = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LnLnO|O", kwlist, &idle, &max_flows, &max_ooo_bytes,
                                     &max_ooo_segments, &stats, &max_bytes))
        return NULL;
    if (max_flows < 1) {
        PyErr_SetString(PyExc_ValueError, "max_flows must be at least 1");
        return NULL;
    }
    long long mb = 0;
    if (max_bytes != Py_None && (mb = PyLong_AsLongLong(max_bytes)) == -1 && PyErr_Occurred())
        return NULL;
    Reassembler *r = (Reassembler *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->table_size = 64;
    if ((r->table = PyMem_Calloc(r->table_size, sizeof(Flow *))) == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    r->idle_timeout_ns = idle;
    r->max_flows = max_flows;
    r->max_ooo_bytes = max_ooo_bytes;
    r->max_ooo_segments = max_ooo_segments;
    r->has_max_bytes = max_bytes != Py_None;
    r->max_bytes = mb;
    r->stats = Py_NewRef(stats);
    return (PyObject *)r;
}

EXT_GC_ONE_REF(Reassembler, Reassembler, stats)

static void Reassembler_dealloc(Reassembler *r)
{
    PyObject_GC_UnTrack(r);
    for (Flow *f = r->oldest, *next; f != NULL; f = next) {
        next = f->next;
        free_flow(f);
    }
    PyMem_Free(r->table);
    Py_CLEAR(r->stats);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *get_max_bytes(Reassembler *r, void *Py_UNUSED(c))
{
    return opt_ll(r->has_max_bytes, r->max_bytes);
}

static PyGetSetDef getset[] = {
    {"max_bytes", (getter)get_max_bytes, NULL, "the bound over all directions, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef members[] = {
    {"held", T_LONGLONG, offsetof(Reassembler, held), READONLY,
     "bytes held over all directions: messages in progress and segments ahead of a gap"},
    {"flow_count", T_PYSSIZET, offsetof(Reassembler, n_flows), READONLY, "directions held"},
    {"stats", T_OBJECT, offsetof(Reassembler, stats), READONLY, "the stats object counted in"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef methods[] = {
    {"segment", (PyCFunction)(void (*)(void))Reassembler_segment, METH_FASTCALL,
     "segment(key, ts, wirelen, ttl, seq, flags, payload) -> [(message, first ts, summed wirelen, ttl, rtt_ms)]"},
    {"expire", (PyCFunction)Reassembler_expire, METH_O, "expire(now_ns): drop the directions idle since "
                                                        "now_ns - idle_timeout_ns"},
    {"flush", (PyCFunction)Reassembler_flush, METH_NOARGS, "flush(): drop every direction (counted)"},
    {"flows_state", (PyCFunction)Reassembler_flows_state, METH_NOARGS,
     "flows_state() -> each direction's state, oldest first (as tcpstream.TcpReassembler.flows_state)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Reassembler_Type = EXT_TYPE(Reassembler, "probe.decode._tcpstream.TcpReassembler",
    Py_TPFLAGS_HAVE_GC, "TcpReassembler(idle_timeout_ns, max_flows, max_ooo_bytes, max_ooo_segments, stats, "
                        "max_bytes=None): the C twin of probe.decode.tcpstream.TcpReassembler",
    .tp_new = Reassembler_new, .tp_dealloc = (destructor)Reassembler_dealloc,
    .tp_traverse = Reassembler_traverse, .tp_clear = Reassembler_clear, .tp_methods = methods,
    .tp_members = members, .tp_getset = getset);

PyMODINIT_FUNC PyInit__tcpstream(void)
{
    for (int i = 0; i < N_COUNTERS; i++)
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(NAMES[i])) == NULL)
            return NULL;
    /* The hash key, from os.urandom. */
    PyObject *os = PyImport_ImportModule("os"), *rnd = os ? PyObject_CallMethod(os, "urandom", "i", 16) : NULL;
    Py_XDECREF(os);
    if (rnd == NULL)
        return NULL;
    if (!PyBytes_Check(rnd) || PyBytes_GET_SIZE(rnd) != 16) {
        Py_DECREF(rnd);
        PyErr_SetString(PyExc_RuntimeError, "os.urandom(16) did not give 16 bytes");
        return NULL;
    }
    memcpy(&sip_k0, PyBytes_AS_STRING(rnd), 8);
    memcpy(&sip_k1, PyBytes_AS_STRING(rnd) + 8, 8);
    Py_DECREF(rnd);
    static TcpstreamAPI api = {TCPSTREAM_API_VERSION, &Reassembler_Type, api_segment, api_write_stats};
    return ext_module("probe.decode._tcpstream", NULL, NULL, (PyTypeObject *[]){&Reassembler_Type, NULL},
                      TCPSTREAM_CAPSULE, &api);
}
