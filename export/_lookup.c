/* export._lookup: a per-worker cache of a function of text, applied to a string column in one pass (its Python
 * reference: LookupCache.columns_python in export/lookup.py).
 *
 * Why: the enrichment steps and client privacy map columns whose values repeat (client addresses, client
 * subnets) through Python functions (a MaxMind lookup, a prefix list, Crypto-PAn). Done with Arrow, each step
 * paid a per-row dictionary encoding and take, and per distinct value of every batch a dict probe and the
 * conversions to and from Python. Here the column's buffers are read once, each row's text probes a hash table
 * in C, and the function runs in Python only for a text the cache has not seen. export/lookup.py holds the
 * Python twin (Arrow's dictionary encoding and a dict); tests/export/test_lookup.py compares the two.
 *
 * TextCache(function, width=1, size=200000, seed=None)
 *   function(text) -> str (width 1) or a tuple of `width` str; size: entries kept (all dropped when full);
 *   seed: of the hash (None: a random one; the tests give theirs to make texts collide).
 * TextCache.columns(length, offset, buffers, null) -> [(null_count, validity, offsets, data)] * width
 *   the function's results for each row of the string column (strcolumn.h); a null row gives `null` (a str) in
 *   every result column, or a null when `null` is None.
 * TextCache.clear(); len(TextCache): entries held.
 * The function must not use its cache: columns(), clear() and __init__ from inside it are a RuntimeError, as is
 * columns() of a cache never initialised.
 *
 * The table is open addressing with linear probing and a hash seeded per cache. A text whose probe would run
 * longer than MAX_PROBE slots is not kept (the function runs for it each time): values crafted to collide,
 * such as spoofed client addresses, then cost what uncached lookups cost, never a long walk per row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "extmodule.h"
#include "strcolumn.h"

#define MAX_PROBE 32
#define MAX_WIDTH 16

/* A text and its results are one record of the arena: uint32 key length, the key's bytes, then per result a
 * uint32 length and its bytes; a slot points at it, so that a hit reads the slot and one record. */
typedef struct {
    uint32_t hash; /* high bits of the text's hash (a cheap first comparison) */
    uint32_t at;   /* arena offset of the record + 1; 0: empty */
} Slot;

typedef struct {
    PyObject_HEAD
    PyObject *function;
    int width;
    Py_ssize_t size;
    uint64_t seed;
    Slot *slots;
    size_t mask; /* slots - 1 (a power of two); no table before the first record */
    size_t used; /* records */
    char *arena;
    size_t arena_len, arena_cap;
    int busy; /* in columns(): the function must not use the cache it fills */
} TextCache;

static inline uint32_t get32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The size of the record at p. */
static size_t record_size(const TextCache *c, const char *p)
{
    size_t size = 4 + get32(p);
    for (int k = 0; k < c->width; k++)
        size += 4 + get32(p + size);
    return size;
}

static void drop_entries(TextCache *c)
{
    PyMem_Free(c->slots);
    PyMem_Free(c->arena);
    c->slots = NULL;
    c->arena = NULL;
    c->mask = 0;
    c->used = c->arena_len = c->arena_cap = 0;
}

/* Put the record at arena offset `at` in the first free slot of its probe (none within MAX_PROBE: left out). */
static inline void place(Slot *slots, size_t mask, uint64_t h, size_t at)
{
    size_t i = h & mask;
    for (int probe = 0; probe < MAX_PROBE; probe++, i = (i + 1) & mask) {
        if (slots[i].at == 0) {
            slots[i] = (Slot){(uint32_t)(h >> 32), (uint32_t)(at + 1)};
            return;
        }
    }
}

static int grow_slots(TextCache *c)
{
    size_t cap = c->slots == NULL ? 1024 : 2 * (c->mask + 1);
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t at = 0; at < c->arena_len; at += record_size(c, c->arena + at)) {
        uint32_t n = get32(c->arena + at);
        place(slots, cap - 1, text_hash(c->arena + at + 4, n, c->seed), at);
    }
    PyMem_Free(c->slots);
    c->slots = slots;
    c->mask = cap - 1;
    return 0;
}

/* The record of text s (its arena offset + 1; 0: none). */
static inline size_t find(const TextCache *c, const char *s, size_t n, uint64_t h)
{
    if (c->slots == NULL)
        return 0;
    size_t i = h & c->mask;
    for (int probe = 0; probe < MAX_PROBE; probe++, i = (i + 1) & c->mask) {
        Slot sl = c->slots[i];
        if (sl.at == 0)
            return 0;
        if (sl.hash == (uint32_t)(h >> 32)) {
            const char *p = c->arena + sl.at - 1;
            if (get32(p) == n && text_eq(p + 4, s, n))
                return sl.at;
        }
    }
    return 0;
}

/* The function's results for text s: a new list of `width` str (NULL: an exception). */
static PyObject *call(TextCache *c, const char *s, size_t n)
{
    PyObject *key = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "strict");
    if (key == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(c->function, key);
    Py_DECREF(key);
    if (r == NULL)
        return NULL;
    PyObject *list = NULL;
    if (c->width == 1 && PyUnicode_Check(r)) {
        list = PyList_New(1);
        if (list != NULL)
            PyList_SET_ITEM(list, 0, r);
        else
            Py_DECREF(r);
        return list;
    }
    if (c->width > 1 && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == c->width) {
        list = PySequence_List(r);
        for (int k = 0; list != NULL && k < c->width; k++) {
            if (!PyUnicode_Check(PyList_GET_ITEM(list, k)))
                Py_CLEAR(list);
        }
    }
    if (list == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "the lookup function must return %s, not %R",
                     c->width == 1 ? "a str" : "a tuple of str (one per result column)", r);
    Py_DECREF(r);
    return list;
}

/* The record of text s with the function's results, made (arena offset + 1; 0: an exception). Kept when its
 * probe has room; else written past the records (a scratch record, overwritten by the next one made). */
static size_t make(TextCache *c, const char *s, size_t n, uint64_t h)
{
    PyObject *results = call(c, s, n);
    if (results == NULL)
        return 0;
    const char *text[MAX_WIDTH];
    Py_ssize_t len[MAX_WIDTH];
    size_t need = 4 + n, at = 0;
    for (int k = 0; k < c->width; k++) {
        text[k] = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(results, k), &len[k]);
        if (text[k] == NULL)
            goto done;
        need += 4 + (size_t)len[k];
    }
    if (need > UINT32_MAX / 4) {
        PyErr_SetString(PyExc_OverflowError, "lookup key or results over 1 GiB");
        goto done;
    }
    /* Full (records, or what their offsets can address): start again, a worker's memory stays bounded. */
    if ((Py_ssize_t)c->used >= c->size || c->arena_len + need > UINT32_MAX - 1)
        drop_entries(c);
    if (c->slots == NULL || 2 * (c->used + 1) > c->mask + 1) {
        if (grow_slots(c) < 0)
            goto done;
    }
    if (c->arena_len + need > c->arena_cap) {
        char *arena = ext_grow(c->arena, &c->arena_cap, c->arena_len + need, 1, 1 << 16);
        if (arena == NULL)
            goto done;
        c->arena = arena;
    }
    char *p = c->arena + c->arena_len;
    uint32_t l = (uint32_t)n;
    memcpy(p, &l, 4);
    memcpy(p + 4, s, n);
    p += 4 + n;
    for (int k = 0; k < c->width; k++) {
        l = (uint32_t)len[k];
        memcpy(p, &l, 4);
        memcpy(p + 4, text[k], (size_t)len[k]);
        p += 4 + (size_t)len[k];
    }
    at = c->arena_len + 1;
    size_t i = h & c->mask;
    for (int probe = 0; probe < MAX_PROBE; probe++, i = (i + 1) & c->mask) {
        if (c->slots[i].at == 0) {
            c->slots[i] = (Slot){(uint32_t)(h >> 32), (uint32_t)at};
            c->arena_len += need;
            c->used++;
            break;
        }
    }
done:
    Py_DECREF(results);
    return at;
}

static int put_results(const TextCache *c, size_t at, TextOut *outs, Py_ssize_t i)
{
    const char *p = c->arena + at - 1;
    p += 4 + get32(p);
    for (int k = 0; k < c->width; k++) {
        uint32_t l = get32(p);
        if (textout_put(&outs[k], i, p + 4, l) < 0)
            return -1;
        p += 4 + l;
    }
    return 0;
}

#define BUSY "TextCache used by its own lookup function"

/* 0, or -1 with RuntimeError: a cache made without __init__ (TextCache.__new__) has no function, and one whose
 * columns() is running (its function calling back) must not be read, dropped or reset under it. */
static int usable(const TextCache *c)
{
    if (c->busy) {
        PyErr_SetString(PyExc_RuntimeError, BUSY);
        return -1;
    }
    if (c->function == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "TextCache not initialised (__init__ not called)");
        return -1;
    }
    return 0;
}

static PyObject *cache_columns(TextCache *c, PyObject *args)
{
    Py_ssize_t n, offset;
    PyObject *buffers, *null;
    if (!PyArg_ParseTuple(args, "nnOO:columns", &n, &offset, &buffers, &null))
        return NULL;
    const char *fill = NULL;
    Py_ssize_t fill_len = 0;
    if (null != Py_None) {
        if (!PyUnicode_Check(null)) {
            PyErr_SetString(PyExc_TypeError, "null must be a str or None");
            return NULL;
        }
        fill = PyUnicode_AsUTF8AndSize(null, &fill_len);
        if (fill == NULL)
            return NULL;
    }
    if (usable(c) < 0)
        return NULL;
    TextIn in;
    if (textin_open(&in, n, offset, buffers) < 0)
        return NULL;
    TextOut outs[MAX_WIDTH];
    int made = 0;
    PyObject *result = NULL;
    c->busy = 1;
    for (; made < c->width; made++) {
        if (textout_init(&outs[made], n) < 0)
            goto done;
    }
    size_t prev = 0; /* the arena offset + 1 of the record of the row before (0: none) */
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s;
        Py_ssize_t len;
        int got = textin_get(&in, i, &s, &len);
        if (got < 0)
            goto done;
        if (got == 0) {
            for (int k = 0; k < c->width; k++) {
                if ((fill ? textout_put(&outs[k], i, fill, (size_t)fill_len) : textout_null(&outs[k], i)) < 0)
                    goto done;
            }
            continue;
        }
        /* The row before's record first: runs of one value (an empty client subnet) cost no probe. */
        const char *p = prev ? c->arena + prev - 1 : NULL;
        if (p == NULL || get32(p) != (uint32_t)len || !text_eq(p + 4, s, (size_t)len)) {
            uint64_t h = text_hash(s, (size_t)len, c->seed);
            prev = find(c, s, (size_t)len, h);
            if (prev == 0 && (prev = make(c, s, (size_t)len, h)) == 0)
                goto done;
        }
        if (put_results(c, prev, outs, i) < 0)
            goto done;
    }
    result = PyList_New(c->width);
    for (int k = 0; result != NULL && k < c->width; k++)
        ext_set_item(&result, k, textout_finish(&outs[k]));
done:
    c->busy = 0;
    for (int k = 0; k < made; k++)
        textout_free(&outs[k]);
    textin_close(&in);
    return result;
}

static PyObject *cache_clear(TextCache *c, PyObject *Py_UNUSED(ignored))
{
    if (c->busy) {
        PyErr_SetString(PyExc_RuntimeError, BUSY);
        return NULL;
    }
    drop_entries(c);
    Py_RETURN_NONE;
}

static Py_ssize_t cache_len(TextCache *c)
{
    return (Py_ssize_t)c->used;
}

static uint64_t random_seed(void)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed)
        return seed;
    struct timespec ts; /* (no entropy yet, early at boot: the clock, still unknown from outside) */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return text_hash((const char *)&ts, sizeof ts, (uint64_t)getpid());
}

static int cache_init(TextCache *c, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"function", "width", "size", "seed", NULL};
    PyObject *function, *seed = Py_None;
    int width = 1;
    Py_ssize_t size = 200000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|inO:TextCache", kwlist, &function, &width, &size, &seed))
        return -1;
    if (!PyCallable_Check(function)) {
        PyErr_SetString(PyExc_TypeError, "function must be callable");
        return -1;
    }
    if (width < 1 || width > MAX_WIDTH || size < 1 || size > UINT32_MAX / 2) {
        PyErr_Format(PyExc_ValueError, "width must be 1 to %d and size at least 1", MAX_WIDTH);
        return -1;
    }
    /* Reset by its own function: columns() would go on with another width and a freed arena (wild writes). */
    if (c->busy) {
        PyErr_SetString(PyExc_RuntimeError, BUSY);
        return -1;
    }
    drop_entries(c);
    Py_INCREF(function);
    Py_XSETREF(c->function, function);
    c->width = width;
    c->size = size;
    if (seed == Py_None) {
        c->seed = random_seed();
    } else {
        c->seed = PyLong_AsUnsignedLongLongMask(seed);
        if (c->seed == (uint64_t)-1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

EXT_GC_ONE_REF(cache_refs, TextCache, function)

static void cache_dealloc(TextCache *c)
{
    PyObject_GC_UnTrack(c);
    cache_refs_clear((PyObject *)c);
    drop_entries(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef cache_methods[] = {
    {"columns", (PyCFunction)cache_columns, METH_VARARGS,
     "columns(length, offset, buffers, null) -> [(null_count, validity, offsets, data)]: the function's results "
     "for every row of a string column, one column per result."},
    {"clear", (PyCFunction)cache_clear, METH_NOARGS, "Drop every entry."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef cache_members[] = {
    {"size", T_PYSSIZET, offsetof(TextCache, size), READONLY, "entries kept before the cache starts again"},
    {"width", T_INT, offsetof(TextCache, width), READONLY, "results per text"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject TextCacheType = EXT_TYPE(TextCache, "export._lookup.TextCache", Py_TPFLAGS_HAVE_GC,
    "TextCache(function, width=1, size=200000, seed=None): function(text) cached, applied to string columns.",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)cache_init, .tp_dealloc = (destructor)cache_dealloc,
    .tp_traverse = cache_refs_traverse, .tp_clear = cache_refs_clear, .tp_methods = cache_methods,
    .tp_members = cache_members, .tp_as_sequence = &(PySequenceMethods){.sq_length = (lenfunc)cache_len});

PyMODINIT_FUNC PyInit__lookup(void)
{
    return ext_module("export._lookup", NULL, NULL, (PyTypeObject *[]){&TextCacheType, NULL}, NULL, NULL);
}
