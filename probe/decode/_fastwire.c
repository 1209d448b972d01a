/* probe.decode._fastwire: the DNS part of a message tuple (probe/decode/dnswire.py parse_message, its reference)
 * from the walk of include/wire.c.
 *
 * Why: walking a DNS message in Python (probe/decode/dnswire.py) was the largest part of decoding a message
 * tuple; PacketDecoder's Python frame loop (the frames the record decoder declines) calls parse_message with
 * decode.parser fast.
 * The walk is wire.h's (the one DNS walker, shared with the record decoder); this module makes the Python objects
 * of what it found, rule for rule as probe/decode/dnswire.py does: dnswire.py stays the reference (and
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

#include "extmodule.h"
#include "model.h"
#include "valuetext.h"
#include "wire.h"

static PyObject *empty_str, *py_parse_message;

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

static PyObject *decode_text(const char *s, Py_ssize_t n)
{
    return PyUnicode_DecodeUTF8(s, n, "backslashreplace");
}

/* ---------------------------------------------------------------------------------------------
 * Names */

/* (text, label count) of the first question's name, uncompressed: wire[0..wlen) (Walk.qwire). */
static PyObject *name_tuple(const unsigned char *wire, Py_ssize_t wlen, const Walk *w)
{
    char joined[MAX_NAME];
    PyObject *v[2] = {decode_text(joined, qname_from_wire(wire, wlen, joined)), shared16(w->labels)};
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

/* The usual first question: an uncompressed name w[0..wlen) ending with its root label (walk: its text), looked
 * up in and added to the names cache (None: no cache). */
static int cached_name(const unsigned char *w, Py_ssize_t wlen, const Walk *walk, PyObject *names, PyObject **qname,
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
        cached = name_tuple(w, wlen, walk);
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

/* ---------------------------------------------------------------------------------------------
 * OPT */

/* A str of the text fill writes of v[0..len) into a buffer of `room` bytes. */
static PyObject *text_of(Py_ssize_t (*fill)(const unsigned char *, size_t, char *), const unsigned char *v,
                         Py_ssize_t len, size_t room)
{
    char *buf = PyMem_Malloc(room);
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = fill(v, (size_t)len, buf);
    PyObject *s = n < 0 ? NULL : PyUnicode_FromStringAndSize(buf, n);
    PyMem_Free(buf);
    return s;
}

/* The text of option kind k (AT_NSID...) at p + at (-1: none, ""). */
static PyObject *option_text(const unsigned char *p, Py_ssize_t at, int k)
{
    if (at < 0)
        return Py_NewRef(empty_str);
    const unsigned char *v = p + at + 4;
    unsigned olen = rd16(p + at + 2);
    if (k == AT_NSID)
        return decode_text((const char *)v, olen);
    return k == AT_ECS ? text_of(ecs_text, v, olen, 64) : text_of(algorithms_text, v, olen, 4 * (size_t)olen + 1);
}

/* dnswire.parse_opt over the options of the walk's OPT RR (OptScan: the walk checked them). */
static PyObject *parse_options(const unsigned char *p, const Walk *w)
{
    PyObject *text[N_OPT_TEXTS] = {NULL}, *other = NULL, *ede = PyTuple_New(w->opts.n_ede);
    Py_ssize_t n_ede = 0;
    for (Py_ssize_t pos = w->opt_start; ede != NULL && pos < w->opt_end; pos += 4 + rd16(p + pos + 2)) {
        PyObject *info = rd16(p + pos) == OPT_EDE ? shared16(rd16(p + pos + 4)) : Py_None;
        if (info == NULL)
            Py_CLEAR(ede);
        else if (info != Py_None)
            PyTuple_SET_ITEM(ede, n_ede++, info);
    }
    for (int k = 0; k < N_OPT_TEXTS; k++)
        text[k] = option_text(p, w->opts.last[k], k);
    char *codes = PyMem_Malloc(2 * (size_t)(w->opt_end - w->opt_start) + 1);
    other = codes ? PyUnicode_FromStringAndSize(codes, other_codes_text(p, w, codes)) : PyErr_NoMemory();
    PyMem_Free(codes);
    if (ede != NULL)
        untrack_if_acyclic(ede);
    unsigned ttl = w->opt_ttl;
    PyObject *v[N_EDNS_FIELDS] = {
        [E_UDP_SIZE] = shared16(w->opt_class), [E_VERSION] = shared16((ttl >> 16) & 0xFF),
        [E_DO] = Py_NewRef((ttl & 0x8000) ? Py_True : Py_False), [E_EXT_RCODE] = shared16(ttl >> 24),
        [E_NSID] = text[AT_NSID], [E_DAU] = text[AT_DAU], [E_DHU] = text[AT_DHU], [E_N3U] = text[AT_N3U],
        [E_CLIENT_SUBNET] = text[AT_ECS], [E_OTHER] = other, [E_EDE] = ede,
        [E_COOKIE] = Py_NewRef(w->opts.cookie ? Py_True : Py_False),
        [E_RDATA] = PyBytes_FromStringAndSize((const char *)p + w->opt_start, w->opt_end - w->opt_start),
    };
    return tuple_of(v, N_EDNS_FIELDS);
}

/* The EDNS tuples of OPT RRs without options, by (UDP size, TTL field): a handful of combinations make
 * up most of the traffic, and one shared tuple each saves two allocations per message. */
#define EDNS_SLOTS 64
static struct {
    uint64_t key;
    PyObject *edns;
} edns_cache[EDNS_SLOTS];

/* dnswire.parse_opt for the walk's OPT RR: its EDNS tuple (NULL with an exception). */
static PyObject *parse_opt(const unsigned char *p, const Walk *w)
{
    if (w->opt_start != w->opt_end)
        return parse_options(p, w);
    uint64_t key = ((uint64_t)w->opt_class << 32) | w->opt_ttl;
    unsigned slot = (unsigned)((key * 0x9E3779B97F4A7C15ull) >> 58);
    if (edns_cache[slot].edns != NULL && edns_cache[slot].key == key)
        return Py_NewRef(edns_cache[slot].edns);
    PyObject *edns = parse_options(p, w);
    if (edns != NULL) {
        Py_XSETREF(edns_cache[slot].edns, Py_NewRef(edns));
        edns_cache[slot].key = key;
    }
    return edns;
}

/* ---------------------------------------------------------------------------------------------
 * Messages */

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

/* The first question's name of walk w over p: *qname and *labels (new references; NULL: None). */
static int question_name(const unsigned char *p, const Walk *w, PyObject *names, PyObject **qname, PyObject **labels)
{
    if (!w->has_qname)
        return OK;
    if (w->qwire)
        return cached_name(p + 12, w->qwire, w, names, qname, labels);
    *qname = decode_text(w->joined, w->jlen);
    *labels = *qname != NULL ? shared16(w->labels) : NULL;
    return *labels != NULL ? OK : ERR;
}

/* The DNS tuple of dnswire.parse_message(buf, names) for bytes buf. */
static PyObject *dns_tuple(PyObject *buf, PyObject *names)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(buf);
    Py_ssize_t n = PyBytes_GET_SIZE(buf);
    PyObject *qname = NULL, *labels = NULL, *edns = NULL;
    Walk w;
    walk_message(p, n, &w);
    int r = question_name(p, &w, names, &qname, &labels);
    if (r == OK && w.has_opt && (edns = parse_opt(p, &w)) == NULL)
        r = ERR;
    if (r != OK) {
        Py_XDECREF(qname);
        Py_XDECREF(labels);
        return NULL;
    }
    PyObject *v[N_DNS_FIELDS] = {
        [D_DNS_LEN] = n < 65536 ? shared16(n) : PyLong_FromSsize_t(n),
        [D_ID] = w.id < 0 ? Py_NewRef(Py_None) : u16(w.id), /* the ID: random */
        [D_FLAGS] = shared16_or_none(w.flags), [D_QDCOUNT] = shared16_or_none(w.qd),
        [D_ANCOUNT] = shared16_or_none(w.an), [D_NSCOUNT] = shared16_or_none(w.ns),
        [D_ARCOUNT] = shared16_or_none(w.ar), [D_QNAME] = qname != NULL ? qname : Py_NewRef(Py_None),
        [D_QTYPE] = shared16_or_none(w.qtype), [D_QCLASS] = shared16_or_none(w.qclass),
        [D_LABELS] = labels != NULL ? labels : Py_NewRef(Py_None), [D_EDNS] = edns != NULL ? edns : Py_NewRef(Py_None),
        [D_MALFORMED] = Py_NewRef(w.malformed ? Py_True : Py_False), [D_LAST_AN_TYPE] = shared16_or_none(w.last_an),
        [D_RAW] = Py_NewRef(buf),
    };
    return tuple_of(v, N_DNS_FIELDS);
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
    return dns_tuple(buf, names);
}

static PyMethodDef methods[] = {
    {"parse_message", parse_message, METH_VARARGS,
     "parse_message(buf, names=None, max_names=-1) -> the DNS tuple of probe.decode.dnswire.parse_message."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__fastwire(void)
{
    empty_str = PyUnicode_FromStringAndSize("", 0);
    if (empty_str == NULL)
        return NULL;
    return ext_module("probe.decode._fastwire", "The DNS wire walker, in C.", methods, NULL, NULL, NULL);
}
