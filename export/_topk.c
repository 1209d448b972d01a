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
 *
 * count_table(second_of, n, time, rcode, qtype, delay, qname, src, domain, rules): the n rows of a table of the
 *   Parquet schema counted into the export.live_top.Second that second_of(s) gives for each second s of capture
 *   time, as TopCounts counts it with Arrow (its reference, tests/export/test_live_top.py): transactions, the RCODE,
 *   QTYPE and delay-bin dicts, and per second the exact counts of its QNAMEs, clients and registered domains in the
 *   order first seen (Arrow's value counts' order) fed to the Second's summaries, so that they get the same
 *   updates. Columns as (offset, Array.buffers()); domain None: the registered domains of the distinct QNAMEs by
 *   rules (an export.enrich._psl.SuffixRules, through its capsule). Why: Arrow's dozen passes over every second of
 *   every table, and the distinct values made Python strings, cost more than the counting itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

#include "psl_api.h"
#include "strcolumn.h"

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

static inline uint64_t hash_item(int kind, const char *p, size_t n)
{
    return text_hash(p, n, hash_seed ^ (uint64_t)kind);
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
        if (c->key_len == n && c->kind == kind && text_eq(c->key, p, n))
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

/* One update of the item (kind, p[0..n)) of hash h (hash_item's); -1 with an exception set (memory) on error. */
static int update_hashed(Summary *s, int kind, const char *p, uint32_t n, uint64_t h, long long weight)
{
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

static int update(Summary *s, int kind, const char *p, size_t len, long long weight)
{
    if (len >= UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "item too long");
        return -1;
    }
    return update_hashed(s, kind, p, (uint32_t)len, hash_item(kind, p, len), weight);
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

/* -- count_table -- */

#define DELAY_BINS_PER_OCTAVE 128.0 /* export.live_top's */
#define NULL_VALUE LLONG_MIN         /* a tally's key for a null: None */

/* An int column's buffers: (length, offset, [validity or None, data]) as pyarrow gives them. */
typedef struct {
    Py_buffer views[2];
    int held[2];
    const uint8_t *validity;
    const char *data;
    Py_ssize_t offset;
    int width;
} IntIn;

static void intin_close(IntIn *in)
{
    for (int k = 0; k < 2; k++)
        if (in->held[k])
            PyBuffer_Release(&in->views[k]);
    memset(in, 0, sizeof *in);
}

static int intin_open(IntIn *in, Py_ssize_t n, Py_ssize_t offset, PyObject *buffers, int width)
{
    memset(in, 0, sizeof *in);
    if (!PyList_Check(buffers) || PyList_GET_SIZE(buffers) != 2 || offset < 0 || n < 0 ||
        offset > PY_SSIZE_T_MAX / 16 - n) {
        PyErr_SetString(PyExc_ValueError, "int column: (length, offset, [validity, data]) expected");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *b = PyList_GET_ITEM(buffers, k);
        if (b == Py_None)
            continue;
        if (PyObject_GetBuffer(b, &in->views[k], PyBUF_SIMPLE) < 0) {
            intin_close(in);
            return -1;
        }
        in->held[k] = 1;
    }
    Py_ssize_t end = offset + n;
    if (!in->held[1] || in->views[1].len / width < end || (in->held[0] && in->views[0].len < (end + 7) / 8)) {
        intin_close(in);
        PyErr_SetString(PyExc_ValueError, "int column buffers shorter than the column");
        return -1;
    }
    in->validity = in->held[0] ? in->views[0].buf : NULL;
    in->data = in->views[1].buf;
    in->offset = offset;
    in->width = width;
    return 0;
}

/* Row i: 1 and its value, 0 for a null. */
static inline int intin_get(const IntIn *in, Py_ssize_t i, long long *v)
{
    Py_ssize_t at = in->offset + i;
    if (in->validity != NULL && !(in->validity[at >> 3] >> (at & 7) & 1))
        return 0;
    if (in->width == 8) {
        int64_t x;
        memcpy(&x, in->data + 8 * at, 8);
        *v = x;
    } else {
        int32_t x;
        memcpy(&x, in->data + 4 * at, 4);
        *v = x;
    }
    return 1;
}

/* Counts by int value (RCODE, QTYPE, delay bin) of one second: an array indexed by the value and the values seen,
 * in the order first seen (value_counts' order). */
typedef struct {
    long long *n, nulls;
    int32_t *seen;
    Py_ssize_t size, nseen;
} Tally;

static const Py_ssize_t TALLY_SIZES[3] = {1 << 12, 1 << 16, 1 << 13}; /* RCODE, QTYPE, delay bin: every value */

/* dict[key] += n (key NULL_VALUE: None) */
static int dict_add(PyObject *dict, long long key, long long n)
{
    PyObject *k = key == NULL_VALUE ? Py_NewRef(Py_None) : PyLong_FromLongLong(key), *v = NULL;
    if (k == NULL)
        return -1;
    PyObject *have = PyDict_GetItemWithError(dict, k);
    int failed = have == NULL && PyErr_Occurred();
    if (!failed && have != NULL) {
        long long had = PyLong_AsLongLong(have);
        failed = had == -1 && PyErr_Occurred();
        n += had;
    }
    failed = failed || (v = PyLong_FromLongLong(n)) == NULL || PyDict_SetItem(dict, k, v) < 0;
    Py_XDECREF(v);
    Py_DECREF(k);
    return failed ? -1 : 0;
}

static int tally_add(Tally *t, PyObject *dict, long long value)
{
    if (value < 0 || value >= t->size) /* (not from a DNS message; counted all the same) */
        return dict_add(dict, value, 1);
    if (t->n[value]++ == 0)
        t->seen[t->nseen++] = (int32_t)value;
    return 0;
}

/* Into dict, and empty (also on error). */
static int tally_flush(Tally *t, PyObject *dict)
{
    int failed = t->nulls && dict_add(dict, NULL_VALUE, t->nulls) < 0;
    for (Py_ssize_t i = 0; i < t->nseen; i++) {
        int32_t v = t->seen[i];
        failed = failed || dict_add(dict, v, t->n[v]) < 0;
        t->n[v] = 0;
    }
    t->nulls = t->nseen = 0;
    return failed ? -1 : 0;
}

/* Exact counts of the texts of one second, in the order first seen (value_counts' order): entries point into
 * `base` (a column's data, or the arena of registered domains), an open-addressing index of them. */
typedef struct {
    size_t off;
    uint32_t len; /* UINT32_MAX: the null */
    uint64_t hash;
    long long count;
} Distinct;

typedef struct {
    const char *base;
    Distinct *at;
    Py_ssize_t n, cap;
    uint32_t *index; /* entry + 1; 0: free */
    size_t mask;
} Counts;

static void counts_free(Counts *c)
{
    PyMem_Free(c->at);
    PyMem_Free(c->index);
    memset(c, 0, sizeof *c);
}

/* Room for at least `want` distinct texts (and twice that in the index); 0: twice the room there is. */
static int counts_grow(Counts *c, Py_ssize_t want)
{
    Py_ssize_t cap = c->cap ? 2 * c->cap : 1024;
    while (cap < want)
        cap *= 2;
    Distinct *at = PyMem_Realloc(c->at, (size_t)cap * sizeof(Distinct));
    uint32_t *index = at ? PyMem_Calloc((size_t)cap * 2, sizeof(uint32_t)) : NULL;
    if (index == NULL) {
        if (at != NULL)
            c->at = at;
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(c->index);
    c->at = at;
    c->index = index;
    c->cap = cap;
    c->mask = (size_t)cap * 2 - 1;
    for (Py_ssize_t e = 0; e < c->n; e++) {
        size_t i = c->at[e].hash & c->mask;
        while (c->index[i])
            i = (i + 1) & c->mask;
        c->index[i] = (uint32_t)e + 1;
    }
    return 0;
}

/* Count the text base[off..off+len) (len UINT32_MAX: the null) `weight` more times: 1 when it is new, 0 when it
 * was counted before, -1 (memory) on error. */
static int counts_add(Counts *c, size_t off, uint32_t len, long long weight)
{
    if (c->n == c->cap && counts_grow(c, 0) < 0)
        return -1;
    const char *p = c->base + off;
    uint64_t h = len == UINT32_MAX ? 0 : hash_item(ITEM_STR, p, len);
    size_t i = h & c->mask;
    for (uint32_t e; (e = c->index[i]) != 0; i = (i + 1) & c->mask) {
        Distinct *d = &c->at[e - 1];
        if (d->hash == h && d->len == len && (len == UINT32_MAX || text_eq(c->base + d->off, p, len))) {
            d->count += weight;
            return 0;
        }
    }
    c->index[i] = (uint32_t)c->n + 1;
    c->at[c->n++] = (Distinct){off, len, h, weight};
    return 1;
}

static void counts_clear(Counts *c)
{
    if (c->index != NULL)
        memset(c->index, 0, (c->mask + 1) * sizeof(uint32_t));
    c->n = 0;
}

/* The summary's updates by the counts, in their order (the null skipped). */
static int counts_update(const Counts *c, Summary *s)
{
    for (Py_ssize_t e = 0; e < c->n; e++) {
        const Distinct *d = &c->at[e];
        if (d->len != UINT32_MAX && update_hashed(s, ITEM_STR, c->base + d->off, d->len, d->hash, d->count) < 0)
            return -1;
    }
    return 0;
}

static const PslApi *psl;

/* The columns of a table (export.live_top.TOP_COLUMNS) and what counting one of its seconds needs. */
typedef struct {
    Py_ssize_t n;
    IntIn time, rcode, qtype, delay;
    TextIn qname, src, domain;
    int has_domain;
    PyObject *rules;
    Tally tallies[3]; /* RCODE, QTYPE, delay bin (per call: Python code run meanwhile may count another table) */
    Counts names, clients, domains;
    char *arena; /* the registered domains of the distinct QNAMEs (domains.base) */
    size_t arena_len, arena_cap;
} Table;

static Summary *list_of(PyObject *lists, const char *name)
{
    PyObject *s = PyDict_GetItemString(lists, name);
    if (s == NULL || !PyObject_TypeCheck(s, &SpaceSavingType)) {
        PyErr_Format(PyExc_TypeError, "the Second's list %s is not an export._topk.SpaceSaving", name);
        return NULL;
    }
    return (Summary *)s;
}

/* The registered domains of the distinct QNAMEs (names), weighted by their counts, into t->domains (as
 * export.live_top sums them with Arrow: in the order first seen; a null QNAME's is ""). */
static int count_domains(Table *t)
{
    t->arena_len = 0;
    counts_clear(&t->domains);
    for (Py_ssize_t e = 0; e < t->names.n; e++) {
        const Distinct *d = &t->names.at[e];
        const char *domain = "";
        Py_ssize_t len = 0;
        if (d->len != UINT32_MAX &&
            (len = psl->registered_domain(t->rules, t->names.base + d->off, d->len, &domain)) < 0)
            return -1;
        if (t->arena_len + (size_t)len > t->arena_cap) {
            size_t cap = 2 * (t->arena_len + (size_t)len) + 4096;
            char *a = PyMem_Realloc(t->arena, cap);
            if (a == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            t->arena = a;
            t->arena_cap = cap;
        }
        memcpy(t->arena + t->arena_len, domain, (size_t)len); /* (kept only if the domain is new) */
        t->domains.base = t->arena;
        int added = counts_add(&t->domains, t->arena_len, (uint32_t)len, d->count);
        if (added < 0)
            return -1;
        t->arena_len += added ? (size_t)len : 0;
    }
    return 0;
}

/* Transactions, RCODE, QTYPE and delay bins of the row (into the tallies), its QNAME, client and registered domain
 * (into the table's exact counts); -1 with an exception. */
static int count_row(Table *t, PyObject *const *dicts, Py_ssize_t i)
{
    Tally *tallies = t->tallies;
    long long v;
    if (!intin_get(&t->rcode, i, &v))
        tallies[0].nulls++;
    else if (tally_add(&tallies[0], dicts[0], v) < 0)
        return -1;
    if (!intin_get(&t->qtype, i, &v))
        tallies[1].nulls++;
    else if (tally_add(&tallies[1], dicts[1], v) < 0)
        return -1;
    /* the bin as export.live_top bins it with Arrow: floor(log2(max(delay, 0) + 1) * DELAY_BINS_PER_OCTAVE) */
    if (intin_get(&t->delay, i, &v)) {
        double bin = floor(log2((double)((v > 0 ? v : 0) + 1)) * DELAY_BINS_PER_OCTAVE);
        if (tally_add(&tallies[2], dicts[2], (long long)bin) < 0)
            return -1;
    }
    const char *p;
    Py_ssize_t len;
    int got = textin_get(&t->qname, i, &p, &len);
    if (got < 0 ||
        counts_add(&t->names, got ? (size_t)(p - t->qname.data) : 0, got ? (uint32_t)len : UINT32_MAX, 1) < 0)
        return -1;
    if ((got = textin_get(&t->src, i, &p, &len)) < 0 ||
        (got && counts_add(&t->clients, (size_t)(p - t->src.data), (uint32_t)len, 1) < 0))
        return -1;
    if (t->has_domain && ((got = textin_get(&t->domain, i, &p, &len)) < 0 ||
                          counts_add(&t->domains, got ? (size_t)(p - t->domain.data) : 0,
                                     got ? (uint32_t)len : UINT32_MAX, 1) < 0))
        return -1;
    return 0;
}

/* The rows of second s (seconds: each row's) into the export.live_top.Second that second_of(s) gives. */
static int count_second(Table *t, PyObject *second_of, long long s, const long long *seconds)
{
    static const char *const names[3] = {"rcode", "qtype", "delay"};
    PyObject *second = PyObject_CallFunction(second_of, "L", s), *dicts[3] = {NULL, NULL, NULL}, *lists = NULL;
    if (second == NULL)
        return -1;
    int failed = 0;
    for (int k = 0; k < 3 && !failed; k++)
        failed = (dicts[k] = PyObject_GetAttrString(second, names[k])) == NULL || !PyDict_Check(dicts[k]);
    Summary *qnames = NULL, *domains = NULL, *clients = NULL;
    if (!failed && (lists = PyObject_GetAttrString(second, "lists")) != NULL && PyDict_Check(lists)) {
        qnames = list_of(lists, "qnames");
        domains = qnames ? list_of(lists, "domains") : NULL;
        clients = domains ? list_of(lists, "clients") : NULL;
    }
    failed = failed || clients == NULL;
    counts_clear(&t->names);
    counts_clear(&t->clients);
    counts_clear(&t->domains);
    t->names.base = t->qname.data;
    t->clients.base = t->src.data;
    t->domains.base = t->has_domain ? t->domain.data : t->arena;
    long long rows = 0;
    for (Py_ssize_t i = 0; i < t->n && !failed; i++)
        if (seconds[i] == s) {
            rows++;
            failed = count_row(t, dicts, i) < 0;
        }
    for (int k = 0; k < 3; k++) /* (also on error: empties them; they were filled only with every dict there) */
        if (dicts[k] != NULL)
            failed = tally_flush(&t->tallies[k], dicts[k]) < 0 || failed;
    failed = failed || counts_update(&t->names, qnames) < 0 || (!t->has_domain && count_domains(t) < 0) ||
             counts_update(&t->domains, domains) < 0 || counts_update(&t->clients, clients) < 0;
    PyObject *had = failed ? NULL : PyObject_GetAttrString(second, "transactions"), *n = NULL, *now = NULL;
    failed = failed || had == NULL || (n = PyLong_FromLongLong(rows)) == NULL || (now = PyNumber_Add(had, n)) == NULL ||
             PyObject_SetAttrString(second, "transactions", now) < 0;
    Py_XDECREF(had);
    Py_XDECREF(n);
    Py_XDECREF(now);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(dicts[k]);
    Py_XDECREF(lists);
    Py_DECREF(second);
    if (failed && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "second_of must return an export.live_top.Second");
    return failed ? -1 : 0;
}

static PyObject *count_table(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *second_of, *rules, *domain, *b[6];
    Py_ssize_t n, o[6];
    if (!PyArg_ParseTuple(args, "On(nO)(nO)(nO)(nO)(nO)(nO)OO!:count_table", &second_of, &n, &o[0], &b[0], &o[1],
                          &b[1], &o[2], &b[2], &o[3], &b[3], &o[4], &b[4], &o[5], &b[5], &domain, psl->rules_type,
                          &rules))
        return NULL;
    Table t;
    memset(&t, 0, sizeof t);
    t.n = n;
    t.rules = rules;
    Py_ssize_t domain_offset = 0;
    PyObject *domain_buffers = NULL;
    t.has_domain = domain != Py_None;
    long long *seconds = NULL, *order = NULL;
    Py_ssize_t norder = 0;
    int failed = (t.has_domain && !PyArg_ParseTuple(domain, "nO", &domain_offset, &domain_buffers)) ||
                 intin_open(&t.time, n, o[0], b[0], 8) < 0 || intin_open(&t.rcode, n, o[1], b[1], 4) < 0 ||
                 intin_open(&t.qtype, n, o[2], b[2], 4) < 0 || intin_open(&t.delay, n, o[3], b[3], 8) < 0 ||
                 textin_open(&t.qname, n, o[4], b[4]) < 0 || textin_open(&t.src, n, o[5], b[5]) < 0 ||
                 (t.has_domain && textin_open(&t.domain, n, domain_offset, domain_buffers) < 0);
    if (!failed) {
        seconds = PyMem_Malloc(((size_t)n + 1) * sizeof(long long));
        order = PyMem_Malloc(((size_t)n + 1) * sizeof(long long));
        t.arena = PyMem_Malloc(t.arena_cap = 4096);
        failed = seconds == NULL || order == NULL || t.arena == NULL;
        for (int k = 0; k < 3 && !failed; k++) {
            t.tallies[k].size = TALLY_SIZES[k];
            failed = (t.tallies[k].n = PyMem_Calloc(TALLY_SIZES[k], sizeof(long long))) == NULL ||
                     (t.tallies[k].seen = PyMem_Calloc(TALLY_SIZES[k], sizeof(int32_t))) == NULL;
        }
        if (failed)
            PyErr_NoMemory();
    }
    /* (room for a distinct value per row: no index grown and rehashed within a table) */
    failed = failed || counts_grow(&t.names, n) < 0 || counts_grow(&t.clients, n) < 0 || counts_grow(&t.domains, n) < 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) { /* each row's second, and the seconds in the order first seen */
        long long us = 0;
        intin_get(&t.time, i, &us);
        seconds[i] = us / 1000000; /* (as Arrow divides: truncated) */
        if (norder && order[norder - 1] == seconds[i])
            continue;
        Py_ssize_t k = 0;
        while (k < norder && order[k] != seconds[i])
            k++;
        if (k == norder)
            order[norder++] = seconds[i];
    }
    for (Py_ssize_t k = 0; k < norder && !failed; k++)
        failed = count_second(&t, second_of, order[k], seconds) < 0;
    intin_close(&t.time);
    intin_close(&t.rcode);
    intin_close(&t.qtype);
    intin_close(&t.delay);
    textin_close(&t.qname);
    textin_close(&t.src);
    textin_close(&t.domain);
    counts_free(&t.names);
    counts_free(&t.clients);
    counts_free(&t.domains);
    PyMem_Free(t.arena);
    for (int k = 0; k < 3; k++) {
        PyMem_Free(t.tallies[k].n);
        PyMem_Free(t.tallies[k].seen);
    }
    PyMem_Free(seconds);
    PyMem_Free(order);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
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

static PyMethodDef module_methods[] = {
    {"count_table", count_table, METH_VARARGS,
     "count_table(second_of, n, time, rcode, qtype, delay, qname, src, domain, rules): a table into its Seconds."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "export._topk", .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__topk(void)
{
    if (getrandom(&hash_seed, sizeof hash_seed, 0) != sizeof hash_seed)
        hash_seed = (uint64_t)(uintptr_t)&hash_seed; /* (no entropy: the address, randomised) */
    PyObject *psl_module = PyImport_ImportModule("export.enrich._psl");
    if (psl_module == NULL)
        return NULL;
    Py_DECREF(psl_module);
    if ((psl = PyCapsule_Import(PSL_CAPSULE, 0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddType(m, &SpaceSavingType) < 0)
        Py_CLEAR(m);
    return m;
}
