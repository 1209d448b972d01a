/* export.enrich._resolvers: the public resolvers' prefix lists as a table in C, the function of the client
 * address cache (export/lookup.py) of export/enrich/resolvers.py, whose PrefixTable is its Python twin.
 *
 * Why: the cache runs its function for every client it has not seen; through Python (ipaddress, bisect) that
 * was most of the step's cost on traffic with many clients. Here a client's text is parsed with inet_pton and
 * searched among the lists' ranges with a binary search.
 *
 * PrefixTable(v4, v6, fallback): v4 and v6 are lists of (first address, last address, name), the addresses as
 *   big-endian bytes (4 or 16), sorted and disjoint (resolvers.PrefixTable makes them).
 * PrefixTable(text) -> the name of the range holding the address of a client address or client subnet text
 *   ("" when none), read as resolvers.lookup_address reads it. A text that is not an address as inet_ntop writes
 *   it (the form of the probe's columns) goes to fallback(text), the twin, so that both agree on any text. A
 *   table never initialised (made by PrefixTable.__new__ alone) raises RuntimeError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#include "extmodule.h"
#include "valuetext.h"

typedef struct {
    unsigned char first[16], last[16];
    PyObject *name;
} Range;

typedef struct {
    Range *ranges;
    Py_ssize_t n;
} Family;

typedef struct {
    PyObject_HEAD
    Family v4, v6;
    PyObject *fallback;
    PyObject *empty;
} PrefixTable;

static void family_free(Family *f)
{
    for (Py_ssize_t k = 0; k < f->n; k++)
        Py_XDECREF(f->ranges[k].name);
    PyMem_Free(f->ranges);
    f->ranges = NULL;
    f->n = 0;
}

static int family_read(Family *f, PyObject *list, Py_ssize_t size)
{
    PyObject *seq = PySequence_Fast(list, "ranges must be a list of (first, last, name)");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    f->ranges = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Range));
    if (f->ranges == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k), *first, *last, *name;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "SSU", &first, &last, &name) ||
            PyBytes_GET_SIZE(first) != size || PyBytes_GET_SIZE(last) != size) {
            if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "range %zd: not (first, last, name) with addresses of %zd bytes", k,
                             size);
            }
            Py_DECREF(seq);
            return -1;
        }
        Range *r = &f->ranges[k];
        memcpy(r->first, PyBytes_AS_STRING(first), (size_t)size);
        memcpy(r->last, PyBytes_AS_STRING(last), (size_t)size);
        Py_INCREF(name);
        r->name = name;
        f->n = k + 1;
        if (memcmp(r->first, r->last, (size_t)size) > 0 ||
            (k > 0 && memcmp(f->ranges[k - 1].last, r->first, (size_t)size) >= 0)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "range %zd: ranges must be sorted and disjoint", k);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* The name of the range holding address a (size bytes), or NULL. */
static PyObject *family_find(const Family *f, const unsigned char *a, size_t size)
{
    Py_ssize_t lo = 0, hi = f->n; /* the last range whose first address is <= a */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (memcmp(f->ranges[mid].first, a, size) <= 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0 || memcmp(f->ranges[lo - 1].last, a, size) < 0)
        return NULL;
    return f->ranges[lo - 1].name;
}

static PyObject *table_call(PrefixTable *t, PyObject *args, PyObject *kwds)
{
    PyObject *arg;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "PrefixTable takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "U:PrefixTable", &arg))
        return NULL;
    if (t->fallback == NULL) { /* made by PrefixTable.__new__ alone: no fallback, no "" */
        PyErr_SetString(PyExc_RuntimeError, "PrefixTable not initialised (__init__ not called)");
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(arg, &n);
    if (s == NULL)
        return NULL;
    const char *slash = memchr(s, '/', (size_t)n); /* a client subnet: its address */
    if (slash != NULL)
        n = slash - s;
    if (n == 0) {
        Py_INCREF(t->empty);
        return t->empty;
    }
    if (n > 7 && memcmp(s, "::ffff:", 7) == 0 && memchr(s, '.', (size_t)n) != NULL) {
        s += 7; /* IPv4-mapped: the IPv4 address */
        n -= 7;
    }
    char text[64], again[64];
    unsigned char a[16];
    int v6 = memchr(s, ':', (size_t)n) != NULL;
    if (n < (Py_ssize_t)sizeof text) {
        memcpy(text, s, (size_t)n);
        text[n] = 0;
        /* Only an address as inet_ntop writes it: its reading is the twin's (ipaddress) for sure. */
        if (inet_pton(v6 ? AF_INET6 : AF_INET, text, a) == 1 &&
            (v6 ? ipv6_text(a, again) : ipv4_text(a, again)) == n && memcmp(again, text, (size_t)n) == 0) {
            PyObject *name = v6 ? family_find(&t->v6, a, 16) : family_find(&t->v4, a, 4);
            name = name ? name : t->empty;
            Py_INCREF(name);
            return name;
        }
    }
    /* (held: the fallback may call __init__ again, which lets go of the table's reference) */
    PyObject *fallback = Py_NewRef(t->fallback), *name = PyObject_CallOneArg(fallback, arg);
    Py_DECREF(fallback);
    return name;
}

static int table_init(PrefixTable *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"v4", "v6", "fallback", NULL};
    PyObject *v4, *v6, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:PrefixTable", kwlist, &v4, &v6, &fallback))
        return -1;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return -1;
    }
    family_free(&t->v4);
    family_free(&t->v6);
    if (t->empty == NULL && (t->empty = PyUnicode_FromString("")) == NULL)
        return -1;
    Py_INCREF(fallback);
    Py_XSETREF(t->fallback, fallback);
    if (family_read(&t->v4, v4, 4) < 0 || family_read(&t->v6, v6, 16) < 0) {
        family_free(&t->v4);
        family_free(&t->v6);
        return -1;
    }
    return 0;
}

EXT_GC_ONE_REF(table, PrefixTable, fallback)

static void table_dealloc(PrefixTable *t)
{
    PyObject_GC_UnTrack(t);
    table_clear((PyObject *)t);
    family_free(&t->v4);
    family_free(&t->v6);
    Py_CLEAR(t->empty);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyTypeObject PrefixTableType = EXT_TYPE(PrefixTable, "export.enrich._resolvers.PrefixTable", Py_TPFLAGS_HAVE_GC,
    "PrefixTable(v4, v6, fallback): address text -> the name of the range holding it, or \"\".",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)table_init, .tp_dealloc = (destructor)table_dealloc,
    .tp_traverse = table_traverse, .tp_clear = table_clear, .tp_call = (ternaryfunc)table_call);

PyMODINIT_FUNC PyInit__resolvers(void)
{
    return ext_module("export.enrich._resolvers", NULL, NULL, (PyTypeObject *[]){&PrefixTableType, NULL}, NULL, NULL);
}
