/* export._topk: the Space-Saving summary of a stream of weighted items in k counters (its Python reference:
 * SpaceSaving in export/topk.py, which says the algorithm; tests/export/test_topk.py compares the two on random and
 * adversarial streams, fuzz/fuzz_topk.py on any).
 *
 * Why: the live top lists (probe.run.top) update a summary per distinct QNAME, registered domain and client of
 * every second of every table written, and the standard mix's names are mostly new ones: nearly every update
 * evicts. The counters are Metwally's Stream-Summary: buckets of equal counts in a list by count, each holding its
 * counters in the order of their last update, so that the smallest of the reference's order (count, number of the
 * last update) is the first bucket's first counter, and an update by 1 moves a counter to the next bucket's end
 * (a heap sifted an evicted counter down all its depth at each update; with weights the walk to the new count's
 * bucket passes the counts in between). A hash table (linear probing, seeded at random: clients choose the names)
 * maps an item's bytes to its counter, without a Python object per counter: an item is kept as its kind and bytes
 * (the UTF-8 of a str, or a bytes), short ones inside the counter, and made a Python object only by entries().
 *
 * SpaceSaving(k): k >= 1 counters.
 * SpaceSaving.add(items, weights=None): items a list of str or bytes (None skipped), weights None (1 each) or a
 *   list of positive ints as long as items.
 * SpaceSaving.entries() -> [(item, count, error)], unranked (export.topk.ranked ranks them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

enum { ITEM_STR = 's', ITEM_BYTES = 'b' }; /* an item's kind */

static uint64_t hash_seed;

#define SHORT_KEY 32 /* item bytes kept in the counter itself (most QNAMEs, every client address) */

/* A counter: its item (hash, kind, bytes), count and error, and its place among the buckets. One cache line and a
 * half, so that an update touches few lines. */
typedef struct {
    uint64_t hash;
    long long count, error;
    int32_t bucket, prev, next; /* its bucket, its neighbours there (-1: none) */
    uint32_t key_len, key_cap;  /* key_cap: of key when it is not short */
    uint32_t slot;              /* its place in the hash table */
    uint8_t kind;
    char *key;                  /* short: points at the counter's own bytes */
    char short_key[SHORT_KEY];
} Counter;

/* Counters of equal counts, in a list of increasing counts; within one, its counters oldest update first. */
typedef struct {
    long long count;
    int32_t prev, next; /* buckets; -1: none (next: also the free list) */
    int32_t head, tail; /* counters */
} Bucket;

typedef struct {
    PyObject_HEAD
    Py_ssize_t k, used;
    uint64_t *slots; /* the item's hash (low 32 bits) << 32 | counter number + 1; 0: free */
    size_t mask;
    Counter *counters;
    Bucket *buckets;
    int32_t first, free_bucket; /* the bucket of the smallest count; the first free one */
} Summary;

static PyTypeObject SpaceSavingType;

static uint64_t hash_item(int kind, const char *p, size_t n)
{
    uint64_t h = hash_seed ^ (uint64_t)kind ^ ((uint64_t)n << 8), w;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
    }
    w = 0;
    memcpy(&w, p + i, n - i);
    h ^= w; /* then murmur3's finaliser: every bit of h moves the low bits, which pick the slot */
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdULL;
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* The bucket of count `count` between prev and next (-1: none), from the free ones (there are k: no more counts
 * than counters). */
static int32_t bucket_new(Summary *s, long long count, int32_t prev, int32_t next)
{
    int32_t b = s->free_bucket;
    Bucket *x = &s->buckets[b];
    s->free_bucket = x->next;
    x->count = count;
    x->prev = prev;
    x->next = next;
    x->head = x->tail = -1;
    if (prev >= 0)
        s->buckets[prev].next = b;
    else
        s->first = b;
    if (next >= 0)
        s->buckets[next].prev = b;
    return b;
}

static void bucket_free(Summary *s, int32_t b)
{
    Bucket *x = &s->buckets[b];
    if (x->prev >= 0)
        s->buckets[x->prev].next = x->next;
    else
        s->first = x->next;
    if (x->next >= 0)
        s->buckets[x->next].prev = x->prev;
    x->next = s->free_bucket;
    s->free_bucket = b;
}

/* Counter c out of its bucket; the bucket before where it was (-1: none), its own unless it is left empty (freed). */
static int32_t counter_unlink(Summary *s, Counter *c)
{
    Bucket *x = &s->buckets[c->bucket];
    if (c->prev >= 0)
        s->counters[c->prev].next = c->next;
    else
        x->head = c->next;
    if (c->next >= 0)
        s->counters[c->next].prev = c->prev;
    else
        x->tail = c->prev;
    if (x->head >= 0)
        return c->bucket;
    int32_t before = x->prev;
    bucket_free(s, c->bucket);
    return before;
}

/* Counter c (in no bucket) given `count` and updated now: the last of the bucket of its count, searched from after
 * bucket prev (whose count is smaller; -1: from the first). */
static void counter_place(Summary *s, Counter *c, long long count, int32_t prev)
{
    int32_t next = prev >= 0 ? s->buckets[prev].next : s->first, number = (int32_t)(c - s->counters);
    while (next >= 0 && s->buckets[next].count < count) {
        prev = next;
        next = s->buckets[next].next;
    }
    int32_t b = next >= 0 && s->buckets[next].count == count ? next : bucket_new(s, count, prev, next);
    Bucket *x = &s->buckets[b];
    c->count = count;
    c->bucket = b;
    c->prev = x->tail;
    c->next = -1;
    if (x->tail >= 0)
        s->counters[x->tail].next = number;
    else
        x->head = number;
    x->tail = number;
}

/* The slot of the item (kind, p, n) of hash h: its counter's, or the free one where it would go. */
static size_t probe_slot(const Summary *s, uint64_t h, int kind, const char *p, uint32_t n)
{
    uint64_t tag = h << 32;
    for (size_t i = h & s->mask;; i = (i + 1) & s->mask) {
        uint64_t slot = s->slots[i];
        if (slot == 0)
            return i;
        if ((slot & 0xFFFFFFFF00000000ULL) != tag)
            continue;
        const Counter *c = &s->counters[(slot & 0xFFFFFFFFu) - 1];
        if (c->key_len == n && c->kind == kind && memcmp(c->key, p, n) == 0)
            return i;
    }
}

static void set_slot(Summary *s, size_t i, uint64_t slot)
{
    s->slots[i] = slot;
    if (slot)
        s->counters[(slot & 0xFFFFFFFFu) - 1].slot = (uint32_t)i;
}

/* Free slot i, moving later items of its run back so that every item stays reachable from its home slot. */
static void free_slot(Summary *s, size_t i)
{
    for (size_t j = (i + 1) & s->mask; s->slots[j]; j = (j + 1) & s->mask) {
        size_t home = (s->slots[j] >> 32) & s->mask;
        if (((j - home) & s->mask) >= ((j - i) & s->mask)) { /* home is not in (i, j]: may move to i */
            set_slot(s, i, s->slots[j]);
            i = j;
        }
    }
    s->slots[i] = 0;
}

static int set_key(Counter *c, uint64_t h, int kind, const char *p, uint32_t n)
{
    if (n <= SHORT_KEY) {
        if (c->key != c->short_key) {
            PyMem_Free(c->key);
            c->key = c->short_key;
        }
    } else if (c->key == c->short_key || n > c->key_cap) {
        char *k = PyMem_Malloc(n);
        if (k == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (c->key != c->short_key)
            PyMem_Free(c->key);
        c->key = k;
        c->key_cap = n;
    }
    memcpy(c->key, p, n);
    c->key_len = n;
    c->kind = (uint8_t)kind;
    c->hash = h;
    return 0;
}

/* One update; -1 with an exception set (memory) on error. */
static int update(Summary *s, int kind, const char *p, size_t len, long long weight)
{
    if (len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "item too long");
        return -1;
    }
    uint32_t n = (uint32_t)len;
    uint64_t h = hash_item(kind, p, n);
    size_t slot = probe_slot(s, h, kind, p, n);
    Counter *c;
    if (s->slots[slot]) {
        c = &s->counters[(s->slots[slot] & 0xFFFFFFFFu) - 1];
        counter_place(s, c, c->count + weight, counter_unlink(s, c));
        return 0;
    }
    if (s->used < s->k) { /* a free counter */
        c = &s->counters[s->used];
        if (set_key(c, h, kind, p, n) < 0)
            return -1;
        set_slot(s, slot, h << 32 | (uint64_t)(s->used + 1));
        s->used++;
        c->error = 0;
        counter_place(s, c, weight, -1);
        return 0;
    }
    c = &s->counters[s->buckets[s->first].head]; /* the smallest count, updated longest ago */
    free_slot(s, c->slot);
    if (set_key(c, h, kind, p, n) < 0)
        return -1; /* (c keeps its old key, in no slot: a lost counter, not a wrong one) */
    set_slot(s, probe_slot(s, h, kind, p, n), h << 32 | (uint64_t)(c - s->counters + 1));
    c->error = c->count;
    counter_place(s, c, c->count + weight, counter_unlink(s, c));
    return 0;
}

static void summary_dealloc(Summary *s)
{
    if (s->counters != NULL)
        for (Py_ssize_t i = 0; i < s->k; i++)
            if (s->counters[i].key != s->counters[i].short_key)
                PyMem_Free(s->counters[i].key);
    PyMem_Free(s->slots);
    PyMem_Free(s->counters);
    PyMem_Free(s->buckets);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *summary_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"k", NULL};
    Py_ssize_t k;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &k))
        return NULL;
    if (k < 1 || k > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "k must be at least 1 (and at most 2^24)");
        return NULL;
    }
    Summary *s = (Summary *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    size_t slots = 4;
    while (slots < 2 * (size_t)k) /* at most half full: short probes */
        slots *= 2;
    s->k = k;
    s->mask = slots - 1;
    s->slots = PyMem_Calloc(slots, sizeof(uint64_t));
    s->counters = PyMem_Calloc(k, sizeof(Counter));
    s->buckets = PyMem_Calloc(k, sizeof(Bucket));
    if (!s->slots || !s->counters || !s->buckets) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < k; i++)
        s->counters[i].key = s->counters[i].short_key;
    s->first = -1;
    for (Py_ssize_t b = 0; b < k; b++) /* every bucket free */
        s->buckets[b].next = b + 1 < k ? (int32_t)b + 1 : -1;
    s->free_bucket = 0;
    return (PyObject *)s;
}

/* The kind and bytes of a str or bytes item; -1 with an exception if it is neither. */
static int item_bytes(PyObject *item, PyObject **hold, const char **p, Py_ssize_t *n)
{
    *hold = NULL;
    if (PyBytes_CheckExact(item)) {
        *p = PyBytes_AS_STRING(item);
        *n = PyBytes_GET_SIZE(item);
        return ITEM_BYTES;
    }
    if (!PyUnicode_CheckExact(item)) {
        PyErr_SetString(PyExc_TypeError, "items must be str or bytes");
        return -1;
    }
    if ((*p = PyUnicode_AsUTF8AndSize(item, n)) != NULL)
        return ITEM_STR;
    PyErr_Clear(); /* (lone surrogates: kept as such) */
    if ((*hold = PyUnicode_AsEncodedString(item, "utf-8", "surrogatepass")) == NULL)
        return -1;
    *p = PyBytes_AS_STRING(*hold);
    *n = PyBytes_GET_SIZE(*hold);
    return ITEM_STR;
}

static int weight_of(PyObject *weights, Py_ssize_t i, long long *weight)
{
    *weight = 1;
    if (weights == Py_None)
        return 0;
    PyObject *w = PyList_GET_ITEM(weights, i);
    if (!PyLong_CheckExact(w)) {
        PyErr_SetString(PyExc_TypeError, "weights must be ints");
        return -1;
    }
    *weight = PyLong_AsLongLong(w);
    if (*weight == -1 && PyErr_Occurred())
        return -1;
    if (*weight < 1) {
        PyErr_SetString(PyExc_ValueError, "weights must be positive");
        return -1;
    }
    return 0;
}

static PyObject *summary_add(Summary *s, PyObject *args)
{
    PyObject *items, *weights = Py_None;
    if (!PyArg_ParseTuple(args, "O!|O", &PyList_Type, &items, &weights))
        return NULL;
    if (weights != Py_None && (!PyList_Check(weights) || PyList_GET_SIZE(weights) != PyList_GET_SIZE(items))) {
        PyErr_SetString(PyExc_ValueError, "weights must be None or a list as long as items");
        return NULL;
    }
    /* (nothing here runs Python code that could change the lists: only exact str, bytes and ints are taken) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *hold;
        if (item == Py_None)
            continue;
        const char *p;
        Py_ssize_t n;
        long long weight;
        int kind = item_bytes(item, &hold, &p, &n);
        int failed = kind < 0 || weight_of(weights, i, &weight) < 0 || update(s, kind, p, (size_t)n, weight) < 0;
        Py_XDECREF(hold);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *item_object(const Counter *c)
{
    return c->kind == ITEM_STR ? PyUnicode_DecodeUTF8(c->key, c->key_len, "surrogatepass")
                               : PyBytes_FromStringAndSize(c->key, c->key_len);
}

static PyObject *summary_entries(Summary *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(s->used);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < s->used; i++) {
        const Counter *c = &s->counters[i];
        PyObject *item = item_object(c), *entry = NULL;
        if (item != NULL)
            entry = Py_BuildValue("NLL", item, c->count, c->error);
        if (entry == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, entry);
    }
    return list;
}

static Py_ssize_t summary_len(Summary *s)
{
    return s->used;
}

static PyMethodDef summary_methods[] = {
    {"add", (PyCFunction)summary_add, METH_VARARGS,
     "add(items, weights=None): update with each item (str or bytes; None skipped) by its weight (1 each)."},
    {"entries", (PyCFunction)summary_entries, METH_NOARGS, "entries() -> [(item, count, error)], unranked."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods summary_sequence = {.sq_length = (lenfunc)summary_len};

static PyTypeObject SpaceSavingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "export._topk.SpaceSaving",
    .tp_basicsize = sizeof(Summary),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SpaceSaving(k): the Space-Saving summary of a stream in k counters (export/topk.py).",
    .tp_new = summary_new,
    .tp_dealloc = (destructor)summary_dealloc,
    .tp_methods = summary_methods,
    .tp_as_sequence = &summary_sequence,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "export._topk", .m_size = -1,
};

PyMODINIT_FUNC PyInit__topk(void)
{
    if (getrandom(&hash_seed, sizeof hash_seed, 0) != sizeof hash_seed)
        hash_seed = (uint64_t)(uintptr_t)&hash_seed; /* (no entropy: the address, randomised) */
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddType(m, &SpaceSavingType) < 0)
        Py_CLEAR(m);
    return m;
}
