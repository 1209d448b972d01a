/* export._topk: the Space-Saving summary of a stream of weighted items in k counters, updated by batches (its
 * Python reference: SpaceSaving in export/topk.py, which says the algorithm; tests/export/test_topk.py compares the
 * two on random and adversarial streams, fuzz/fuzz_topk.py on any).
 *
 * Why batches: the live top lists (probe.run.top) update a summary by the distinct QNAMEs, registered domains and
 * clients of every second of every table written, counted exactly first, and the standard mix's names are mostly
 * new ones. One at a time, nearly every update evicted a counter (a hash table entry freed and another made, the
 * item's bytes copied, the counter moved among the counts), thousands a second, and their scattered writes slowed
 * the rest of the pipeline too. By batch, a new item takes no counter until the batch's end, when the k largest
 * counts are kept (a selection, expected linear time): at most k counters change hands per batch. A hash table
 * (linear probing, seeded at random: clients choose the names) maps an item's bytes to its counter, without a
 * Python object per counter: an item is kept as its kind and bytes (the UTF-8 of a str, or a bytes), short ones
 * inside the counter, and made a Python object only by entries().
 *
 * SpaceSaving(k): k >= 1 counters.
 * SpaceSaving.add(items, weights=None): one batch; items a list of str or bytes (None skipped), weights None (1
 *   each) or a list of positive ints as long as items.
 * SpaceSaving.entries() -> [(item, count, error)], unranked (export.topk.ranked ranks them).
 *
 * count_table(second_of, n, time, rcode, qtype, delay, qname, src, domain, rules): the n rows of a table of the
 *   Parquet schema counted into the export.live_top.Second that second_of(s) gives for each second s of capture
 *   time, as TopCounts counts it with Arrow (its reference, tests/export/test_live_top.py): transactions, the RCODE,
 *   QTYPE and delay-bin dicts, and per second the exact counts of its QNAMEs, clients and registered domains in the
 *   order first seen (Arrow's value counts' order), each a batch of the Second's summary, so that they get the
 *   same updates. Columns as (offset, Array.buffers()); domain None: the registered domains of the distinct QNAMEs
 *   by rules (an export.enrich._psl.SuffixRules, through its capsule). Why: Arrow's dozen passes over every second
 *   of every table, and the distinct values made Python strings, cost more than the counting itself.
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

static inline uint64_t hash_item(int kind, const char *p, size_t n)
{
    return text_hash(p, n, hash_seed ^ (uint64_t)kind);
}

/* -- exact counts: a batch's distinct items -- */

/* Exact counts of items (a batch; in count_table, the texts of one second), in the order first seen (value_counts'
 * order), with an open-addressing index of them. An entry points at its item's bytes, which outlive the counts. */
typedef struct {
    const char *p;
    uint64_t hash;
    long long count;
    uint32_t len; /* UINT32_MAX: the null */
    uint8_t kind;
} Distinct;

typedef struct {
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

/* Room for at least `want` distinct items (and twice that in the index); 0: twice the room there is. */
static int counts_grow(Counts *c, Py_ssize_t want)
{
    Py_ssize_t cap = c->cap ? 2 * c->cap : 4096;
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

/* Count the item (kind, p[0..len)) (len UINT32_MAX: the null) `weight` more times: 1 when it is new, 0 when it was
 * counted before, -1 (memory) on error. */
static int counts_add(Counts *c, int kind, const char *p, uint32_t len, long long weight)
{
    if (c->n == c->cap && counts_grow(c, 0) < 0)
        return -1;
    uint64_t h = len == UINT32_MAX ? 0 : hash_item(kind, p, len);
    size_t i = h & c->mask;
    for (uint32_t e; (e = c->index[i]) != 0; i = (i + 1) & c->mask) {
        Distinct *d = &c->at[e - 1];
        if (d->hash == h && d->len == len && d->kind == kind && (len == UINT32_MAX || text_eq(d->p, p, len))) {
            d->count += weight;
            return 0;
        }
    }
    c->index[i] = (uint32_t)c->n + 1;
    c->at[c->n++] = (Distinct){p, h, weight, len, (uint8_t)kind};
    return 1;
}

/* Empty, the room kept: the index's entries cleared one by one, the latest first (an entry's probe passed only
 * earlier ones, still there), unless they fill much of it (a second's distinct values are often few). */
static void counts_clear(Counts *c)
{
    if ((size_t)c->n * 8 > c->mask) {
        memset(c->index, 0, (c->mask + 1) * sizeof(uint32_t));
    } else {
        for (Py_ssize_t e = c->n - 1; e >= 0; e--) {
            size_t i = c->at[e].hash & c->mask;
            while (c->index[i] != (uint32_t)e + 1)
                i = (i + 1) & c->mask;
            c->index[i] = 0;
        }
    }
    c->n = 0;
}

/* -- the summary -- */

#define SHORT_KEY 32 /* item bytes kept in the counter itself (most QNAMEs, every client address) */

/* A counter: its item (hash, kind, bytes) and error (its count and last update: in the summary's dense arrays). */
typedef struct {
    uint64_t hash;
    long long error;
    uint32_t key_len, key_cap; /* key_cap: of key when it is not short */
    uint32_t slot;             /* its place in the hash table */
    uint8_t kind;
    char *key;                 /* short: points at the counter's own bytes */
    char short_key[SHORT_KEY];
} Counter;

/* A candidate for the counters at the end of a batch: a counter (number >= 0) or a batch's new item (-1 - its
 * entry), its count and last update. */
typedef struct {
    long long count, updated;
    Py_ssize_t number;
} Candidate;

typedef struct {
    PyObject_HEAD
    Py_ssize_t k, used;
    long long floor;   /* the smallest count kept by the last batch that gave items up (0 before) */
    long long updates; /* numbered in order */
    uint64_t *slots;   /* the item's hash (low 32 bits) << 32 | counter number + 1; 0: free */
    size_t mask;
    Counter *counters;
    long long *count, *updated; /* each counter's count and the number of its last update (read by every batch's
                                   selection: apart from the counters' items, a few cache lines) */
    int32_t *spare; /* counters given up at a batch's end (scratch, k) */
    uint64_t random; /* the selection's pivots */
} Summary;

static PyTypeObject SpaceSavingType;

/* The candidates of a batch (scratch shared by all summaries, which use it under the GIL without running Python
 * code: one array that stays in the cache rather than one per summary, a new summary each second) */
static Candidate *candidates;
static Py_ssize_t candidates_cap;

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

static int set_key(Counter *c, const Distinct *d)
{
    uint32_t n = d->len;
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
    memcpy(c->key, d->p, n);
    c->key_len = n;
    c->kind = d->kind;
    c->hash = d->hash;
    return 0;
}

/* Counter number i given the batch's new item d; -1 (memory) on error. */
static int counter_take(Summary *s, Py_ssize_t i, const Distinct *d, const Candidate *x)
{
    Counter *c = &s->counters[i];
    if (set_key(c, d) < 0)
        return -1;
    set_slot(s, probe_slot(s, d->hash, d->kind, d->p, d->len), d->hash << 32 | (uint64_t)(i + 1));
    s->count[i] = x->count;
    c->error = s->floor;
    s->updated[i] = x->updated;
    return 0;
}

/* a before b: the larger count, among equal counts the later update (no two updates share a number). */
static inline int candidate_before(const Candidate *a, const Candidate *b)
{
    return a->count > b->count || (a->count == b->count && a->updated > b->updated);
}

/* The k first candidates of a[0..n) (k < n) into a[0..k): quickselect, random pivots (clients choose the counts). */
static void select_first(Summary *s, Candidate *a, Py_ssize_t n, Py_ssize_t k)
{
    Py_ssize_t lo = 0, hi = n; /* a[0..lo) are before a[lo..n), a[hi..n) after a[0..hi); lo <= k <= hi */
    while (hi - lo > 1) {
        s->random ^= s->random << 13; /* xorshift64 */
        s->random ^= s->random >> 7;
        s->random ^= s->random << 17;
        Py_ssize_t p = lo + (Py_ssize_t)(s->random % (uint64_t)(hi - lo)), at = lo;
        Candidate pivot = a[p], t;
        a[p] = a[hi - 1];
        a[hi - 1] = pivot;
        for (Py_ssize_t i = lo; i < hi - 1; i++)
            if (candidate_before(&a[i], &pivot)) {
                t = a[i];
                a[i] = a[at];
                a[at++] = t;
            }
        a[hi - 1] = a[at];
        a[at] = pivot;
        if (at == k)
            return;
        if (at < k)
            lo = at + 1;
        else
            hi = at;
    }
}

/* One batch: the exact counts b (distinct items) added. An item with a counter adds its count; a new one is a
 * candidate of count floor + its count (Space-Saving's eviction: over-estimated by at most floor, its error); the
 * k largest counts keep or take the counters. -1 with an exception (memory) on error. */
static int summary_batch(Summary *s, const Counts *b)
{
    Py_ssize_t fresh = 0, total;
    if (candidates_cap < s->k + b->n) {
        Candidate *c = PyMem_Realloc(candidates, (size_t)(s->k + b->n) * sizeof(Candidate));
        if (c == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        candidates = c;
        candidates_cap = s->k + b->n;
    }
    Candidate *news = candidates + s->k; /* after room for the counters */
    for (Py_ssize_t e = 0; e < b->n; e++) {
        const Distinct *d = &b->at[e];
        if (d->len == UINT32_MAX)
            continue;
        size_t slot = probe_slot(s, d->hash, d->kind, d->p, d->len);
        s->updates++;
        if (s->slots[slot]) {
            size_t i = (s->slots[slot] & 0xFFFFFFFFu) - 1;
            s->count[i] += d->count;
            s->updated[i] = s->updates;
        } else
            news[fresh++] = (Candidate){s->floor + d->count, s->updates, -1 - e};
    }
    if (s->used + fresh <= s->k) { /* room for every new one (floor is 0) */
        for (Py_ssize_t j = 0; j < fresh; j++, s->used++)
            if (counter_take(s, s->used, &b->at[-1 - news[j].number], &news[j]) < 0)
                return -1;
        return 0;
    }
    Candidate *all = news - s->used; /* the counters' just before the new ones */
    for (Py_ssize_t i = 0; i < s->used; i++)
        all[i] = (Candidate){s->count[i], s->updated[i], i};
    total = s->used + fresh;
    select_first(s, all, total, s->k);
    Py_ssize_t spare = 0;
    for (Py_ssize_t i = s->used; i < s->k; i++) /* never taken */
        s->spare[spare++] = (int32_t)i;
    for (Py_ssize_t j = s->k; j < total; j++) /* given up */
        if (all[j].number >= 0) {
            free_slot(s, s->counters[all[j].number].slot);
            s->spare[spare++] = (int32_t)all[j].number;
        }
    long long floor = LLONG_MAX;
    for (Py_ssize_t j = 0; j < s->k; j++)
        floor = all[j].count < floor ? all[j].count : floor;
    for (Py_ssize_t j = 0; j < s->k; j++)
        if (all[j].number < 0 && counter_take(s, s->spare[--spare], &b->at[-1 - all[j].number], &all[j]) < 0)
            return -1; /* (memory: that counter keeps its item, in no slot: a lost counter, not a wrong one) */
    s->used = s->k;
    s->floor = floor;
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
    PyMem_Free(s->count);
    PyMem_Free(s->updated);
    PyMem_Free(s->spare);
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
    s->count = PyMem_Calloc(k, sizeof(long long));
    s->updated = PyMem_Calloc(k, sizeof(long long));
    s->spare = PyMem_Calloc(k, sizeof(int32_t));
    if (!s->slots || !s->counters || !s->count || !s->updated || !s->spare) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < k; i++)
        s->counters[i].key = s->counters[i].short_key;
    s->random = hash_seed ^ (uint64_t)(uintptr_t)s;
    s->random += !s->random; /* (xorshift: never 0) */
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

/* The items of the list (str, bytes; None skipped) by their weights into b, their encodings into holds (they
 * must outlive b); -1 with an exception. */
static int count_items(Counts *b, PyObject *holds, PyObject *items, PyObject *weights)
{
    /* (nothing here runs Python code that could change the lists: only exact str, bytes and ints are taken) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *hold;
        if (item == Py_None)
            continue;
        const char *p;
        Py_ssize_t n;
        long long weight;
        int kind = item_bytes(item, &hold, &p, &n);
        int failed = kind < 0 || (hold != NULL && PyList_Append(holds, hold) < 0) ||
                     weight_of(weights, i, &weight) < 0;
        Py_XDECREF(hold);
        if (!failed && (size_t)n >= UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "item too long");
            failed = 1;
        }
        if (failed || counts_add(b, kind, p, (uint32_t)n, weight) < 0)
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
    Counts batch;
    memset(&batch, 0, sizeof batch);
    PyObject *holds = PyList_New(0);
    int failed = holds == NULL || counts_grow(&batch, PyList_GET_SIZE(items)) < 0 ||
                 count_items(&batch, holds, items, weights) < 0 || summary_batch(s, &batch) < 0;
    counts_free(&batch);
    Py_XDECREF(holds);
    if (failed)
        return NULL;
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
            entry = Py_BuildValue("NLL", item, s->count[i], c->error);
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

/* RCODE, QTYPE, delay bin: the values met (RCODEs of DNS, the QTYPEs assigned but TA and DLV, delays up to 71
 * minutes), the others counted in the dict directly. Small: each call zeroes them (the whole range of each, 0.9 MB
 * a call, evicted the pipeline's own data from the cache). */
static const Py_ssize_t TALLY_SIZES[3] = {1 << 6, 1 << 10, 1 << 12};

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
    char *arena; /* the registered domains of the distinct QNAMEs (without a domain column) */
    size_t arena_cap;
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
    size_t need = 0, used = 0; /* (a domain is no longer than its name: the arena never moves under t->domains) */
    for (Py_ssize_t e = 0; e < t->names.n; e++)
        need += t->names.at[e].len == UINT32_MAX ? 0 : t->names.at[e].len;
    if (need >= t->arena_cap) {
        char *a = PyMem_Realloc(t->arena, need + 1);
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->arena = a;
        t->arena_cap = need + 1;
    }
    counts_clear(&t->domains);
    for (Py_ssize_t e = 0; e < t->names.n; e++) {
        const Distinct *d = &t->names.at[e];
        const char *domain = "";
        Py_ssize_t len = 0;
        if (d->len != UINT32_MAX && (len = psl->registered_domain(t->rules, d->p, d->len, &domain)) < 0)
            return -1;
        memcpy(t->arena + used, domain, (size_t)len); /* (kept only if the domain is new) */
        int added = counts_add(&t->domains, ITEM_STR, t->arena + used, (uint32_t)len, d->count);
        if (added < 0)
            return -1;
        used += added ? (size_t)len : 0;
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
    const char *p = NULL;
    Py_ssize_t len;
    int got = textin_get(&t->qname, i, &p, &len);
    if (got < 0 || counts_add(&t->names, ITEM_STR, p, got ? (uint32_t)len : UINT32_MAX, 1) < 0)
        return -1;
    if ((got = textin_get(&t->src, i, &p, &len)) < 0 ||
        (got && counts_add(&t->clients, ITEM_STR, p, (uint32_t)len, 1) < 0))
        return -1;
    if (t->has_domain && ((got = textin_get(&t->domain, i, &p, &len)) < 0 ||
                          counts_add(&t->domains, ITEM_STR, p, got ? (uint32_t)len : UINT32_MAX, 1) < 0))
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
    long long rows = 0;
    for (Py_ssize_t i = 0; i < t->n && !failed; i++)
        if (seconds[i] == s) {
            rows++;
            failed = count_row(t, dicts, i) < 0;
        }
    for (int k = 0; k < 3; k++) /* (also on error: empties them; they were filled only with every dict there) */
        if (dicts[k] != NULL)
            failed = tally_flush(&t->tallies[k], dicts[k]) < 0 || failed;
    failed = failed || summary_batch(qnames, &t->names) < 0 || (!t->has_domain && count_domains(t) < 0) ||
             summary_batch(domains, &t->domains) < 0 || summary_batch(clients, &t->clients) < 0;
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
        failed = seconds == NULL || order == NULL;
        for (int k = 0; k < 3 && !failed; k++) {
            t.tallies[k].size = TALLY_SIZES[k];
            failed = (t.tallies[k].n = PyMem_Calloc(TALLY_SIZES[k], sizeof(long long))) == NULL ||
                     (t.tallies[k].seen = PyMem_Calloc(TALLY_SIZES[k], sizeof(int32_t))) == NULL;
        }
        if (failed)
            PyErr_NoMemory();
    }
    /* (room for a second's usual distinct values, grown as needed: a small index stays in the cache) */
    failed = failed || counts_grow(&t.names, 0) < 0 || counts_grow(&t.clients, 0) < 0 || counts_grow(&t.domains, 0) < 0;
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
