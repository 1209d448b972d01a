/* probe.decode._fastwire: the DNS wire walker in C, making the DNS part of a message tuple.
 *
 * Why: walking a DNS message in Python (probe/decode/dnswire.py) was the largest part of decoding a message
 * tuple; PacketDecoder's Python frame loop (the frames the record decoder declines) calls parse_message with
 * decode.parser fast.
 * It is a translation of the Python code, rule for rule: probe/decode/dnswire.py stays the reference (and
 * the fallback where this module is not built), and tests/decode/test_fastwire.py checks that both give
 * equal results on every message of the test captures and on many thousands of damaged ones.
 *
 * parse_message(buf, names=None, max_names=-1) -> the DNS tuple of dnswire.parse_message(buf, names).
 *   names: None or the dict cache of question names (wire bytes -> (text, label count)), filled as the
 *   Python walker fills it. max_names >= 0: first clear names when it holds more entries (as
 *   dnswire.MessageParser.parse does). A buf that is not bytes is handed to the Python walker.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"

#define N_DNS 15 /* probe.model DNS_FIELDS */

static PyObject *empty_str, *ipv6_address, *py_parse_message;

/* module.name, imported on first use into *cache (a borrowed reference, or NULL with an exception). */
static PyObject *python_attr(PyObject **cache, const char *module, const char *name)
{
    if (*cache == NULL) {
        PyObject *mod = PyImport_ImportModule(module);
        if (mod == NULL)
            return NULL;
        *cache = PyObject_GetAttrString(mod, name);
        Py_DECREF(mod);
    }
    return *cache;
}


/* A 16-bit field as an int. Fields with few distinct values (flags, lengths, types, classes, UDP sizes)
 * share one int object per value, made on first use: that saves an allocation, which on a busy heap
 * costs a cache miss. Ints are immutable, so the sharing is invisible. Fields with random values (IDs,
 * ports, checksums) get new ints: a table entry of a rare value would be the cache miss instead. */
static PyObject *shared_ints[65536];

static PyObject *shared16(unsigned v)
{
    PyObject *o = shared_ints[v];
    if (o == NULL) {
        o = PyLong_FromLong(v);
        if (o == NULL)
            return NULL;
        shared_ints[v] = o;
    }
    return Py_NewRef(o);
}

static inline PyObject *u16(unsigned v)
{
    return PyLong_FromLong(v);
}

/* Tuples made here hold only ints, strings, bytes, None, booleans and such tuples: they cannot be part
 * of a reference cycle, so they are taken off the cyclic collector's lists at once (CPython does the same
 * lazily, at the first collection that sees them). That saves the collector a pass over every message. */
static int acyclic(PyObject *o)
{
    return o == Py_None || PyLong_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o)
           || PyBool_Check(o) || (PyTuple_CheckExact(o) && !PyObject_GC_IsTracked(o));
}

static void untrack_if_acyclic(PyObject *t)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        if (!acyclic(PyTuple_GET_ITEM(t, i)))
            return;
    }
    PyObject_GC_UnTrack(t);
}

/* Move the n new references v (NULL items allowed) into t[first..first+n), or release them when t is NULL;
 * -1 when t is NULL or an item was. */
static int set_items(PyObject *t, Py_ssize_t first, PyObject **v, Py_ssize_t n)
{
    int bad = t == NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        bad |= v[i] == NULL;
        if (t != NULL)
            PyTuple_SET_ITEM(t, first + i, v[i]);
        else
            Py_XDECREF(v[i]);
    }
    return bad ? -1 : 0;
}

/* A new tuple of n new references (NULL items allowed: then NULL, the others released). */
static PyObject *tuple_of(PyObject **v, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    if (set_items(t, 0, v, n) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    untrack_if_acyclic(t);
    return t;
}

/* A growable byte buffer that starts on the stack. */
typedef struct {
    char *p;
    Py_ssize_t len, cap;
    char small[256];
} Text;

static void text_init(Text *t)
{
    t->p = t->small;
    t->len = 0;
    t->cap = sizeof t->small;
}

static void text_free(Text *t)
{
    if (t->p != t->small)
        PyMem_Free(t->p);
}

static int text_put(Text *t, const char *s, Py_ssize_t n)
{
    if (t->len + n > t->cap) {
        Py_ssize_t cap = t->cap * 2;
        while (cap < t->len + n)
            cap *= 2;
        char *p = PyMem_Malloc(cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return ERR;
        }
        memcpy(p, t->p, t->len);
        text_free(t);
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    return OK;
}

/* Decimal text of n, then a comma unless last. */
static int text_num(Text *t, unsigned n, int comma)
{
    char s[16];
    int k = snprintf(s, sizeof s, comma ? ",%u" : "%u", n);
    return text_put(t, s, k);
}

static PyObject *decode_text(const char *s, Py_ssize_t n)
{
    return PyUnicode_DecodeUTF8(s, n, "backslashreplace");
}

/* ---------------------------------------------------------------------------------------------
 * Names */

/* b".".join(labels), one label at a time. */
static inline void join_label(char *text, Py_ssize_t *tlen, long *count, const unsigned char *label, unsigned len)
{
    if (*count)
        text[(*tlen)++] = '.';
    memcpy(text + *tlen, label, len);
    *tlen += len;
    (*count)++;
}

/* dnswire._name_from_wire: (text, label count) of an uncompressed name ending with its root label. */
static PyObject *name_from_wire(const unsigned char *w)
{
    char text[MAX_NAME + 1];
    Py_ssize_t tlen = 0, off = 0;
    long count = 0;
    unsigned ln = w[0];
    while (ln) {
        join_label(text, &tlen, &count, w + off + 1, ln);
        off += ln + 1;
        ln = w[off];
    }
    PyObject *v[2] = {decode_text(text, tlen), shared16(count)};
    return tuple_of(v, 2);
}

/* qname, labels = cached (a 2-item sequence). */
static int unpack_cached(PyObject *cached, PyObject **qname, PyObject **labels)
{
    PyObject *seq = PySequence_Fast(cached, "cannot unpack the cached name");
    if (seq == NULL)
        return ERR;
    if (PySequence_Fast_GET_SIZE(seq) != 2) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "cached name: expected 2 values to unpack");
        return ERR;
    }
    *qname = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 0));
    *labels = Py_NewRef(PySequence_Fast_GET_ITEM(seq, 1));
    Py_DECREF(seq);
    return OK;
}

/* The usual first question: an uncompressed name w[0..wlen) ending with its root label, looked up in and
 * added to the names cache (None: no cache). */
static int cached_name(const unsigned char *w, Py_ssize_t wlen, PyObject *names, PyObject **qname,
                       PyObject **labels)
{
    PyObject *key = NULL, *cached = NULL;
    int r = ERR;
    if (names != Py_None) {
        key = PyBytes_FromStringAndSize((const char *)w, wlen);
        if (key == NULL)
            return ERR;
        if (PyDict_CheckExact(names)) {
            cached = PyDict_GetItemWithError(names, key);
            if (cached == NULL && PyErr_Occurred())
                goto done;
            Py_XINCREF(cached);
        } else {
            cached = PyObject_CallMethod(names, "get", "O", key);
            if (cached == NULL)
                goto done;
        }
        if (cached == Py_None)
            Py_CLEAR(cached);
    }
    if (cached == NULL) {
        cached = name_from_wire(w);
        if (cached == NULL)
            goto done;
        if (key != NULL && PyObject_SetItem(names, key, cached) < 0)
            goto done;
    }
    r = unpack_cached(cached, qname, labels);
done:
    Py_XDECREF(key);
    Py_XDECREF(cached);
    return r;
}

/* In front of the names dict, for the dnstap decoder only (api_fill_dns): a direct-mapped table of recent question
 * names (wire bytes inline, with their text and label count). A hit costs one or two cache lines where
 * the dict costs a key object, its hash and four or five scattered objects. The table holds what the
 * dict would give (the text is a function of the wire bytes); parse_message does not use it, so that a
 * caller's dict is filled exactly as the Python walker fills it. */
#define NAME_SLOTS 8192
#define SLOT_WIRE 46
static struct {
    uint16_t len;
    unsigned char wire[SLOT_WIRE];
    PyObject *qname, *labels;
} name_slots[NAME_SLOTS];

/* 1 when the table decided (*r: OK, or ERR), 0 when the caller is to ask the dict (which fills the
 * table through slot_fill). */
static int slot_name(const unsigned char *w, Py_ssize_t wlen, PyObject *names, PyObject **qname, PyObject **labels,
                     int *r)
{
    if (wlen > SLOT_WIRE)
        return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (Py_ssize_t i = 0; i < wlen; i++)
        h = (h ^ w[i]) * 0x100000001B3ull;
    unsigned k = (unsigned)(h ^ (h >> 29)) & (NAME_SLOTS - 1);
    if (name_slots[k].len == wlen && name_slots[k].qname != NULL && memcmp(name_slots[k].wire, w, wlen) == 0) {
        *qname = Py_NewRef(name_slots[k].qname);
        *labels = Py_NewRef(name_slots[k].labels);
        *r = OK;
        return 1;
    }
    *r = cached_name(w, wlen, names, qname, labels);
    if (*r == OK) {
        Py_XSETREF(name_slots[k].qname, Py_NewRef(*qname));
        Py_XSETREF(name_slots[k].labels, Py_NewRef(*labels));
        name_slots[k].len = (uint16_t)wlen;
        memcpy(name_slots[k].wire, w, wlen);
    }
    return 1;
}

/* dnswire.read_name: a possibly compressed name at *off; *off is set to the offset after it. */
static int read_name(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, PyObject **qname, PyObject **labels)
{
    char text[2 * MAX_NAME + 2];
    Py_ssize_t off = *poff, tlen;
    long count;
    int r = read_name_joined(p, n, &off, text, &tlen, &count);
    if (r != OK)
        return r;
    *qname = decode_text(text, tlen);
    if (*qname == NULL)
        return ERR;
    *labels = shared16(count);
    if (*labels == NULL)
        return ERR;
    *poff = off;
    return OK;
}


/* ---------------------------------------------------------------------------------------------
 * OPT */

/* dnswire._algorithms: "1,2,3". */
static PyObject *algorithms(const unsigned char *v, Py_ssize_t len)
{
    Text t;
    text_init(&t);
    for (Py_ssize_t i = 0; i < len; i++) {
        if (text_num(&t, v[i], i > 0) < 0) {
            text_free(&t);
            return NULL;
        }
    }
    PyObject *s = PyUnicode_FromStringAndSize(t.p, t.len);
    text_free(&t);
    return s;
}

/* dnswire._ecs: "address/source-prefix". */
static int client_subnet(const unsigned char *v, Py_ssize_t len, PyObject **out)
{
    if (len < 4)
        return MAL;
    unsigned family = rd16(v), source = v[2];
    Py_ssize_t alen = len - 4;
    unsigned char addr[16] = {0};
    if (family == 1 && alen <= 4) {
        memcpy(addr, v + 4, alen);
        *out = PyUnicode_FromFormat("%u.%u.%u.%u/%u", addr[0], addr[1], addr[2], addr[3], source);
        return *out == NULL ? ERR : OK;
    }
    if (family == 2 && alen <= 16) {
        /* IPv6 text (RFC 5952 with Python's rules for embedded IPv4) from the ipaddress module itself. */
        memcpy(addr, v + 4, alen);
        if (python_attr(&ipv6_address, "ipaddress", "IPv6Address") == NULL)
            return ERR;
        PyObject *obj = PyObject_CallFunction(ipv6_address, "y#", (const char *)addr, (Py_ssize_t)16);
        if (obj == NULL)
            return ERR;
        *out = PyUnicode_FromFormat("%S/%u", obj, source);
        Py_DECREF(obj);
        return *out == NULL ? ERR : OK;
    }
    return MAL;
}

static PyObject *str_or_empty(PyObject *s)
{
    return s != NULL ? s : Py_NewRef(empty_str);
}

static int parse_options(const unsigned char *p, unsigned rclass, uint32_t ttl, Py_ssize_t start, Py_ssize_t end,
                         PyObject **edns);

/* The EDNS tuples of OPT RRs without options, by (UDP size, TTL field): a handful of combinations make
 * up most of the traffic, and one shared tuple each saves two allocations per message. */
#define EDNS_SLOTS 64
static struct {
    uint64_t key;
    PyObject *edns;
} edns_cache[EDNS_SLOTS];

/* dnswire.parse_opt over p[start..end) (inside the message); *edns is set only on OK. */
static int parse_opt(const unsigned char *p, unsigned rclass, uint32_t ttl, Py_ssize_t start, Py_ssize_t end,
                     PyObject **edns)
{
    if (start != end)
        return parse_options(p, rclass, ttl, start, end, edns);
    uint64_t key = ((uint64_t)rclass << 32) | ttl;
    unsigned slot = (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 58);
    if (edns_cache[slot].edns != NULL && edns_cache[slot].key == key) {
        *edns = Py_NewRef(edns_cache[slot].edns);
        return OK;
    }
    int r = parse_options(p, rclass, ttl, start, end, edns);
    if (r == OK) {
        Py_XSETREF(edns_cache[slot].edns, Py_NewRef(*edns));
        edns_cache[slot].key = key;
    }
    return r;
}

static int parse_options(const unsigned char *p, unsigned rclass, uint32_t ttl, Py_ssize_t start, Py_ssize_t end,
                         PyObject **edns)
{
    PyObject *nsid = NULL, *dau = NULL, *dhu = NULL, *n3u = NULL, *ecs = NULL, *ede = NULL;
    PyObject *other = NULL, *ede_tuple = NULL;
    int cookie = 0, r = OK;
    Text codes;
    text_init(&codes);
    for (Py_ssize_t pos = start; pos < end;) {
        if (pos + 4 > end) {
            r = MAL;
            goto done;
        }
        unsigned code = rd16(p + pos), olen = rd16(p + pos + 2);
        const unsigned char *v = p + pos + 4;
        pos += 4 + olen;
        if (pos > end) {
            r = MAL;
            goto done;
        }
        PyObject **slot = NULL, *val = NULL;
        switch (code) {
        case OPT_NSID:
            slot = &nsid;
            val = decode_text((const char *)v, olen);
            break;
        case OPT_DAU:
        case OPT_DHU:
        case OPT_N3U:
            slot = code == OPT_DAU ? &dau : code == OPT_DHU ? &dhu : &n3u;
            val = algorithms(v, olen);
            break;
        case OPT_ECS:
            slot = &ecs;
            r = client_subnet(v, olen, &val);
            if (r != OK)
                goto done;
            break;
        case OPT_EDE: {
            if (olen < 2) {
                r = MAL;
                goto done;
            }
            if (ede == NULL && (ede = PyList_New(0)) == NULL)
                goto error;
            PyObject *info = shared16(rd16(v));
            if (info == NULL)
                goto error;
            int bad = PyList_Append(ede, info);
            Py_DECREF(info);
            if (bad)
                goto error;
            break;
        }
        case OPT_COOKIE:
            cookie = 1;
            break;
        }
        if (slot != NULL) {
            if (val == NULL)
                goto error;
            Py_XSETREF(*slot, val);
        }
        if (olen && code != OPT_NSID && code != OPT_DAU && code != OPT_DHU && code != OPT_N3U) {
            if (text_num(&codes, code, codes.len > 0) < 0)
                goto error;
        }
    }
    other = codes.len ? PyUnicode_FromStringAndSize(codes.p, codes.len) : Py_NewRef(empty_str);
    ede_tuple = ede != NULL ? PyList_AsTuple(ede) : PyTuple_New(0);
    if (other == NULL || ede_tuple == NULL)
        goto error;
    untrack_if_acyclic(ede_tuple);
    PyObject *v[13] = {
        shared16(rclass), shared16((ttl >> 16) & 0xFF), Py_NewRef((ttl & 0x8000) ? Py_True : Py_False),
        shared16(ttl >> 24),
        str_or_empty(nsid), str_or_empty(dau), str_or_empty(dhu), str_or_empty(n3u), str_or_empty(ecs), other,
        ede_tuple, Py_NewRef(cookie ? Py_True : Py_False),
        PyBytes_FromStringAndSize((const char *)p + start, end - start),
    };
    nsid = dau = dhu = n3u = ecs = other = ede_tuple = NULL; /* now in v */
    *edns = tuple_of(v, 13);
    if (*edns == NULL)
        goto error;
    goto done;
error:
    r = ERR;
done:
    text_free(&codes);
    Py_XDECREF(nsid);
    Py_XDECREF(dau);
    Py_XDECREF(dhu);
    Py_XDECREF(n3u);
    Py_XDECREF(ecs);
    Py_XDECREF(ede);
    Py_XDECREF(other);
    Py_XDECREF(ede_tuple);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Messages */

/* dnswire.walk_rrs: step over count RRs from *poff. rtype: type of the last RR; edns (additional
 * section only): the first OPT RR decoded. Outputs are set only on OK, as the Python assignment
 * happens only when the call returns. */
static int walk_rrs(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, unsigned count, unsigned *rtype_out,
                    PyObject **edns_out)
{
    Py_ssize_t off = *poff;
    unsigned rtype = 0;
    PyObject *edns = NULL;
    int r;
    for (unsigned i = 0; i < count; i++) {
        if (skip_name(p, n, &off) != OK || off + 10 > n)
            goto fail;
        rtype = rd16(p + off);
        unsigned rdlen = rd16(p + off + 8);
        off += 10 + rdlen;
        if (rtype == TYPE_OPT && edns_out != NULL && edns == NULL) {
            if (off > n)
                goto fail;
            const unsigned char *h = p + off - rdlen - 8;
            uint32_t ttl = ((uint32_t)h[2] << 24) | ((uint32_t)h[3] << 16) | ((uint32_t)h[4] << 8) | h[5];
            r = parse_opt(p, rd16(h), ttl, off - rdlen, off, &edns);
            if (r != OK)
                goto fail_r;
        }
    }
    *poff = off;
    if (rtype_out != NULL)
        *rtype_out = rtype;
    if (edns_out != NULL)
        *edns_out = edns;
    return OK;
fail:
    r = MAL;
fail_r:
    Py_XDECREF(edns);
    return r;
}

typedef struct {
    PyObject *qname, *labels, *edns; /* NULL: None */
    long qtype, qclass, last_an;     /* -1: None */
} Parsed;

/* The body of dnswire.parse_message after the header; fills m as far as the Python walker gets. */
static int walk(const unsigned char *p, Py_ssize_t n, unsigned qd, unsigned an, unsigned ns, unsigned ar,
                PyObject *names, int slots, Parsed *m)
{
    Py_ssize_t off = 12;
    int r;
    if (qd) {
        unsigned c;
        if (step_labels(p, n, &off, &c) != OK)
            return MAL;
        if (c == 0 && off - 12 < MAX_NAME) {
            if (!slots || !slot_name(p + 12, off + 1 - 12, names, &m->qname, &m->labels, &r))
                r = cached_name(p + 12, off + 1 - 12, names, &m->qname, &m->labels);
            off += 1;
        } else {
            off = 12;
            r = read_name(p, n, &off, &m->qname, &m->labels);
        }
        if (r != OK)
            return r;
        if (off + 4 > n)
            return MAL;
        m->qtype = rd16(p + off);
        m->qclass = rd16(p + off + 2);
        off += 4;
        for (unsigned i = 1; i < qd; i++) {
            if ((r = skip_name(p, n, &off)) != OK)
                return r;
            off += 4;
        }
    }
    if (off > n)
        return MAL;
    if (an) {
        unsigned t;
        if ((r = walk_rrs(p, n, &off, an, &t, NULL)) != OK)
            return r;
        m->last_an = t;
    }
    if (ns && (r = walk_rrs(p, n, &off, ns, NULL, NULL)) != OK)
        return r;
    if (ar && (r = walk_rrs(p, n, &off, ar, NULL, &m->edns)) != OK)
        return r;
    return off > n ? MAL : OK;
}

static PyObject *shared16_or_none(long v)
{
    return v < 0 ? Py_NewRef(Py_None) : shared16(v);
}

/* Empty the names cache when it holds more than max_names entries (max_names < 0: never). */
static int bound_cache(PyObject *names, Py_ssize_t max_names)
{
    if (max_names < 0 || names == Py_None)
        return 0;
    if (PyDict_CheckExact(names)) {
        if (PyDict_GET_SIZE(names) > max_names)
            PyDict_Clear(names);
        return 0;
    }
    Py_ssize_t size = PyObject_Size(names);
    if (size < 0)
        return -1;
    if (size > max_names) {
        PyObject *r = PyObject_CallMethod(names, "clear", NULL);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Store the DNS tuple of the message p[0..n) in t[first..first+N_DNS) (t: a new tuple, items unset); its
 * raw field is raw (NULL: None). *flags_out: the header's flags word or -1 (None); *malformed_out: the
 * malformed flag. */
static int fill_dns(PyObject *t, Py_ssize_t first, const unsigned char *p, Py_ssize_t n, PyObject *raw,
                    PyObject *names, int slots, long *flags_out, int *malformed_out)
{
    Parsed m = {NULL, NULL, NULL, -1, -1, -1};
    long hdr[6] = {-1, -1, -1, -1, -1, -1};
    int malformed = 1;
    if (n >= 12) {
        for (int i = 0; i < 6; i++)
            hdr[i] = rd16(p + 2 * i);
        int r = walk(p, n, hdr[2], hdr[3], hdr[4], hdr[5], names, slots, &m);
        if (r == ERR) {
            Py_XDECREF(m.qname);
            Py_XDECREF(m.labels);
            Py_XDECREF(m.edns);
            return -1;
        }
        malformed = r == MAL;
    }
    PyObject *v[N_DNS];
    v[0] = n < 65536 ? shared16(n) : PyLong_FromSsize_t(n);
    v[1] = hdr[0] < 0 ? Py_NewRef(Py_None) : u16(hdr[0]); /* the ID: random */
    for (int i = 1; i < 6; i++)
        v[1 + i] = shared16_or_none(hdr[i]);
    v[7] = m.qname != NULL ? m.qname : Py_NewRef(Py_None);
    v[8] = shared16_or_none(m.qtype);
    v[9] = shared16_or_none(m.qclass);
    v[10] = m.labels != NULL ? m.labels : Py_NewRef(Py_None);
    v[11] = m.edns != NULL ? m.edns : Py_NewRef(Py_None);
    v[12] = Py_NewRef(malformed ? Py_True : Py_False);
    v[13] = shared16_or_none(m.last_an);
    v[14] = Py_NewRef(raw != NULL ? raw : Py_None);
    if (set_items(t, first, v, N_DNS) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    *flags_out = hdr[1];
    *malformed_out = malformed;
    return 0;
}

static PyObject *parse_message(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *buf, *names = Py_None;
    Py_ssize_t max_names = -1;
    if (!PyArg_ParseTuple(args, "O|On:parse_message", &buf, &names, &max_names))
        return NULL;
    if (bound_cache(names, max_names) < 0)
        return NULL;
    if (!PyBytes_Check(buf)) {
        /* Not bytes: the Python walker, which is the definition (memoryview, bytearray, ...). */
        if (python_attr(&py_parse_message, "probe.decode.dnswire", "parse_message") == NULL)
            return NULL;
        return PyObject_CallFunctionObjArgs(py_parse_message, buf, names, NULL);
    }
    PyObject *t = PyTuple_New(N_DNS);
    if (t == NULL)
        return NULL;
    long flags;
    int malformed;
    if (fill_dns(t, 0, (const unsigned char *)PyBytes_AS_STRING(buf), PyBytes_GET_SIZE(buf), buf, names, 0, &flags,
                 &malformed) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    untrack_if_acyclic(t);
    return t;
}

static PyMethodDef methods[] = {
    {"parse_message", parse_message, METH_VARARGS,
     "parse_message(buf, names=None, max_names=-1) -> the DNS tuple of probe.decode.dnswire.parse_message."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_fastwire",
    .m_doc = "The DNS wire walker, in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastwire(void)
{
    empty_str = PyUnicode_FromStringAndSize("", 0);
    if (empty_str == NULL)
        return NULL;
    return PyModule_Create(&module);
}
