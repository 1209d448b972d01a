/* probe.match._match: the per-message loop of the matching stage (probe/match/table.py TransactionTable.add_python) in C.
 *
 * Why: pairing queries with responses in Python was mostly interpreter overhead around a few dict and tuple
 * operations; this does the same operations on the same Python objects. The table's state stays in Python (the
 * `pending` dict: key tuple -> query tuple or list of them, insertion order = expiry order), so expiry, flush and
 * zone transfers keep running the Python code on it. probe/match/table.py keeps the Python loop as the reference
 * and the fallback; tests/match/test_match_c.py compares the two (the same transactions in the same order, the
 * same counters, the same dict in the same order).
 *
 * run(msgs, start, pending, timeout_ns, transfers_open, out, counts, per_key) -> stop
 *   Handles msgs[start:stop] as add_python does: malformed messages are appended to `out` alone, queries
 *   go into `pending` (at most per_key under one key: one more exports the oldest of them), responses take
 *   their query out of it, and `out` gets the (query, response, 1) triples. It stops at the first message it leaves to Python, untouched: a response answering an AXFR
 *   or IXFR query (it may open a transfer), an unanswered response while transfers are open (it may
 *   belong to one), or a value of a type the decoders do not give (stop == len(msgs) when all were
 *   handled). counts is [matched, response_only, duplicate_queries, stored, evicted] (stored: queries put
 *   in pending; evicted: queries exported for per_key), added to for the messages handled.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "fastint.h"

/* Message tuple indexes (probe.model M; the tests compare them with INDEXES). */
enum { TS_NS = 0, SRC = 4, SPORT = 5, DST = 6, DPORT = 7, SCOPE = 13, ID = 16, FLAGS = 17, QNAME = 22,
       QTYPE = 23, MALFORMED = 27, MESSAGE_LEN = 30 };

/* probe.match values (compared by the tests through CONSTANTS). */
enum { FLAG_QR = 0x8000, QTYPE_IXFR = 251, QTYPE_AXFR = 252 };

/* Outcome of a step. PYTHON: leave the message to the Python loop; nothing was changed for it yet, and a
 * Python exception raised on the way was cleared (the Python loop meets it again if it is real). */
enum { FAIL = -1, NO = 0, YES = 1, PYTHON = 2 };

typedef struct {
    PyObject *pending, *out;
    long long timeout;
    int transfers_open;
    Py_ssize_t per_key;
    Py_ssize_t matched, response_only, duplicates, stored, evicted;
} Run;

static PyObject *one; /* the 1 of every (query, response, 1) triple */

/* The value of an exact int that fits in 64 bits; 0 for anything else (which the Python loop handles). */
static int as_int64(PyObject *o, long long *v)
{
    if (compact_int(o, v))
        return 1;
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return !overflow && !(*v == -1 && PyErr_Occurred());
}

/* A message tuple as the decoders make it (a shorter or other object goes to the Python loop). */
static int is_message(PyObject *o)
{
    return PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) >= MESSAGE_LEN;
}

static int emit(Run *run, PyObject *q, PyObject *r)
{
    PyObject *t = PyTuple_Pack(3, q ? q : Py_None, r ? r : Py_None, one);
    if (t == NULL)
        return FAIL;
    int rc = PyList_Append(run->out, t);
    Py_DECREF(t);
    return rc < 0 ? FAIL : YES;
}

/* The pending dict's operations with the key hashed once per message: CPython's dict functions for a known
 * hash where it has them (3.10 to 3.12), else the public ones, which hash the key again. */
#if PY_VERSION_HEX < 0x030D0000
static PyObject *dict_get(PyObject *d, PyObject *key, Py_hash_t hash)
{
    return _PyDict_GetItem_KnownHash(d, key, hash);
}

static int dict_set(PyObject *d, PyObject *key, Py_hash_t hash, PyObject *value)
{
    return _PyDict_SetItem_KnownHash(d, key, value, hash);
}

static int dict_del(PyObject *d, PyObject *key, Py_hash_t hash)
{
    return _PyDict_DelItem_KnownHash(d, key, hash);
}
#else
static PyObject *dict_get(PyObject *d, PyObject *key, Py_hash_t hash)
{
    return PyDict_GetItemWithError(d, key);
}

static int dict_set(PyObject *d, PyObject *key, Py_hash_t hash, PyObject *value)
{
    return PyDict_SetItem(d, key, value);
}

static int dict_del(PyObject *d, PyObject *key, Py_hash_t hash)
{
    return PyDict_DelItem(d, key);
}
#endif

/* (scope, client, client port, server, server port, id): a query's key is (SCOPE, SRC, SPORT, DST, DPORT, ID),
 * a response's the same with the two ends swapped. */
static PyObject *make_key(PyObject *m, int response)
{
    PyObject *t = PyTuple_New(6);
    if (t == NULL)
        return NULL;
    PyObject **v = &PyTuple_GET_ITEM(m, 0);
    PyObject *items[6] = {v[SCOPE], v[response ? DST : SRC], v[response ? DPORT : SPORT],
                          v[response ? SRC : DST], v[response ? SPORT : DPORT], v[ID]};
    for (int k = 0; k < 6; k++)
        PyTuple_SET_ITEM(t, k, Py_NewRef(items[k]));
    return t;
}

/* qname == rname or qname.lower() == rname.lower(), for two exact str. ASCII names (nearly all) are compared
 * here: str.lower() changes only A-Z in them. Names with other characters (the decoders keep non-UTF-8 bytes
 * as backslash escapes, but UTF-8 is decoded) go through str.lower() itself, whose Unicode rules can even
 * make a non-ASCII name equal an ASCII one (KELVIN SIGN lowers to k). */
static int same_name(PyObject *a, PyObject *b)
{
    if (a == b)
        return YES;
    if (PyUnicode_IS_ASCII(a) && PyUnicode_IS_ASCII(b)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(a);
        if (n != PyUnicode_GET_LENGTH(b))
            return NO;
        const unsigned char *x = PyUnicode_1BYTE_DATA(a), *y = PyUnicode_1BYTE_DATA(b);
        for (Py_ssize_t k = 0; k < n; k++) {
            unsigned char c = x[k], d = y[k];
            if (c != d && ((c | 0x20) != (d | 0x20) || (unsigned char)((c | 0x20) - 'a') > 'z' - 'a'))
                return NO;
        }
        return YES;
    }
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq != 0)
        return eq < 0 ? PYTHON : YES;
    PyObject *la = PyObject_CallMethod(a, "lower", NULL);
    PyObject *lb = la ? PyObject_CallMethod(b, "lower", NULL) : NULL;
    eq = lb ? PyObject_RichCompareBool(la, lb, Py_EQ) : -1;
    Py_XDECREF(la);
    Py_XDECREF(lb);
    return eq < 0 ? PYTHON : eq ? YES : NO;
}

static int is_int_or_none(PyObject *o)
{
    return o == Py_None || PyLong_CheckExact(o);
}

/* match._answers: the pending query q (with the response's key) is the one response r answers. */
static int answers(PyObject *q, PyObject *r, long long min_ts)
{
    if (!is_message(q))
        return PYTHON;
    long long ts;
    if (!as_int64(PyTuple_GET_ITEM(q, TS_NS), &ts))
        return PYTHON;
    PyObject *rname = PyTuple_GET_ITEM(r, QNAME);
    if (rname == Py_None) /* response without a question: the query with this ID */
        return ts >= min_ts ? YES : NO;
    PyObject *qname = PyTuple_GET_ITEM(q, QNAME);
    if (!PyUnicode_CheckExact(rname) || (qname != Py_None && !PyUnicode_CheckExact(qname)))
        return PYTHON;
    PyObject *qtype = PyTuple_GET_ITEM(q, QTYPE), *rtype = PyTuple_GET_ITEM(r, QTYPE);
    if (!is_int_or_none(qtype) || !is_int_or_none(rtype))
        return PYTHON; /* so that comparing them runs no Python code */
    int eq = PyObject_RichCompareBool(qtype, rtype, Py_EQ);
    if (eq <= 0)
        return eq < 0 ? PYTHON : NO;
    if (qname == Py_None)
        return NO;
    int same = same_name(qname, rname);
    if (same != YES)
        return same;
    return ts >= min_ts ? YES : NO;
}

/* Whether q asked for a zone transfer (whose response Python handles); PYTHON for an odd QTYPE. */
static int is_transfer(PyObject *q)
{
    PyObject *qtype = PyTuple_GET_ITEM(q, QTYPE);
    long long t;
    if (qtype == Py_None)
        return NO;
    if (!as_int64(qtype, &t))
        return PYTHON;
    return t == QTYPE_AXFR || t == QTYPE_IXFR ? YES : NO;
}

/* match._take without the removal: the index in `queries` of the oldest query r answers, -1 for none, or
 * -2 when one of them needs the Python loop. */
static Py_ssize_t find_answered(PyObject *queries, PyObject *r, long long min_ts)
{
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(queries); k++) {
        int a = answers(PyList_GET_ITEM(queries, k), r, min_ts);
        if (a == YES)
            return k;
        if (a != NO)
            return -2;
    }
    return -1;
}

/* The query `waiting` (the pending value under key) holds that r answers, removed from pending as the Python
 * loop removes it, as a new reference in *q (NULL when none answers). */
static int take(Run *run, PyObject *key, Py_hash_t hash, PyObject *waiting, PyObject *r, PyObject **q)
{
    long long ts, min_ts;
    *q = NULL;
    /* Queries older than the timeout (capture time) no longer match, even when their expiry has not run yet. */
    if (!as_int64(PyTuple_GET_ITEM(r, TS_NS), &ts) || __builtin_sub_overflow(ts, run->timeout, &min_ts))
        return PYTHON;
    Py_ssize_t k = -1;
    if (PyList_CheckExact(waiting)) {
        k = find_answered(waiting, r, min_ts);
        if (k == -2)
            return PYTHON;
        if (k < 0)
            return NO;
        *q = PyList_GET_ITEM(waiting, k);
    } else {
        int a = answers(waiting, r, min_ts);
        if (a != YES)
            return a;
        *q = waiting;
    }
    int t = is_transfer(*q);
    if (t != NO) {
        *q = NULL;
        return PYTHON; /* a zone transfer may start here: the Python loop opens it */
    }
    Py_INCREF(*q);
    int rc;
    if (k >= 0) {
        rc = PyList_SetSlice(waiting, k, k + 1, NULL);
        if (rc == 0 && PyList_GET_SIZE(waiting) == 0)
            rc = dict_del(run->pending, key, hash);
    } else {
        rc = dict_del(run->pending, key, hash);
    }
    if (rc < 0) {
        Py_CLEAR(*q);
        return FAIL;
    }
    return YES;
}

static int response(Run *run, PyObject *r)
{
    PyObject *key = make_key(r, 1);
    if (key == NULL)
        return FAIL;
    Py_hash_t hash = PyObject_Hash(key);
    PyObject *waiting = hash == -1 ? NULL : dict_get(run->pending, key, hash);
    int rc;
    if (waiting == NULL) {
        rc = PyErr_Occurred() ? PYTHON : NO;
    } else {
        PyObject *q;
        Py_INCREF(waiting); /* comparing odd values could run code that changes pending */
        rc = take(run, key, hash, waiting, r, &q);
        Py_DECREF(waiting);
        if (rc == YES) {
            run->matched++;
            rc = emit(run, q, r);
            Py_DECREF(q);
        }
    }
    Py_DECREF(key);
    if (rc == NO) {
        if (run->transfers_open)
            return PYTHON; /* it may continue an open zone transfer */
        run->response_only++;
        return emit(run, NULL, r);
    }
    if (rc == PYTHON)
        PyErr_Clear();
    return rc;
}

/* A query waits in pending under its key; a second one with the same key (a retry reusing ID and port) makes
 * the value a list, oldest first. Replacing the value keeps the key's place in the dict, as in Python. A key
 * holds at most per_key queries: one more exports the oldest of them as query-only (evicted), so that a flood
 * of queries under one key neither grows its list without bound nor makes every response scan it all. */
static int query(Run *run, PyObject *m)
{
    PyObject *key = make_key(m, 0);
    if (key == NULL)
        return FAIL;
    int rc = YES;
    Py_hash_t hash = PyObject_Hash(key);
    PyObject *waiting = hash == -1 ? NULL : dict_get(run->pending, key, hash);
    if (waiting == NULL) {
        if (PyErr_Occurred()) {
            PyErr_Clear();
            rc = PYTHON;
        } else if (dict_set(run->pending, key, hash, m) < 0) {
            rc = FAIL;
        }
    } else {
        run->duplicates++;
        PyObject *oldest = NULL; /* evicted for per_key, strong reference */
        if (PyList_CheckExact(waiting)) {
            if (PyList_GET_SIZE(waiting) >= run->per_key) {
                oldest = Py_NewRef(PyList_GET_ITEM(waiting, 0));
                rc = PyList_SetSlice(waiting, 0, 1, NULL) < 0 ? FAIL : YES;
            }
            if (rc == YES)
                rc = PyList_Append(waiting, m) < 0 ? FAIL : YES;
        } else if (run->per_key <= 1) {
            oldest = Py_NewRef(waiting);
            rc = dict_set(run->pending, key, hash, m) < 0 ? FAIL : YES;
        } else {
            PyObject *both = PyList_New(2);
            if (both == NULL) {
                rc = FAIL;
            } else {
                PyList_SET_ITEM(both, 0, Py_NewRef(waiting));
                PyList_SET_ITEM(both, 1, Py_NewRef(m));
                rc = dict_set(run->pending, key, hash, both) < 0 ? FAIL : YES;
                Py_DECREF(both);
            }
        }
        if (oldest != NULL) {
            if (rc == YES) {
                run->evicted++;
                rc = emit(run, oldest, NULL);
            }
            Py_DECREF(oldest);
        }
    }
    if (rc == YES)
        run->stored++;
    Py_DECREF(key);
    return rc;
}

static int step(Run *run, PyObject *m)
{
    if (!is_message(m))
        return PYTHON;
    PyObject *malformed = PyTuple_GET_ITEM(m, MALFORMED), *flags_obj = PyTuple_GET_ITEM(m, FLAGS);
    long long flags = 0;
    if ((malformed != Py_True && malformed != Py_False) || (flags_obj != Py_None && !as_int64(flags_obj, &flags))
        || (flags_obj == Py_None && malformed == Py_False))
        return PYTHON;
    if (malformed == Py_True) /* exported alone: on the query side unless the header says response */
        return flags & FLAG_QR ? emit(run, NULL, m) : emit(run, m, NULL);
    return flags & FLAG_QR ? response(run, m) : query(run, m);
}

/* The messages of a batch no longer fit in the L2 cache when matching starts (the decoder made them all
 * first), and most of the loop's time went into waiting for their tuples and fields: they are prefetched a few
 * messages ahead, the tuple first, then (once it has arrived) the objects the loop reads. */
enum { AHEAD_TUPLE = 16, AHEAD_FIELDS = 8 };

static void prefetch_tuple(PyObject *m)
{
    const char *p = (const char *)m;
    for (int line = 0; line < 4; line++) /* header and items up to MALFORMED */
        __builtin_prefetch(p + 64 * line, 0);
}

static void prefetch_fields(PyObject *m)
{
    if (!is_message(m))
        return;
    static const int read[] = {TS_NS, FLAGS, QNAME};
    static const int counted[] = {SCOPE, SRC, SPORT, DST, DPORT, ID}; /* referenced by the key: written to */
    for (size_t k = 0; k < sizeof read / sizeof read[0]; k++)
        __builtin_prefetch(PyTuple_GET_ITEM(m, read[k]), 0);
    for (size_t k = 0; k < sizeof counted / sizeof counted[0]; k++)
        __builtin_prefetch(PyTuple_GET_ITEM(m, counted[k]), 1);
}

enum { N_COUNTS = 5 };

/* counts[k] += add[k] for the counters. The addition may run Python code (a count's __add__) that changes
 * the list: the item is held across it and the size checked again. */
static int add_counts(PyObject *counts, const Py_ssize_t add[N_COUNTS])
{
    for (Py_ssize_t k = 0; k < N_COUNTS; k++) {
        if (k >= PyList_GET_SIZE(counts)) {
            PyErr_SetString(PyExc_RuntimeError, "run: counts changed size");
            return -1;
        }
        PyObject *sum = NULL, *old = Py_NewRef(PyList_GET_ITEM(counts, k)), *n = PyLong_FromSsize_t(add[k]);
        if (n != NULL)
            sum = PyNumber_Add(old, n);
        Py_XDECREF(n);
        Py_DECREF(old);
        if (sum == NULL || PyList_SetItem(counts, k, sum) < 0)
            return -1;
    }
    return 0;
}

static PyObject *run_match(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *msgs, *counts;
    Py_ssize_t i;
    Run run = {0};
    if (!PyArg_ParseTuple(args, "OnO!LpO!O!n", &msgs, &i, &PyDict_Type, &run.pending, &run.timeout,
                          &run.transfers_open, &PyList_Type, &run.out, &PyList_Type, &counts, &run.per_key))
        return NULL;
    if (!PyDict_CheckExact(run.pending) || PyList_GET_SIZE(counts) != N_COUNTS || run.per_key < 1) {
        PyErr_SetString(PyExc_TypeError, "run: pending must be a dict, counts a list of 5 ints and per_key >= 1");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(msgs, "run: msgs must be a sequence");
    if (seq == NULL)
        return NULL;
    int rc = YES;
    for (i = i < 0 ? 0 : i; i < PySequence_Fast_GET_SIZE(seq); i++) {
        /* (read again each time: comparing values of odd types could run code that changes msgs) */
        PyObject **items = PySequence_Fast_ITEMS(seq);
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (i + AHEAD_TUPLE < n)
            prefetch_tuple(items[i + AHEAD_TUPLE]);
        if (i + AHEAD_FIELDS < n)
            prefetch_fields(items[i + AHEAD_FIELDS]);
        PyObject *m = Py_NewRef(items[i]);
        rc = step(&run, m);
        Py_DECREF(m);
        if (rc == FAIL || rc == PYTHON)
            break;
    }
    Py_DECREF(seq);
    const Py_ssize_t add[N_COUNTS] = {run.matched, run.response_only, run.duplicates, run.stored, run.evicted};
    if (rc == FAIL || add_counts(counts, add) < 0)
        return NULL;
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"run", run_match, METH_VARARGS,
     "run(msgs, start, pending, timeout_ns, transfers_open, out, counts, per_key) -> stop: TransactionTable.add_python's "
     "loop from msgs[start], up to the first message it leaves to Python (len(msgs) when none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "probe.match._match", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__match(void)
{
    one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    PyObject *indexes = Py_BuildValue("{sisisisisisisisisisisisi}", "TS_NS", TS_NS, "SCOPE", SCOPE, "SRC", SRC,
                                      "SPORT", SPORT, "DST", DST, "DPORT", DPORT, "ID", ID, "FLAGS", FLAGS, "QNAME",
                                      QNAME, "QTYPE", QTYPE, "MALFORMED", MALFORMED, "MESSAGE_LEN", MESSAGE_LEN);
    PyObject *constants = Py_BuildValue("{sisisi}", "FLAG_QR", FLAG_QR, "QTYPE_IXFR", QTYPE_IXFR, "QTYPE_AXFR",
                                        QTYPE_AXFR);
    if (PyModule_AddObject(mod, "INDEXES", indexes) < 0 || PyModule_AddObject(mod, "CONSTANTS", constants) < 0) {
        Py_XDECREF(indexes);
        Py_XDECREF(constants);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
