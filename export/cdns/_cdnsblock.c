/* export.cdns._cdnsblock: the per-transaction loop of a C-DNS block (export/cdns/block.py Block.add_python) and the
 * CBOR of the Q/R items and signatures of Block.encode, in C.
 *
 * Why: building the block tables, signatures and item tuples and turning the items into maps were most of the
 * C-DNS export's time in Python; this does the same work from message records into the same Python tables.
 * export/cdns/block.py keeps the Python loop (on transaction tuples) as the reference and the fallback, and the
 * tests compare the two (tests/export/test_cdns_block.py, test_cdnsrec.py): every table in the same insertion
 * order, the same item tuples and counters.
 *
 * add_records(txs, start, stop, ip, names, classtype, sigs, items, earliest, qr_type[, cache])
 *     -> (stop, earliest, processed, unmatched_queries, unmatched_responses)
 *   Adds transactions start..stop-1 of a probe._records.TxBatch (message records) to the tables (value -> index in
 *   insertion order: ip and names Keys, see below; classtype and sigs dicts) and to items (an Items), exactly as
 *   Block.add_python does with the same transactions as tuples, without client privacy and without full sections. It stops at the first transaction
 *   it does not take (a malformed message, a header the walk would trip on); that transaction is left untouched
 *   for the caller to add with the Python loop (stop returned == stop given when all were taken).
 *   cache: the block's Cache(like=the previous block's), which answers most class/type and signature lookups
 *   without making their key objects (see "Lookups by content" below); the tables come out the same with or
 *   without it.
 *
 * encode_items(items, earliest, new_ip, new_sig, new_name) -> bytes or None
 *   cbor2.dumps of the QueryResponse maps of Block.encode (encode.item_maps_python: cdns._item, the indexes
 *   renumbered through the lists) written directly (no maps made: making and freeing them cost as much as
 *   encoding them); None when an item holds anything but ints and None (the extended sections of
 *   cdns_full_sections, whose blocks are built in Python too), for the caller to encode item_maps_python's.
 *
 * encode_signatures(sigs, order, new_ip, new_name) -> bytes or None
 *   The same for the signature table (a Keys(arity=17), or a list of tuples):
 *   cbor2.dumps([cdns._signature(list(sigs)[i], new_ip, new_name) for i in order]).
 *
 * encode_table(table, order) -> bytes or None
 *   The same for the address and name tables (Keys, or dicts of bytes): cbor2.dumps([list(table)[i] for i in
 *   order]), a Keys' written from its buffer.
 *
 * renumbering(items, sigs, n_ip, n_names, rr) -> ((order, new) of the signatures, addresses, names)
 *   encode._renumbering's Python: the uses of each index counted, the tables ordered most used first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fastint.h"
#include "records.h"
#include "wire.h"

/* export.cdns_format values (compared by the tests through CONSTANTS). */
#define NS_PER_TICK 1000
/* RFC 8618 transport value (qr-transport-flags bits 1-4) by transport code (probe.model TRANSPORTS; 15 for a
 * code outside the table) */
static const long CDNS_TRANSPORT[] = {15, 0, 1, 2, 4, 15, 15, 15};
#define N_TRANSPORTS ((long long)(sizeof CDNS_TRANSPORT / sizeof CDNS_TRANSPORT[0]))

static long cdns_transport(long long transport)
{
    return transport >= 0 && transport < N_TRANSPORTS ? CDNS_TRANSPORT[transport] : 15;
}
#define TRANSPORT_QUERY_TRAILINGDATA (1 << 5)
#define QR_HAS_QUERY (1 << 0)
#define QR_HAS_RESPONSE (1 << 1)
#define QR_QUERY_HAS_OPT (1 << 2)
#define QR_RESPONSE_HAS_OPT (1 << 3)
#define QR_QUERY_HAS_NO_QUESTION (1 << 4)
#define QR_RESPONSE_HAS_NO_QUESTION (1 << 5)
#define QUERY_DO (1 << 7)

#define F(m, i) PyTuple_GET_ITEM((m), (i))

/* An exact int that fits a long long, into *out; 0 for anything else (no exception left set). */
static inline int as_ll(PyObject *o, long long *out)
{
    if (compact_int(o, out))
        return 1;
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* dnswire.read_name followed by cdns._wire: the name at off, pointers followed, in uncompressed wire form
 * (out holds 256 bytes). 0 where read_name would raise. */
static int wire_name(const unsigned char *p, Py_ssize_t n, Py_ssize_t off, unsigned char *out, Py_ssize_t *outlen)
{
    NameLabels name;
    if (name_labels(p, n, &off, &name) != OK)
        return 0;
    Py_ssize_t w = 0;
    for (int i = 0; i < name.count; i++) {
        memcpy(out + w, p + name.at[i], p[name.at[i]] + 1);
        w += p[name.at[i]] + 1;
    }
    out[w++] = 0;
    *outlen = w;
    return 1;
}

/* cdns.message_end: the offset just past the last RR; -1 where the Python walk would raise. */
static Py_ssize_t message_end(const unsigned char *p, Py_ssize_t n)
{
    Py_ssize_t off = 12;
    if (n < 12 || skip_questions(p, n, &off, rd16(p + 4)) != OK
        || walk_rrs_at(p, n, &off, rd16(p + 6) + rd16(p + 8) + rd16(p + 10), NULL, NULL) != OK)
        return -1;
    return off;
}

/* The int object of a table index (new reference), from a list of them kept for the module's life below
 * INDEX_INTS_MAX. Why: a block's tables give out thousands of indexes (the dicts' values, the renumbering's lists),
 * the same ones block after block; making and freeing an int object for each was a fifth of encoding a block. */
#define INDEX_INTS_MAX (1 << 18)
static PyObject *index_ints; /* [0, 1, 2, ...] */

static PyObject *index_int(Py_ssize_t i)
{
    if (i < 0 || i >= INDEX_INTS_MAX)
        return PyLong_FromSsize_t(i);
    if (index_ints == NULL && (index_ints = PyList_New(0)) == NULL)
        return NULL;
    for (Py_ssize_t n = PyList_GET_SIZE(index_ints); n <= i; n++) {
        PyObject *v = PyLong_FromSsize_t(n);
        int rc = v == NULL ? -1 : PyList_Append(index_ints, v);
        Py_XDECREF(v);
        if (rc < 0)
            return NULL;
    }
    return Py_NewRef(PyList_GET_ITEM(index_ints, i));
}

/* _Table.index: the index of key in d, added at the end when new (new reference). */
static PyObject *table_index(PyObject *d, PyObject *key)
{
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v != NULL) {
        Py_INCREF(v);
        return v;
    }
    if (PyErr_Occurred())
        return NULL;
    v = index_int(PyDict_GET_SIZE(d));
    if (v != NULL && PyDict_SetItem(d, key, v) < 0)
        Py_CLEAR(v);
    return v;
}


/* ---------------------------------------------------------------------------------------------
 * Tables of keys by content: the block's address, name and signature tables (Keys, below), and a Cache in front of
 * its class/type dict.
 *
 * Why: looking a transaction's signature up in a dict needs its 17-field tuple, made of new int objects, hashed
 * field by field and compared on a hit, then freed; the QNAME and the class/type pair need a new bytes object and
 * a new tuple likewise. A Table keeps, for every key, its packed bytes (a signature's ints as varints, a name's
 * wire bytes) and its index: a hit makes no object at all. The Cache (one per block, passed to add) answers in
 * front of the class/type dict: a miss asks the dict (table_index, so the dict stays the one truth: keys the
 * Python loop added are found there) and remembers the answer. Keys are compared by content, as the dicts compare
 * them (exact ints, bytes).
 *
 * A slot is 16 bytes (hash, where its key is, the index as a C int) and the keys are copied one after the other
 * into the table's own buffer: a hit reads the slot and the key's bytes, no Python object (a slot holding the key
 * and the index as objects cost a cache miss on each, the slots being 24 bytes, the index's refcount written).
 *
 * The hash is fixed and the keys come from the traffic, so keys can be made to collide: a key is looked
 * for and placed only within MAX_PROBE slots of its home. A key that finds no room there is not
 * remembered (its lookups go to the dict, whose hash is seeded per process: the Cache's, a Keys' overflow dict),
 * so colliding keys cost at most MAX_PROBE comparisons each instead of a scan of all earlier ones. */

#define MAX_PROBE 16

typedef struct {
    uint64_t hash; /* 0: an empty slot */
    uint32_t at;   /* the key in Table.keys: its length (4 bytes), then its bytes */
    int32_t index; /* the dict's value for the key */
} Slot;

typedef struct {
    Slot *slots;
    size_t mask; /* capacity - 1; capacity a power of two */
    size_t used;
    unsigned char *keys; /* the keys remembered, in the order they came */
    size_t keys_len, keys_cap;
    size_t first_cap, first_keys; /* the first allocations (Cache(like)), 0: the least */
    unsigned long long probes; /* slots looked at, for the tests: the work is bounded per key */
} Table;

/* The last key looked up in front of a table, with the index it got: the server address and the query's OPT RDATA
 * repeat from one transaction to the next, and this answers them without hashing. */
#define MEMO_MAX 32

typedef struct {
    Py_ssize_t index1; /* 1 + the index; 0: empty */
    Py_ssize_t len;
    unsigned char key[MEMO_MAX];
} Memo;

/* Class IN's types below 256 (nearly every question) index the class/type table's answers directly. */
#define CT_DIRECT 256

typedef struct {
    PyObject_HEAD
    Table classtype;
    Memo server, opt; /* in front of the block's Keys of addresses, of names */
    Py_ssize_t class_in[CT_DIRECT]; /* 1 + the class/type index of (type, 1), or 0 */
} Cache;

/* The last n % 8 bytes of p[0..n) as memcpy would put them in a zeroed uint64_t (little-endian), read whole: copied
 * a byte at a time, then read as a word, they stalled the load on the stores. */
static inline uint64_t tail_word(const unsigned char *p, size_t n)
{
    size_t r = n & 7;
    uint64_t w = 0;
#if !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
    memcpy(&w, p + n - r, r);
    return w;
#endif
    uint32_t lo, hi;
    if (n >= 8) { /* the 8 bytes that end the key, the r last of them kept */
        memcpy(&w, p + n - 8, 8);
        return w >> (8 * (8 - r));
    }
    if (r >= 4) { /* two 4-byte words, overlapping */
        memcpy(&lo, p, 4);
        memcpy(&hi, p + r - 4, 4);
        return lo | (uint64_t)hi << (8 * (r - 4));
    }
    return (uint64_t)p[0] | (uint64_t)p[r / 2] << (8 * (r / 2)) | (uint64_t)p[r - 1] << (8 * (r - 1));
}

static inline uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n, w;
    const unsigned char *q = p;
    for (size_t left = n; left >= 8; q += 8, left -= 8) {
        memcpy(&w, q, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    if (n & 7) {
        w = tail_word(p, n);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    h ^= h >> 29;
    return h ? h : 1;
}

static inline int key_equals(const Table *t, uint32_t at, const void *p, Py_ssize_t n)
{
    uint32_t len;
    memcpy(&len, t->keys + at, sizeof len);
    return len == (size_t)n && memcmp(t->keys + at + sizeof len, p, n) == 0;
}

/* The index stored for key p[0..n) with hash h, or -1. */
static Py_ssize_t table_find(Table *t, uint64_t h, const void *p, Py_ssize_t n)
{
    if (t->slots == NULL)
        return -1;
    size_t i = h & t->mask;
    for (int k = 0; k < MAX_PROBE; k++, i = (i + 1) & t->mask) {
        const Slot *s = &t->slots[i];
        t->probes++;
        if (s->hash == 0)
            return -1;
        if (s->hash == h && key_equals(t, s->at, p, n))
            return s->index;
    }
    return -1;
}

/* Put s in the first free slot within MAX_PROBE of its home; 0 when there is none. */
static int table_place(Slot *slots, size_t mask, Slot s, unsigned long long *probes)
{
    size_t i = s.hash & mask;
    for (int k = 0; k < MAX_PROBE; k++, i = (i + 1) & mask) {
        ++*probes;
        if (slots[i].hash == 0) {
            slots[i] = s;
            return 1;
        }
    }
    return 0;
}

static int overflow_put(PyObject **overflow, const Table *t, Slot s);

/* Twice the capacity (256 slots at first), the keys placed again; 0, or -1 on no memory. overflow: where a key the
 * new capacity's homes crowd out goes (a Keys table's overflow dict; NULL: a Cache's, whose dict still has it). */
static int table_grow(Table *t, PyObject **overflow)
{
    size_t cap = t->slots != NULL ? 2 * (t->mask + 1) : t->first_cap ? t->first_cap : 256;
    Slot *slots = PyMem_Calloc(cap, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; t->slots != NULL && i <= t->mask; i++) {
        if (t->slots[i].hash != 0 && !table_place(slots, cap - 1, t->slots[i], &t->probes)) {
            t->used--; /* (Rarely.) */
            if (overflow != NULL && overflow_put(overflow, t, t->slots[i]) < 0) {
                PyMem_Free(slots);
                return -1;
            }
        }
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

/* Remember key p[0..n) (hash h, not in t) -> index; -1 on no memory. A key with no room within MAX_PROBE of its
 * home (a run of linear probing: a few keys in a block's thousands) makes the table grow once, when it is at least
 * an eighth full, rather than be left out: a table missing a key of its dict no longer answers "new" on a miss
 * (table_miss_index). Keys made to share a hash are still left out, and the table stays within 16 slots a key;
 * so are the keys past 4 GiB of keys or 2^31 indexes (their lookups go to the dict). */
static int table_put(Table *t, uint64_t h, const void *p, Py_ssize_t n, Py_ssize_t index)
{
    size_t room = sizeof(uint32_t) + (size_t)n;
    if (index < 0 || index > INT32_MAX || t->keys_len + room > UINT32_MAX)
        return 0;
    if ((t->slots == NULL || 2 * (t->used + 1) > t->mask + 1) && table_grow(t, NULL) < 0)
        return -1;
    if (t->keys_len + room > t->keys_cap) {
        unsigned char *keys = ext_grow(t->keys, &t->keys_cap, t->keys_len + room, 1,
                                       t->first_keys ? t->first_keys : 1 << 14);
        if (keys == NULL)
            return -1;
        t->keys = keys;
    }
    Slot s = {h, (uint32_t)t->keys_len, (int32_t)index};
    int placed = table_place(t->slots, t->mask, s, &t->probes);
    if (!placed && 8 * t->used >= t->mask + 1) {
        if (table_grow(t, NULL) < 0)
            return -1;
        placed = table_place(t->slots, t->mask, s, &t->probes);
    }
    if (placed) {
        uint32_t len = (uint32_t)n;
        memcpy(t->keys + t->keys_len, &len, sizeof len);
        memcpy(t->keys + t->keys_len + sizeof len, p, n);
        t->keys_len += room;
        t->used++;
    }
    return 0;
}

static void table_clear(Table *t)
{
    PyMem_Free(t->slots);
    PyMem_Free(t->keys);
    *t = (Table){.probes = t->probes};
}

/* t, empty, to start at the sizes the previous block's table l reached (or started at). */
static void table_sized_like(Table *t, const Table *l)
{
    t->first_cap = l->slots != NULL ? l->mask + 1 : l->first_cap;
    t->first_keys = l->keys_cap ? l->keys_cap : l->first_keys;
}

/* A packed key of ints and Nones: the values in order, then a bit per None. */
#define MAX_KEY 17
#define SIG_FIELDS 17 /* a Q/R signature's fields (Block.add_python's `sig`) */
typedef struct {
    int64_t v[MAX_KEY];
    uint32_t nones;
    int n;
} Packed;

static void pack_ll(Packed *k, long long v) { k->v[k->n++] = (int64_t)v; }

static void pack_none(Packed *k)
{
    k->nones |= 1u << k->n;
    k->v[k->n++] = 0;
}

/* An exact int or None; 0 for anything else (the key cannot be packed: no cache for it). */
static inline int pack_obj(Packed *k, PyObject *o)
{
    long long v;
    if (o == Py_None) {
        pack_none(k);
        return 1;
    }
    if (!as_ll(o, &v))
        return 0;
    pack_ll(k, v);
    return 1;
}

/* The most bytes of a packed key: 10 a value (a 64-bit varint), then the None bits. */
#define PACKED_MAX (MAX_KEY * 10 + sizeof(uint32_t))

/* The bytes a packed key is compared and hashed by, into buf (PACKED_MAX): v[0..n) as zigzag varints, then nones;
 * their length. Why varints: a signature's 17 values are small (most below 128), so its key is about 25 bytes to
 * hash and compare instead of 140; the keys of one table all have n values, so the bytes are still one key's only. */
static Py_ssize_t packed_bytes(const Packed *k, unsigned char *buf)
{
    unsigned char *w = buf;
    for (int i = 0; i < k->n; i++) {
        uint64_t z = ((uint64_t)k->v[i] << 1) ^ (uint64_t)(k->v[i] >> 63);
        for (; z >= 0x80; z >>= 7)
            *w++ = (unsigned char)(z | 0x80);
        *w++ = (unsigned char)z;
    }
    memcpy(w, &k->nones, sizeof k->nones);
    return w + sizeof k->nones - buf;
}

/* The packed key of p[0..n) (packed_bytes of `arity` values): 1, or 0 when it is not one. */
static int packed_of_bytes(const unsigned char *p, Py_ssize_t n, int arity, Packed *k)
{
    const unsigned char *end = p + n - sizeof k->nones;
    k->n = 0;
    for (int i = 0; i < arity; i++) {
        uint64_t z = 0;
        for (int shift = 0;; shift += 7) {
            if (p >= end || shift > 63)
                return 0;
            z |= (uint64_t)(*p & 0x7F) << shift;
            if (!(*p++ & 0x80))
                break;
        }
        k->v[k->n++] = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    }
    if (p != end)
        return 0;
    memcpy(&k->nones, p, sizeof k->nones);
    return 1;
}

/* A tuple of `arity` exact ints (that fit 64 bits) or None, packed: 1, or 0 when it is not one. */
static int packed_of_tuple(PyObject *t, int arity, Packed *k)
{
    *k = (Packed){.n = 0};
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != arity)
        return 0;
    for (int i = 0; i < arity; i++) {
        if (!pack_obj(k, F(t, i)))
            return 0;
    }
    return 1;
}

/* The packed key's tuple (new reference). */
static PyObject *tuple_of_packed(const Packed *k)
{
    PyObject *t = PyTuple_New(k->n);
    for (int i = 0; t != NULL && i < k->n; i++)
        ext_set_item(&t, i, k->nones >> i & 1 ? Py_NewRef(Py_None) : PyLong_FromLongLong(k->v[i]));
    return t;
}

/* The index stored for a packed key in t, or -1; *h and buf/len are set for table_put. */
static Py_ssize_t packed_find(Table *t, const Packed *k, unsigned char *buf, Py_ssize_t *len, uint64_t *h)
{
    *len = packed_bytes(k, buf);
    *h = hash_bytes(buf, *len);
    return table_find(t, *h, buf, *len);
}


/* ---------------------------------------------------------------------------------------------
 * Keys: a block's address, name or signature table (key -> index, in insertion order), held in C.
 *
 * Why: they were dicts of bytes, and a third of the address and name lookups are of new keys: a bytes object, a
 * SipHash, an insertion and the dict's resizes each (a fifth of add_records), for tables that are then only
 * counted and written out. Keys holds every key in its own buffer (Table.keys, in index order; at[i]: where key i
 * is), found through the slots; add_records makes no object, encode_table writes the table's CBOR from the buffer,
 * and Python (Block.add_python, the reference encoder, the tests) reads it as the dict it replaces: len, iteration
 * in index order, items(), `in`, get(key), index(key) (_Table.index), each key's bytes made when asked for.
 * A key that finds no slot within MAX_PROBE of its home (keys made to collide, see above) goes to an overflow dict,
 * whose hash is seeded per process; it is asked only when it is not empty, so a lookup costs at most MAX_PROBE
 * slots and a dict lookup.
 * The signature table's keys are tuples of ints and None (Keys(arity=17)): held packed (packed_bytes), made
 * tuples again when Python asks (a new signature was a tuple of 17 ints hashed into a dict).
 * A Keys of bytes also holds None (the address of a dnstap message without one, which Block.add_python adds) as the
 * dict did: an index of its own (none_index) whose key is read back as None and written as CBOR null. */
typedef struct {
    PyObject_HEAD
    int arity;          /* 0: keys are bytes; else tuples of `arity` ints or None, packed */
    Table t;            /* t.used: the keys in a slot */
    uint32_t *at;       /* at[i]: where key i is in t.keys */
    size_t n, at_cap, first_at;
    Py_ssize_t none_index; /* None's index, -1: not held */
    PyObject *overflow; /* bytes -> index of the keys in no slot, or NULL */
} Keys;

static PyTypeObject KeysType;

static PyObject *key_bytes(const Table *t, uint32_t at)
{
    uint32_t len;
    memcpy(&len, t->keys + at, sizeof len);
    return PyBytes_FromStringAndSize((const char *)t->keys + at + sizeof len, len);
}

static int overflow_put(PyObject **overflow, const Table *t, Slot s)
{
    if (*overflow == NULL && (*overflow = PyDict_New()) == NULL)
        return -1;
    PyObject *key = key_bytes(t, s.at), *v = index_int(s.index);
    int rc = key == NULL || v == NULL ? -1 : PyDict_SetItem(*overflow, key, v);
    Py_XDECREF(key);
    Py_XDECREF(v);
    return rc;
}

/* The index of key p[0..n) (hash h), -1 when k does not hold it, or -2 (an exception). */
static Py_ssize_t keys_find(Keys *k, uint64_t h, const void *p, Py_ssize_t n)
{
    Py_ssize_t i = table_find(&k->t, h, p, n);
    if (i >= 0 || k->overflow == NULL)
        return i;
    PyObject *key = PyBytes_FromStringAndSize((const char *)p, n);
    if (key == NULL)
        return -2;
    PyObject *v = PyDict_GetItemWithError(k->overflow, key);
    Py_DECREF(key);
    if (v == NULL)
        return PyErr_Occurred() ? -2 : -1;
    return PyLong_AsSsize_t(v);
}

/* Key p[0..n) (hash h), which k does not hold, added as index k->n: the index, or -1 (an exception; k unchanged).
 * place 0: the key is not put in a slot (None's empty key: found through none_index only). */
static Py_ssize_t keys_add(Keys *k, uint64_t h, const void *p, Py_ssize_t n, int place)
{
    Table *t = &k->t;
    size_t room = sizeof(uint32_t) + (size_t)n;
    if (k->n >= INT32_MAX || t->keys_len + room > UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a C-DNS block's address or name table is full");
        return -1;
    }
    if (k->n == k->at_cap) {
        uint32_t *at = ext_grow(k->at, &k->at_cap, k->n + 1, sizeof *at, k->first_at ? k->first_at : 1024);
        if (at == NULL)
            return -1;
        k->at = at;
    }
    if (t->keys_len + room > t->keys_cap) {
        unsigned char *keys = ext_grow(t->keys, &t->keys_cap, t->keys_len + room, 1,
                                       t->first_keys ? t->first_keys : 1 << 14);
        if (keys == NULL)
            return -1;
        t->keys = keys;
    }
    if (place && (t->slots == NULL || 2 * (t->used + 1) > t->mask + 1) && table_grow(t, &k->overflow) < 0)
        return -1;
    Slot s = {h, (uint32_t)t->keys_len, (int32_t)k->n};
    uint32_t len = (uint32_t)n;
    memcpy(t->keys + t->keys_len, &len, sizeof len);
    if (n)
        memcpy(t->keys + t->keys_len + sizeof len, p, n);
    int placed = place && table_place(t->slots, t->mask, s, &t->probes);
    if (place && !placed && 8 * t->used >= t->mask + 1) { /* a run of linear probing: grown once, as table_put does */
        if (table_grow(t, &k->overflow) < 0)
            return -1;
        placed = table_place(t->slots, t->mask, s, &t->probes);
    }
    if (place && !placed && overflow_put(&k->overflow, t, s) < 0)
        return -1;
    t->used += placed;
    t->keys_len += room;
    k->at[k->n] = s.at;
    return (Py_ssize_t)k->n++;
}

/* The index of key p[0..n), added when new; -1 (an exception). h: its hash_bytes, or 0 (not known yet). */
static Py_ssize_t keys_index(Keys *k, const void *p, Py_ssize_t n, uint64_t h)
{
    if (h == 0)
        h = hash_bytes(p, n);
    Py_ssize_t i = keys_find(k, h, p, n);
    if (i >= 0)
        return i;
    return i == -2 ? -1 : keys_add(k, h, p, n, 1);
}

/* Key i's bytes and length. */
static inline const unsigned char *keys_at(const Keys *k, size_t i, Py_ssize_t *len)
{
    uint32_t n;
    memcpy(&n, k->t.keys + k->at[i], sizeof n);
    *len = n;
    return k->t.keys + k->at[i] + sizeof n;
}

/* Keys(like=None, arity=0): like, the previous block's Keys, whose sizes this one's start at (see Cache). */
static int keys_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *like = Py_None;
    int arity = 0;
    static char *kwlist[] = {"like", "arity", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Oi:Keys", kwlist, &like, &arity))
        return -1;
    if (arity < 0 || arity > MAX_KEY) {
        PyErr_Format(PyExc_ValueError, "Keys(arity): 0 (bytes keys) to %d", MAX_KEY);
        return -1;
    }
    ((Keys *)self)->arity = arity;
    ((Keys *)self)->none_index = -1;
    if (like == Py_None)
        return 0;
    if (!Py_IS_TYPE(like, &KeysType)) {
        PyErr_SetString(PyExc_TypeError, "Keys(like): like must be a Keys or None");
        return -1;
    }
    Keys *k = (Keys *)self;
    const Keys *l = (const Keys *)like;
    table_sized_like(&k->t, &l->t);
    k->first_at = l->at_cap ? l->at_cap : l->first_at;
    return 0;
}

static void keys_dealloc(PyObject *self)
{
    Keys *k = (Keys *)self;
    table_clear(&k->t);
    PyMem_Free(k->at);
    Py_XDECREF(k->overflow);
    Py_TYPE(self)->tp_free(self);
}

/* The index of a key (-1: not held; get), added when new (index); NULL on an error. A key of a Keys of bytes is
 * bytes-like or None; of tuples, a tuple of `arity` ints or None (another one is not held, and cannot be added). */
static PyObject *keys_lookup(Keys *k, PyObject *key, int add, PyObject *missing)
{
    Py_buffer view = {.buf = NULL};
    unsigned char buf[PACKED_MAX];
    const void *p = buf;
    Py_ssize_t n;
    if (!k->arity && key == Py_None) {
        if (k->none_index < 0 && add)
            k->none_index = keys_add(k, 0, NULL, 0, 0);
        if (k->none_index >= 0)
            return index_int(k->none_index);
        return add ? NULL : Py_NewRef(missing);
    }
    if (k->arity) {
        Packed packed;
        if (!packed_of_tuple(key, k->arity, &packed)) {
            if (!add)
                return Py_NewRef(missing);
            return PyErr_Format(PyExc_TypeError, "Keys(arity=%d) holds tuples of %d ints (64 bits) or None",
                                k->arity, k->arity);
        }
        n = packed_bytes(&packed, buf);
    } else {
        if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0)
            return NULL;
        p = view.buf, n = view.len;
    }
    uint64_t h = hash_bytes(p, n);
    Py_ssize_t i = add ? keys_index(k, p, n, h) : keys_find(k, h, p, n);
    if (view.buf != NULL)
        PyBuffer_Release(&view);
    if (i >= 0)
        return index_int(i);
    return i == -1 && !add ? Py_NewRef(missing) : NULL;
}

/* Key i as Python has it: bytes, or its tuple (new reference). */
static PyObject *keys_object(const Keys *k, size_t i)
{
    Py_ssize_t len;
    const unsigned char *p = keys_at(k, i, &len);
    if (!k->arity)
        return (Py_ssize_t)i == k->none_index ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)p, len);
    Packed packed;
    if (!packed_of_bytes(p, len, k->arity, &packed)) {
        PyErr_SetString(PyExc_SystemError, "Keys: a packed key does not unpack");
        return NULL;
    }
    return tuple_of_packed(&packed);
}

static PyObject *keys_index_method(PyObject *self, PyObject *key)
{
    return keys_lookup((Keys *)self, key, 1, NULL);
}

static PyObject *keys_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    return keys_lookup((Keys *)self, args[0], 0, nargs == 2 ? args[1] : Py_None);
}

static int keys_contains(PyObject *self, PyObject *key)
{
    PyObject *i = keys_lookup((Keys *)self, key, 0, Py_None);
    int rc = i == NULL ? -1 : i != Py_None;
    Py_XDECREF(i);
    return rc;
}

static Py_ssize_t keys_len(PyObject *self) { return (Py_ssize_t)((Keys *)self)->n; }

/* [key, ...] (pairs: [(key, index), ...]) in index order. */
static PyObject *keys_list(Keys *k, int pairs)
{
    PyObject *out = PyList_New((Py_ssize_t)k->n);
    for (size_t i = 0; out != NULL && i < k->n; i++) {
        PyObject *key = keys_object(k, i);
        ext_set_item(&out, (Py_ssize_t)i, pairs && key != NULL ? Py_BuildValue("NN", key, index_int(i)) : key);
    }
    return out;
}

static PyObject *keys_iter(PyObject *self)
{
    PyObject *list = keys_list((Keys *)self, 0);
    PyObject *it = list != NULL ? PyObject_GetIter(list) : NULL;
    Py_XDECREF(list);
    return it;
}

static PyObject *keys_items(PyObject *self, PyObject *Py_UNUSED(unused)) { return keys_list((Keys *)self, 1); }

static PyObject *keys_placed(PyObject *self, PyObject *Py_UNUSED(unused))
{
    return PyLong_FromSize_t(((Keys *)self)->t.used);
}

static PyObject *keys_probes(PyObject *self, PyObject *Py_UNUSED(unused))
{
    return PyLong_FromUnsignedLongLong(((Keys *)self)->t.probes);
}

static PyMethodDef keys_methods[] = {
    {"index", keys_index_method, METH_O, "index(key) -> the key's index, the key added when new (_Table.index)."},
    {"get", (PyCFunction)(void (*)(void))keys_get, METH_FASTCALL, "get(key, default=None) -> the key's index."},
    {"items", keys_items, METH_NOARGS, "items() -> [(key, index), ...] in index order."},
    {"placed", keys_placed, METH_NOARGS, "placed() -> the keys found through the slots (the others: a dict)."},
    {"probes", keys_probes, METH_NOARGS, "probes() -> slots looked at (the work is bounded per key)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KeysType = EXT_TYPE(Keys, "export.cdns._cdnsblock.Keys", 0,
    "Keys(like=None, arity=0): a block's table of bytes keys (addresses, names), or of tuples of `arity` ints or None "
    "(signatures), key -> index in insertion order, held in C and read as that dict; like: the previous block's Keys, "
    "whose sizes it starts at.",
    .tp_new = PyType_GenericNew, .tp_init = keys_init, .tp_dealloc = keys_dealloc, .tp_methods = keys_methods,
    .tp_iter = keys_iter, .tp_hash = PyObject_HashNotImplemented,
    .tp_as_sequence = &(PySequenceMethods){.sq_length = keys_len, .sq_contains = keys_contains});

static void cache_dealloc(PyObject *self)
{
    Cache *c = (Cache *)self;
    table_clear(&c->classtype);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *cache_len(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Cache *c = (Cache *)self;
    return PyLong_FromSize_t(c->classtype.used);
}

static PyObject *cache_probes(PyObject *self, PyObject *Py_UNUSED(unused))
{
    Cache *c = (Cache *)self;
    return PyLong_FromUnsignedLongLong(c->classtype.probes);
}

/* Cache(like=None): like, the previous block's Cache, whose tables' sizes this one's start at (a block's tables are
 * the size of the last one's, nearly: grown from the least, they were placed again five times a block). */
static int cache_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *like = Py_None;
    static char *kwlist[] = {"like", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Cache", kwlist, &like))
        return -1;
    if (like == Py_None)
        return 0;
    if (!Py_IS_TYPE(like, Py_TYPE(self))) {
        PyErr_SetString(PyExc_TypeError, "Cache(like): like must be a Cache or None");
        return -1;
    }
    Cache *c = (Cache *)self, *l = (Cache *)like;
    table_sized_like(&c->classtype, &l->classtype);
    return 0;
}

static PyMethodDef cache_methods[] = {
    {"sizes", cache_len, METH_NOARGS, "sizes() -> class/types remembered."},
    {"probes", cache_probes, METH_NOARGS, "probes() -> slots looked at in the class/type table."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CacheType = EXT_TYPE(Cache, "export.cdns._cdnsblock.Cache", 0,
    "Cache(like=None): lookups by content in front of one block's class/type dict (add), and memos of the last "
    "server address and OPT RDATA; "
    "like: the previous block's Cache, whose sizes its tables start at.",
    .tp_new = PyType_GenericNew, .tp_init = cache_init, .tp_dealloc = cache_dealloc, .tp_methods = cache_methods);

/* A dict's value as the index it is: >= 0, or -1 (SystemError: the dict holds something else). */
static Py_ssize_t index_value(PyObject *v)
{
    long long i;
    if (v == NULL)
        return -1;
    int ok = as_ll(v, &i) && i >= 0 && i <= PY_SSIZE_T_MAX;
    Py_DECREF(v);
    if (!ok) {
        PyErr_SetString(PyExc_SystemError, "_cdnsblock.add: a table index is not an int");
        return -1;
    }
    return (Py_ssize_t)i;
}

/* table_index of a key that t was just asked for and does not hold. When t holds as many keys as d (then its keys
 * are all of d's: it remembers only keys d gave an index, each once), the key is not in d either: it is added
 * without looking it up first (for a signature, that lookup hashed its 17 values once more). The index, or -1. */
static Py_ssize_t table_miss_index(const Table *t, PyObject *d, PyObject *key)
{
    if (t == NULL || t->used != (size_t)PyDict_GET_SIZE(d))
        return index_value(table_index(d, key));
    Py_ssize_t n = PyDict_GET_SIZE(d);
    PyObject *v = index_int(n);
    if (v == NULL)
        return -1;
    int rc = PyDict_SetItem(d, key, v);
    Py_DECREF(v);
    return rc < 0 ? -1 : n;
}

/* keys_index through the memo m of the last key (NULL: none); -1 on an error. */
static Py_ssize_t memo_index(Memo *m, Keys *k, const void *p, Py_ssize_t n)
{
    if (m != NULL && m->index1 > 0 && m->len == n && memcmp(m->key, p, n) == 0)
        return m->index1 - 1;
    Py_ssize_t i = keys_index(k, p, n, 0);
    if (i >= 0 && m != NULL && n <= MEMO_MAX) {
        m->index1 = i + 1;
        m->len = n;
        memcpy(m->key, p, n);
    }
    return i;
}

/* ---------------------------------------------------------------------------------------------
 * Items: a block's Q/R items as C structs.
 *
 * Why: an item was a 12-tuple holding new ints (time, response delay): made per transaction, read again
 * by renumbering and encode_items, and freed with the block: allocations per transaction. Items keeps
 * the same values in an array; it reads as the list of tuples it replaces (len, indexing, iteration,
 * == with a list), so Block.encode's Python reference and the tests see the same items. It holds the
 * items of blocks without full sections only: their last two fields (extended sections) are None. */

#define ITEM_INTS 10

typedef struct {
    int64_t v[ITEM_INTS];
    uint32_t nones; /* bit k: field k is None */
} Item;

typedef struct {
    PyObject_HEAD
    Item *a;
    Py_ssize_t n;
    size_t cap;
    size_t first; /* the capacity of the first allocation: Items(expected) (the array grown by doubling was copied
                   * four or five times a block) */
} Items;

static PyTypeObject ItemsType;

static int items_push(Items *s, const Item *it)
{
    if ((size_t)s->n == s->cap) {
        Item *a = ext_grow(s->a, &s->cap, s->cap + 1, sizeof(Item), s->first ? s->first : 1024);
        if (a == NULL)
            return -1;
        s->a = a;
    }
    s->a[s->n++] = *it;
    return 0;
}

/* An item tuple as a struct: 1, or 0 when it is not 12 fields of exact ints or None with None sections. */
static int item_of_tuple(PyObject *t, Item *it)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 12 || F(t, 10) != Py_None || F(t, 11) != Py_None)
        return 0;
    it->nones = 0;
    for (int k = 0; k < ITEM_INTS; k++) {
        long long x = 0;
        if (F(t, k) == Py_None)
            it->nones |= 1u << k;
        else if (!as_ll(F(t, k), &x))
            return 0;
        it->v[k] = x;
    }
    return 1;
}

/* An item field as an object (new reference). */
static PyObject *item_field(const Item *it, int k)
{
    if (k >= ITEM_INTS || it->nones >> k & 1)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(it->v[k]);
}

static PyObject *item_tuple(const Item *it)
{
    PyObject *t = PyTuple_New(12);
    for (int k = 0; t != NULL && k < 12; k++)
        ext_set_item(&t, k, item_field(it, k));
    return t;
}

static PyObject *items_append(PyObject *self, PyObject *t)
{
    Item it;
    if (!item_of_tuple(t, &it)) {
        PyErr_SetString(PyExc_TypeError, "Items holds tuples of 10 ints or None and two None (no extended sections)");
        return NULL;
    }
    if (items_push((Items *)self, &it) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t items_len(PyObject *self) { return ((Items *)self)->n; }

static PyObject *items_getitem(PyObject *self, Py_ssize_t i)
{
    Items *s = (Items *)self;
    if (i < 0 || i >= s->n) {
        PyErr_SetString(PyExc_IndexError, "Items index out of range");
        return NULL;
    }
    return item_tuple(&s->a[i]);
}

static PyObject *items_list(PyObject *self)
{
    Items *s = (Items *)self;
    PyObject *out = PyList_New(s->n);
    for (Py_ssize_t i = 0; out != NULL && i < s->n; i++)
        ext_set_item(&out, i, item_tuple(&s->a[i]));
    return out;
}

/* == and != with a list of item tuples (or another Items): as the list of tuples would compare. */
static PyObject *items_richcompare(PyObject *self, PyObject *other, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !(PyList_Check(other) || Py_IS_TYPE(other, &ItemsType)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *mine = items_list(self);
    PyObject *theirs = PyList_Check(other) ? Py_NewRef(other) : items_list(other);
    PyObject *r = mine != NULL && theirs != NULL ? PyObject_RichCompare(mine, theirs, op) : NULL;
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    return r;
}

/* Items(expected=0): expected, the items the block is to hold (room made for them at the first, up to
 * ITEMS_FIRST_MAX). */
#define ITEMS_FIRST_MAX (1 << 17)

static int items_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t expected = 0;
    static char *kwlist[] = {"expected", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:Items", kwlist, &expected))
        return -1;
    ((Items *)self)->first = (size_t)Py_MAX(Py_MIN(expected, ITEMS_FIRST_MAX), 0);
    return 0;
}

static void items_dealloc(PyObject *self)
{
    PyMem_Free(((Items *)self)->a);
    Py_TYPE(self)->tp_free(self);
}

static PyMethodDef items_methods[] = {
    {"append", items_append, METH_O, "append(item tuple): as list.append (10 ints or None, then two None)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ItemsType = EXT_TYPE(Items, "export.cdns._cdnsblock.Items", 0,
    "Items(expected=0): a block's Q/R items as C structs, read as the list of 12-tuples they replace; room made for "
    "`expected` of them at the first.",
    .tp_new = PyType_GenericNew, .tp_init = items_init, .tp_dealloc = items_dealloc,
    .tp_as_sequence = &(PySequenceMethods){.sq_length = items_len, .sq_item = items_getitem},
    .tp_richcompare = items_richcompare, .tp_hash = PyObject_HashNotImplemented, .tp_methods = items_methods);

typedef struct {
    Keys *ip, *names, *sigs;
    PyObject *classtype, *qr_type;
    Items *store; /* the items */
    Cache *cache; /* or NULL: the dicts alone */
    long long earliest;
    int has_earliest;
    long long processed, unmatched_q, unmatched_r;
} Block;

/* What Block.add_python reads of a transaction, as C values: filled from message records (tx_of_record), then
 * added by add_tx. Optional values (the Python None) are flagged
 * in `nones`, by the N_ bits. */
enum { N_HOP = 1, N_QSIZE = 2, N_RSIZE = 4, N_QAN = 8, N_QNS = 16, N_QAR = 32, N_EDNSV = 64, N_UDP = 128,
       N_QDCOUNT = 256, N_CPORT_UNUSED = 512 };

typedef struct {
    int q, r;                        /* the sides present */
    unsigned nones;
    long long ticks, delay, nresp;   /* delay: with both sides */
    const unsigned char *client, *server;
    Py_ssize_t client_len, server_len;
    long long cport, sport, id, mflags, qdcount;
    long tflags, sflags, dnsflags;
    long long qrcode, rrcode;        /* with the query / the response */
    int has_name;                    /* the first question's name, uncompressed wire form */
    const unsigned char *name_p;
    Py_ssize_t name_len;
    long long qtype, qclass;
    long long qan, qns, qar, ednsv, udp, hop, qsize, rsize;
    const unsigned char *rdata;      /* the query's OPT RDATA (NULL: no OPT) */
    uint64_t client_h, name_h;       /* hash_bytes of the client address and of the name (0: not known yet) */
    Py_ssize_t rdata_len;
    unsigned char name_buf[MAX_NAME + 1]; /* (last: not cleared) a compressed name made whole */
} Tx;

/* The first question's name of the message raw[0..n) into t (as add_python finds it); *name_end: the offset
 * after it when it is not compressed, else -1. 0 where the Python code would raise. */
static int first_name(Tx *t, const unsigned char *p, Py_ssize_t n, Py_ssize_t *name_end)
{
    Py_ssize_t end = 12;
    *name_end = -1;
    if (end >= n)
        return 0;
    unsigned ln = p[end];
    while (ln > 0 && ln < 64) {
        end += ln + 1;
        if (end >= n)
            return 0;
        ln = p[end];
    }
    if (ln == 0) {
        *name_end = end + 1;
        t->name_p = p + 12;
        t->name_len = *name_end - 12;
        return 1;
    }
    if (!wire_name(p, n, 12, t->name_buf, &t->name_len))
        return 0;
    t->name_p = t->name_buf;
    return 1;
}

/* cdns.query_trailing: 1 or 0, or -1 for "let Python decide" (where it would raise). name_end < 0: None;
 * opt_len: the length of the query's OPT RDATA, or -1 without OPT. */
static int query_trailing(const unsigned char *p, Py_ssize_t n, Py_ssize_t name_end, long long qd, long long an,
                          long long ns, long long ar, Py_ssize_t opt_len)
{
    if (name_end >= 0 && qd == 1 && !an && !ns) {
        Py_ssize_t end = name_end + 4;
        if (!ar)
            return end < n;
        if (ar == 1 && opt_len >= 0) {
            if (end >= n)
                return -1;
            if (p[end] == 0)
                return end + 11 + opt_len < n;
        }
    }
    Py_ssize_t end = message_end(p, n);
    return end < 0 ? -1 : end < n;
}

/* The query side's flags and values (add_python's `if q is not None` branch): 1, or 0 for Python. */
static int query_side(Tx *t, const unsigned char *raw, Py_ssize_t n, Py_ssize_t name_end, long long qf, long long qd,
                      long long an, long long ns, long long ar, int has_opt, int do_bit, long long ext)
{
    int trailing = query_trailing(raw, n, name_end, qd, an, ns, ar, has_opt ? t->rdata_len : -1);
    if (trailing < 0)
        return 0;
    if (trailing)
        t->tflags |= TRANSPORT_QUERY_TRAILINGDATA;
    if (has_opt) {
        if (ext < 0 || ext > 0xFF)
            return 0;
        t->sflags |= QR_QUERY_HAS_OPT;
        if (do_bit)
            t->dnsflags |= QUERY_DO;
        t->qrcode = (qf & 0xF) | (ext << 4);
    } else {
        t->qrcode = qf & 0xF;
        t->nones |= N_EDNSV | N_UDP;
    }
    t->sflags |= qd ? QR_HAS_QUERY : QR_HAS_QUERY | QR_QUERY_HAS_NO_QUESTION;
    t->dnsflags |= (qf >> 4) & 0x7F;
    t->qan = an, t->qns = ns, t->qar = ar;
    return 1;
}

/* The response side's flags (add_python's `if r is not None` branch, but the delay). */
static int response_side(Tx *t, long long rf, long long rqd, int has_opt, long long ext)
{
    if (has_opt) {
        if (ext < 0 || ext > 0xFF)
            return 0;
        t->sflags |= QR_RESPONSE_HAS_OPT;
        t->rrcode = (rf & 0xF) | (ext << 4);
    } else {
        t->rrcode = rf & 0xF;
    }
    t->sflags |= rqd ? QR_HAS_RESPONSE : QR_HAS_RESPONSE | QR_RESPONSE_HAS_NO_QUESTION;
    t->dnsflags |= ((rf >> 4) & 0x7F) << 8;
    return 1;
}

/* A transaction of message records as a Tx: 1, or 0 for the malformed and for a dnstap message without an
 * address or a port (Python adds them). The raw message is in the records (C-DNS decodes with keep_raw). */
static int tx_of_record(const TxHead *h, Tx *t)
{
    const Rec *q = tx_query(h), *r = tx_response(h), *m = q ? q : r;
    memset(t, 0, offsetof(Tx, name_buf));
    if (m == NULL || m->malformed || m->ts_ns < 0 || m->raw.len == SPAN_NONE || (q && q->raw.len == SPAN_NONE)
        || m->absent || m->sport < 0 || m->dport < 0)
        return 0;
    t->q = q != NULL, t->r = r != NULL;
    t->nresp = h->messages;
    t->ticks = m->ts_ns / NS_PER_TICK;
    int alen = addr_len(m);
    t->client = q ? q->src : r->dst, t->server = q ? q->dst : r->src;
    t->client_len = t->server_len = alen;
    t->cport = q ? q->sport : r->dport;
    t->sport = q ? q->dport : r->sport;
    t->id = m->id;
    t->mflags = m->flags;
    t->qdcount = m->qdcount;
    Py_ssize_t name_end = -1;
    t->has_name = m->qname.len != SPAN_NONE;
    if (t->has_name) {
        t->qtype = m->qtype, t->qclass = m->qclass;
        if (m->qtype < 0 || m->qclass < 0
            || !first_name(t, (const unsigned char *)rec_at(m, m->raw), m->raw.len, &name_end))
            return 0;
    }
    t->tflags = (m->ipv == 6 ? 1 : 0) | cdns_transport(m->transport) << 1;
    if (q != NULL) {
        t->hop = q->ttl;
        if (q->ttl < 0) /* dnstap: no TTL */
            t->nones |= N_HOP;
        t->qsize = q->dns_len;
        if (q->has_edns) {
            t->ednsv = q->e_version;
            t->udp = q->e_udp;
            t->rdata = (const unsigned char *)rec_at(q, q->e_rdata), t->rdata_len = q->e_rdata.len;
        }
        if (!query_side(t, (const unsigned char *)rec_at(q, q->raw), q->raw.len, name_end, q->flags, q->qdcount,
                        q->ancount, q->nscount, q->arcount, q->has_edns, q->e_do, q->e_ext_rcode))
            return 0;
    } else {
        t->nones |= N_HOP | N_QSIZE | N_QAN | N_QNS | N_QAR | N_EDNSV | N_UDP;
    }
    if (r != NULL) {
        t->rsize = r->dns_len;
        if (!response_side(t, r->flags, r->qdcount, r->has_edns, r->e_ext_rcode))
            return 0;
        if (q != NULL)
            t->delay = r->ts_ns / NS_PER_TICK - t->ticks;
    } else {
        t->nones |= N_RSIZE;
    }
    return 1;
}

/* The class/type index of the transaction's question, or -1 (an exception). */
static Py_ssize_t classtype_index(Block *b, const Tx *t)
{
    Cache *cache = b->cache;
    int direct = cache != NULL && t->qclass == 1 && t->qtype >= 0 && t->qtype < CT_DIRECT;
    if (direct && cache->class_in[t->qtype] > 0)
        return cache->class_in[t->qtype] - 1;
    unsigned char kbuf[PACKED_MAX];
    Py_ssize_t klen = 0;
    uint64_t kh = 0;
    Packed key = {.n = 0};
    pack_ll(&key, t->qtype);
    pack_ll(&key, t->qclass);
    Py_ssize_t cti = cache != NULL ? packed_find(&cache->classtype, &key, kbuf, &klen, &kh) : -1;
    if (cti < 0) {
        PyObject *ct = Py_BuildValue("(LL)", t->qtype, t->qclass);
        if (ct == NULL)
            return -1;
        cti = table_miss_index(cache != NULL ? &cache->classtype : NULL, b->classtype, ct);
        Py_DECREF(ct);
        if (cti < 0 || (cache != NULL && table_put(&cache->classtype, kh, kbuf, klen, cti) < 0))
            return -1;
    }
    if (direct)
        cache->class_in[t->qtype] = cti + 1;
    return cti;
}

/* A transaction's table indexes: client and server address, name, class/type, OPT RDATA (-1: none). */
typedef struct {
    Py_ssize_t ci, si, ni, cti, opt_i;
} Indexes;

/* The signature (si, sport, tflags, qr_type, sflags, opcode, dnsflags, qrcode, cti, qdcount, qan, qns, qar, ednsv,
 * udp, opt_i, rrcode; None where absent) packed into k: 1, or 0 when it cannot be (qr_type not an int). */
static int pack_signature(const Block *b, const Tx *t, const Indexes *x, Packed *k)
{
    pack_ll(k, x->si);
    pack_ll(k, t->sport);
    pack_ll(k, t->tflags);
    if (!pack_obj(k, b->qr_type))
        return 0;
    pack_ll(k, t->sflags);
    pack_ll(k, (t->mflags >> 11) & 0xF);
    pack_ll(k, t->dnsflags);
    if (t->q)
        pack_ll(k, t->qrcode);
    else
        pack_none(k);
    if (x->cti >= 0)
        pack_ll(k, x->cti);
    else
        pack_none(k);
    const long long vals[6] = {t->qdcount, t->qan, t->qns, t->qar, t->ednsv, t->udp};
    const unsigned bits[6] = {N_QDCOUNT, N_QAN, N_QNS, N_QAR, N_EDNSV, N_UDP};
    for (int j = 0; j < 6; j++) {
        if (t->nones & bits[j])
            pack_none(k);
        else
            pack_ll(k, vals[j]);
    }
    if (x->opt_i >= 0)
        pack_ll(k, x->opt_i);
    else
        pack_none(k);
    if (t->r)
        pack_ll(k, t->rrcode);
    else
        pack_none(k);
    return 1;
}

/* The signature's index (added when new) in the block's Keys of signatures; -1 (an exception). */
static Py_ssize_t signature_index(Block *b, const Tx *t, const Indexes *x)
{
    unsigned char buf[PACKED_MAX];
    Packed k = {.n = 0};
    if (!pack_signature(b, t, x, &k)) {
        PyErr_SetString(PyExc_TypeError, "add_records: qr_type must be an int or None");
        return -1;
    }
    return keys_index(b->sigs, buf, packed_bytes(&k, buf), 0);
}

/* The transaction's indexes into x (added to the tables when new), in the order of the Python loop: 0, or -1. */
static int table_indexes(Block *b, const Tx *t, Indexes *x)
{
    Cache *cache = b->cache;
    *x = (Indexes){-1, -1, -1, -1, -1};
    if ((x->ci = keys_index(b->ip, t->client, t->client_len, t->client_h)) < 0
        || (x->si = memo_index(cache ? &cache->server : NULL, b->ip, t->server, t->server_len)) < 0)
        return -1;
    if (t->has_name && ((x->ni = keys_index(b->names, t->name_p, t->name_len, t->name_h)) < 0
                        || (x->cti = classtype_index(b, t)) < 0))
        return -1;
    if (t->rdata != NULL && (x->opt_i = memo_index(cache ? &cache->opt : NULL, b->names, t->rdata, t->rdata_len)) < 0)
        return -1;
    return 0;
}

/* Add a transaction to the block's tables and items, in the order of the Python loop: 1, or -1 (exception). */
static int add_tx(Block *b, const Tx *t)
{
    /* The item's fields read from the messages, as Items holds them. */
    Item it = {.nones = 0};
    const long long from_messages[5] = {t->cport, t->id, t->hop, t->qsize, t->rsize};
    const unsigned none_bits[5] = {0, 0, N_HOP, N_QSIZE, N_RSIZE};
    static const int at[5] = {2, 3, 5, 8, 9};
    for (int k = 0; k < 5; k++) {
        it.v[at[k]] = t->nones & none_bits[k] ? 0 : from_messages[k];
        if (t->nones & none_bits[k])
            it.nones |= 1u << at[k];
    }
    Indexes x;
    Py_ssize_t sgi;
    if (table_indexes(b, t, &x) < 0 || (sgi = signature_index(b, t, &x)) < 0)
        return -1;
    it.v[0] = t->ticks;
    it.v[1] = x.ci;
    it.v[4] = sgi;
    it.v[6] = t->delay;
    it.v[7] = x.ni >= 0 ? x.ni : 0;
    it.nones |= (t->q && t->r ? 0 : 1u << 6) | (x.ni >= 0 ? 0 : 1u << 7);
    if (items_push(b->store, &it) < 0)
        return -1;
    if (!b->has_earliest || t->ticks < b->earliest) {
        b->earliest = t->ticks;
        b->has_earliest = 1;
    }
    if (t->q)
        b->processed += 1;
    if (t->r) {
        b->processed += t->nresp;
        if (!t->q)
            b->unmatched_r += 1;
    } else {
        b->unmatched_q += 1;
    }
    return 1;
}

/* add_records' arguments, into b. */
static int block_args(PyObject *args, Block *b, PyObject **txs, Py_ssize_t *start, Py_ssize_t *stop,
                      PyObject **earliest)
{
    b->cache = NULL;
    if (!PyArg_ParseTuple(args, "OnnO!O!O!O!O!OO|O!:add_records", txs, start, stop, &KeysType, &b->ip,
                          &KeysType, &b->names, &PyDict_Type, &b->classtype, &KeysType, &b->sigs, &ItemsType,
                          &b->store, earliest, &b->qr_type, &CacheType, &b->cache))
        return -1;
    if (*start < 0) {
        PyErr_SetString(PyExc_ValueError, "add_records: start must not be negative");
        return -1;
    }
    if (b->ip->arity || b->names->arity || b->sigs->arity != SIG_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "add_records: ip and names are Keys of bytes, sigs a Keys(arity=17)");
        return -1;
    }
    b->processed = b->unmatched_q = b->unmatched_r = 0;
    b->earliest = 0;
    b->has_earliest = *earliest != Py_None;
    return 0;
}

/* add_records' result: (stop, earliest, processed, unmatched_queries, unmatched_responses). taken: the earliest-time
 * given was read (else it is given back as it was). */
static PyObject *block_result(Block *b, Py_ssize_t stop, PyObject *earliest, int taken)
{
    if (!taken)
        Py_INCREF(earliest);
    else if (b->has_earliest)
        earliest = PyLong_FromLongLong(b->earliest);
    else
        earliest = Py_NewRef(Py_None);
    if (earliest == NULL)
        return NULL;
    return Py_BuildValue("nNLLL", stop, earliest, b->processed, b->unmatched_q, b->unmatched_r);
}

/* Why: the batch's records were written by the matcher a while before and are read here once, out of the
 * cache; their first bytes read (the header, the records' raw span) stalled the loop on memory. The first
 * 12 lines of the transaction PREFETCH_AHEAD on are asked for ahead (a transaction is a few hundred
 * bytes, in one piece; a prefetch past the buffer's end is harmless). Inlined always: gcc finds a
 * function of prefetches alone free of effects and deletes the call. */
#define PREFETCH_AHEAD 2

static inline __attribute__((always_inline)) void prefetch_tx(const TxBatch *txs, Py_ssize_t i, Py_ssize_t stop)
{
    if (i >= stop)
        return;
    const char *p = txs->txs.buf + txs->txs.at[i];
#define LINES(k) __builtin_prefetch(p + 64 * (k)); __builtin_prefetch(p + 64 * (k) + 64); \
    __builtin_prefetch(p + 64 * (k) + 128); __builtin_prefetch(p + 64 * (k) + 192);
    LINES(0)
    LINES(4)
    LINES(8)
#undef LINES
}

/* tx_of_record of transaction i, its client address and name hashed and the cache's slots for them asked for:
 * they are looked up at the next add_tx, their slots out of the cache by then (the tables are far bigger than it).
 * 1, or 0 (the transaction is left to Python). */
static int read_tx(const Block *b, const TxBatch *txs, Py_ssize_t i, Tx *t)
{
    if (!tx_of_record(txbatch_get(txs, i), t))
        return 0;
    const Table *ip = &b->ip->t, *names = &b->names->t;
    t->client_h = hash_bytes(t->client, t->client_len);
    if (ip->slots != NULL)
        __builtin_prefetch(&ip->slots[t->client_h & ip->mask]);
    if (t->has_name) {
        t->name_h = hash_bytes(t->name_p, t->name_len);
        if (names->slots != NULL)
            __builtin_prefetch(&names->slots[t->name_h & names->mask]);
    }
    return 1;
}

/* add_records: add over transactions start..stop-1 of a TxBatch of message records (probe._records): the
 * columnar pipeline's C-DNS. */
static PyObject *add_records(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *txs_obj, *earliest;
    Py_ssize_t start, stop;
    Block b;
    if (block_args(args, &b, &txs_obj, &start, &stop, &earliest) < 0)
        return NULL;
    if (records == NULL || !PyObject_TypeCheck(txs_obj, records->txbatch_type)) {
        PyErr_SetString(PyExc_TypeError, "add_records: txs must be a probe._records.TxBatch (is it built?)");
        return NULL;
    }
    TxBatch *txs = (TxBatch *)txs_obj;
    int taken = !b.has_earliest || as_ll(earliest, &b.earliest);
    Py_ssize_t i = start;
    Tx two[2], *t = &two[0], *next = &two[1];
    stop = Py_MIN(stop, txs->txs.n);
    int ok = taken && i < stop && read_tx(&b, txs, i, t);
    for (; ok; i++) {
        prefetch_tx(txs, i + PREFETCH_AHEAD, stop);
        int next_ok = i + 1 < stop && read_tx(&b, txs, i + 1, next);
        if (add_tx(&b, t) < 0)
            return NULL;
        Tx *done = t;
        t = next, next = done;
        ok = next_ok;
    }
    return block_result(&b, i, earliest, taken);
}

/* CBOR (RFC 8949) heads and ints, shortest form, as cbor2 writes them. */
typedef struct {
    unsigned char *p;
    Py_ssize_t len;
    size_t cap;
} Out;

/* Room for `more` bytes after o->len: 0, or -1 (no memory). */
static int out_reserve(Out *o, Py_ssize_t more)
{
    if ((size_t)(o->len + more) <= o->cap)
        return 0;
    unsigned char *p = ext_grow(o->p, &o->cap, (size_t)(o->len + more), 1, 64);
    if (p == NULL)
        return -1;
    o->p = p;
    return 0;
}

/* A head at w, which has room for 9 bytes; the end of what was written. The argument is stored whole, big-endian
 * (a byte at a time, it was a fifth of encoding an item). */
static inline unsigned char *put_head(unsigned char *w, int major, uint64_t v)
{
    unsigned char m = (unsigned char)(major << 5);
    if (v < 24) {
        *w = m | (unsigned char)v;
        return w + 1;
    }
    if (v < 0x100) {
        w[0] = m | 24;
        w[1] = (unsigned char)v;
        return w + 2;
    }
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (v < 0x10000) {
        uint16_t be = __builtin_bswap16((uint16_t)v);
        w[0] = m | 25;
        memcpy(w + 1, &be, 2);
        return w + 3;
    }
    if (v < 0x100000000ULL) {
        uint32_t be = __builtin_bswap32((uint32_t)v);
        w[0] = m | 26;
        memcpy(w + 1, &be, 4);
        return w + 5;
    }
    uint64_t be = __builtin_bswap64(v);
    w[0] = m | 27;
    memcpy(w + 1, &be, 8);
    return w + 9;
#else
    int n = v < 0x10000 ? 2 : v < 0x100000000ULL ? 4 : 8;
    *w++ = m | (n == 2 ? 25 : n == 4 ? 26 : 27);
    for (int i = n - 1; i >= 0; i--)
        *w++ = (unsigned char)(v >> (8 * i));
    return w;
#endif
}

/* An int (major type 0 or 1) at w, which has room for 9 bytes. */
static inline unsigned char *put_int(unsigned char *w, long long v)
{
    return v >= 0 ? put_head(w, 0, (uint64_t)v) : put_head(w, 1, (uint64_t)(-1 - v));
}

static int out_head(Out *o, int major, unsigned long long v)
{
    if (out_reserve(o, 9) < 0)
        return -1;
    o->len = put_head(o->p + o->len, major, v) - o->p;
    return 0;
}

/* A renumbering list (new index of each old one) as C ints, read once per block rather than once per item. */
typedef struct {
    long long *v;
    Py_ssize_t n;
} Renum;

/* 1, 0 when an element is not an int that fits (then Python encodes), -1 (no memory). */
static int renum_of(PyObject *list, Renum *r)
{
    r->n = PyList_GET_SIZE(list);
    r->v = PyMem_Malloc((r->n ? r->n : 1) * sizeof *r->v);
    if (r->v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < r->n; i++) {
        if (!as_ll(PyList_GET_ITEM(list, i), &r->v[i]))
            return 0;
    }
    return 1;
}

/* r[i] as Python indexes the list (negative from the end): 1, or 0 where it would raise. */
static inline int renum_at(const Renum *r, long long i, long long *v)
{
    if (i < 0)
        i += r->n;
    if (i < 0 || i >= r->n)
        return 0;
    *v = r->v[i];
    return 1;
}

#define LIMIT (1LL << 62)
#define ITEM_ROOM (1 + ITEM_INTS * 10) /* an item map's most bytes: its head, then key and value of each field */

/* One item map: 1, 0 (Python encodes the block's items), -1 error. */
static int encode_item(Out *o, const Item *it, long long early, const Renum *new_ip, const Renum *new_sig,
                       const Renum *new_name)
{
    long long ci, sgi, ni = 0;
    if ((it->nones & 0x1F) || it->v[0] < -LIMIT || it->v[0] > LIMIT || !renum_at(new_ip, it->v[1], &ci)
        || !renum_at(new_sig, it->v[4], &sgi) || (!(it->nones >> 7 & 1) && !renum_at(new_name, it->v[7], &ni)))
        return 0;
    if (out_reserve(o, ITEM_ROOM) < 0)
        return -1;
    int keys = 5;
    for (int i = 5; i < ITEM_INTS; i++)
        keys += !(it->nones >> i & 1);
    unsigned char *w = put_head(o->p + o->len, 5, keys);
    const long long first[5] = {it->v[0] - early, ci, it->v[2], it->v[3], sgi};
    for (int i = 0; i < 5; i++) {
        *w++ = (unsigned char)i;
        w = put_int(w, first[i]);
    }
    for (int i = 5; i < ITEM_INTS; i++) {
        if (!(it->nones >> i & 1)) {
            *w++ = (unsigned char)i;
            w = put_int(w, i == 7 ? ni : it->v[i]);
        }
    }
    o->len = w - o->p;
    return 1;
}

static int encode_item_list(Out *o, PyObject *list, Items *store, long long early, const Renum *r)
{
    Py_ssize_t n = store != NULL ? store->n : PyList_GET_SIZE(list);
    int rc = out_head(o, 4, (unsigned long long)n) < 0 ? -1 : 1;
    for (Py_ssize_t i = 0; rc == 1 && i < n; i++) {
        Item it;
        if (store != NULL)
            rc = encode_item(o, &store->a[i], early, &r[0], &r[1], &r[2]);
        else
            rc = item_of_tuple(PyList_GET_ITEM(list, i), &it) ? encode_item(o, &it, early, &r[0], &r[1], &r[2]) : 0;
    }
    return rc;
}

static PyObject *encode_items(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *list, *earliest, *lists[3];
    long long early;
    if (!PyArg_ParseTuple(args, "OOO!O!O!:encode_items", &list, &earliest, &PyList_Type, &lists[0], &PyList_Type,
                          &lists[1], &PyList_Type, &lists[2]))
        return NULL;
    if (!PyList_Check(list) && !Py_IS_TYPE(list, &ItemsType)) {
        PyErr_SetString(PyExc_TypeError, "encode_items: items must be a list or an Items");
        return NULL;
    }
    if (!as_ll(earliest, &early) || early < -LIMIT || early > LIMIT)
        Py_RETURN_NONE;
    Items *store = Py_IS_TYPE(list, &ItemsType) ? (Items *)list : NULL;
    Renum r[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
    Out o = {NULL, 0, 0};
    int rc = 1;
    for (int k = 0; rc == 1 && k < 3; k++)
        rc = renum_of(lists[k], &r[k]);
    if (rc == 1 && out_reserve(&o, (store != NULL ? store->n : PyList_GET_SIZE(list)) * 32 + 16) < 0)
        rc = -1;
    if (rc == 1)
        rc = encode_item_list(&o, list, store, early, r);
    PyObject *out = rc == 1 ? PyBytes_FromStringAndSize((const char *)o.p, o.len) : rc == 0 ? Py_NewRef(Py_None) : NULL;
    for (int k = 0; k < 3; k++)
        PyMem_Free(r[k].v);
    PyMem_Free(o.p);
    return out;
}

/* Signature i of a table (a Keys(arity=17), or the list of a dict's keys, its tuples), packed: 1, or 0 when it is
 * not one (not a tuple of 17 ints or None, i not an index of the table). */
static int signature_at(PyObject *table, long long i, Packed *k)
{
    if (Py_IS_TYPE(table, &KeysType)) {
        const Keys *keys = (const Keys *)table;
        Py_ssize_t len;
        if (i < 0 || (unsigned long long)i >= keys->n)
            return 0;
        const unsigned char *p = keys_at(keys, (size_t)i, &len);
        return packed_of_bytes(p, len, SIG_FIELDS, k);
    }
    return i >= 0 && i < PyList_GET_SIZE(table) && packed_of_tuple(PyList_GET_ITEM(table, i), SIG_FIELDS, k);
}

/* One signature map, its server address (0) and OPT RDATA (15) renumbered: 1, 0 (Python encodes), -1. */
static int encode_signature(Out *o, const Packed *k, const Renum *new_ip, const Renum *new_name)
{
    int keys = 0;
    for (int f = 0; f < SIG_FIELDS; f++)
        keys += !(k->nones >> f & 1);
    if (k->nones & 1)
        return 0;
    if (out_reserve(o, 1 + SIG_FIELDS * 10) < 0)
        return -1;
    unsigned char *w = put_head(o->p + o->len, 5, keys);
    for (int f = 0; f < SIG_FIELDS; f++) {
        long long v = k->v[f];
        if (k->nones >> f & 1)
            continue;
        if ((f == 0 && !renum_at(new_ip, v, &v)) || (f == 15 && !renum_at(new_name, v, &v)))
            return 0;
        *w++ = (unsigned char)f;
        w = put_int(w, v);
    }
    o->len = w - o->p;
    return 1;
}

/* encode_signatures(sigs, order, new_ip, new_name): cbor2.dumps([cdns._signature(s, new_ip, new_name) for s in
 * [list(sigs)[i] for i in order]]) for sigs a Keys(arity=17) or the list of a dict's keys, or None (a value not
 * an int, an index not one of the table's). */
static PyObject *encode_signatures(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *table, *order, *lists[2];
    if (!PyArg_ParseTuple(args, "OO!O!O!:encode_signatures", &table, &PyList_Type, &order, &PyList_Type, &lists[0],
                          &PyList_Type, &lists[1]))
        return NULL;
    if (!PyList_Check(table) && !(Py_IS_TYPE(table, &KeysType) && ((Keys *)table)->arity == SIG_FIELDS)) {
        PyErr_SetString(PyExc_TypeError, "encode_signatures: sigs must be a Keys(arity=17) or a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(order);
    Renum r[2] = {{NULL, 0}, {NULL, 0}};
    Out o = {NULL, 0, 0};
    int rc = 1;
    for (int k = 0; rc == 1 && k < 2; k++)
        rc = renum_of(lists[k], &r[k]);
    if (rc == 1 && (out_reserve(&o, n * 24 + 9) < 0 || out_head(&o, 4, (unsigned long long)n) < 0))
        rc = -1;
    for (Py_ssize_t j = 0; rc == 1 && j < n; j++) {
        long long i;
        Packed k;
        rc = as_ll(PyList_GET_ITEM(order, j), &i) && signature_at(table, i, &k) ? encode_signature(&o, &k, &r[0], &r[1])
                                                                                : 0;
    }
    PyObject *out = rc == 1 ? PyBytes_FromStringAndSize((const char *)o.p, o.len) : rc == 0 ? Py_NewRef(Py_None) : NULL;
    for (int k = 0; k < 2; k++)
        PyMem_Free(r[k].v);
    PyMem_Free(o.p);
    return out;
}

/* The CBOR array of the keys of k in `order`: 1, 0 when an index is not one of the table's (then Python makes the
 * list), -1 (no memory). Written from the table's buffer: no key object is made. */
static int keys_cbor(Out *o, const Keys *k, PyObject *order)
{
    Py_ssize_t m = PyList_GET_SIZE(order);
    if (out_reserve(o, (Py_ssize_t)(k->t.keys_len + 5 * (size_t)m) + 9) < 0 || out_head(o, 4, m) < 0)
        return -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        long long i;
        Py_ssize_t len;
        if (!as_ll(PyList_GET_ITEM(order, j), &i) || i < 0 || (unsigned long long)i >= k->n)
            return 0;
        const unsigned char *p = keys_at(k, (size_t)i, &len);
        if (out_reserve(o, len + 9) < 0)
            return -1;
        if (i == k->none_index) { /* CBOR null, as cbor2 wrote the None of a dict table */
            o->p[o->len++] = 0xf6;
            continue;
        }
        unsigned char *w = put_head(o->p + o->len, 2, (uint64_t)len);
        memcpy(w, p, len);
        o->len = w + len - o->p;
    }
    return 1;
}

/* The same for a dict of bytes keys -> their indexes 0..len-1 (the reference blocks' tables): 1, 0 when a key is
 * not bytes or an index is not one of the table's, -1 (no memory). */
static int dict_cbor(Out *o, PyObject *table, PyObject *order)
{
    Py_ssize_t n = PyDict_GET_SIZE(table), pos = 0, bytes = 0;
    PyObject **keys = PyMem_Calloc(n ? n : 1, sizeof *keys), *key, *value;
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 1;
    while (rc == 1 && PyDict_Next(table, &pos, &key, &value)) {
        long long i;
        rc = PyBytes_CheckExact(key) && as_ll(value, &i) && i >= 0 && i < n && keys[i] == NULL;
        if (rc) {
            keys[i] = key;
            bytes += PyBytes_GET_SIZE(key) + 9;
        }
    }
    if (rc == 1)
        rc = out_reserve(o, bytes + 9) < 0 ? -1 : out_head(o, 4, PyList_GET_SIZE(order)) < 0 ? -1 : 1;
    for (Py_ssize_t j = 0; rc == 1 && j < PyList_GET_SIZE(order); j++) {
        long long i;
        if (!as_ll(PyList_GET_ITEM(order, j), &i) || i < 0 || i >= n) {
            rc = 0;
            break;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(keys[i]);
        if (out_reserve(o, len + 9) < 0) {
            rc = -1;
            break;
        }
        unsigned char *w = put_head(o->p + o->len, 2, (uint64_t)len);
        memcpy(w, PyBytes_AS_STRING(keys[i]), len);
        o->len = w + len - o->p;
    }
    PyMem_Free(keys);
    return rc;
}

/* cbor2.dumps([list(table)[i] for i in order]) for a table of bytes (a Keys, or a dict: key -> its index, in
 * insertion order), or None when a key is not bytes or an index is not one of the table's. */
static PyObject *encode_table(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *table, *order;
    if (!PyArg_ParseTuple(args, "OO!:encode_table", &table, &PyList_Type, &order))
        return NULL;
    if (!Py_IS_TYPE(table, &KeysType) && !PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "encode_table: table must be a Keys or a dict");
        return NULL;
    }
    Out o = {NULL, 0, 0};
    int rc = Py_IS_TYPE(table, &KeysType) ? keys_cbor(&o, (Keys *)table, order) : dict_cbor(&o, table, order);
    PyObject *out = rc == 1 ? PyBytes_FromStringAndSize((const char *)o.p, o.len) : rc == 0 ? Py_NewRef(Py_None) : NULL;
    PyMem_Free(o.p);
    return out;
}

/* Counts of the uses of each index 0..n-1 of a table, and the index it takes once the table is ordered most used
 * first, so that the indexes used most take the fewest bytes (encode._renumbering is the reference). */
typedef struct {
    long long *v;
    Py_ssize_t n;
} Uses;

/* uses.v[index] += by: 0, or -1 (IndexError, TypeError: the index is not one of the table's). */
static int use(Uses *u, long long index, long long by)
{
    if (index < 0 || index >= u->n) {
        PyErr_Format(PyExc_IndexError, "renumbering: index %lld out of range", index);
        return -1;
    }
    u->v[index] += by;
    return 0;
}

static int use_obj(Uses *u, PyObject *index, long long by)
{
    long long i;
    if (!as_ll(index, &i)) {
        PyErr_SetString(PyExc_TypeError, "renumbering: an index is not an int");
        return -1;
    }
    return use(u, i, by);
}

/* The uses of the item fields 1 (client address), 4 (signature) and 7 (name): into u[0], u[1], u[2]. */
static int count_items(PyObject *items, Uses *ip, Uses *sig, Uses *name)
{
    static const int fields[3] = {1, 4, 7};
    Uses *into[3] = {ip, sig, name};
    Items *store = Py_IS_TYPE(items, &ItemsType) ? (Items *)items : NULL;
    if (store == NULL && !PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "renumbering: items must be a list or an Items");
        return -1;
    }
    Py_ssize_t n = store != NULL ? store->n : PyList_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Item *it = store != NULL ? &store->a[i] : NULL;
        PyObject *t = store == NULL ? PyList_GET_ITEM(items, i) : NULL;
        if (t != NULL && (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 8)) {
            PyErr_SetString(PyExc_TypeError, "renumbering: an item is not an item tuple");
            return -1;
        }
        for (int k = 0; k < 3; k++) {
            int f = fields[k];
            if (it != NULL ? !(it->nones >> f & 1) && use(into[k], it->v[f], 1) < 0
                           : F(t, f) != Py_None && use_obj(into[k], F(t, f), 1) < 0)
                return -1;
        }
    }
    return 0;
}

/* A signature's uses added to its server address (field 0) and OPT RDATA (field 15); a resource record's two name
 * indexes (fields 0 and 3) used once each. */
static int count_references(PyObject *sigs, PyObject *rr, Uses *ip, const Uses *sig, Uses *name)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    for (Py_ssize_t i = 0; Py_IS_TYPE(sigs, &KeysType) && i < sig->n; i++) {
        Packed k;
        if (!signature_at(sigs, i, &k)) {
            PyErr_SetString(PyExc_SystemError, "renumbering: a packed signature does not unpack");
            return -1;
        }
        if ((!(k.nones & 1) && use(ip, k.v[0], sig->v[i]) < 0)
            || (!(k.nones >> 15 & 1) && use(name, k.v[15], sig->v[i]) < 0))
            return -1;
    }
    while (PyDict_Check(sigs) && PyDict_Next(sigs, &pos, &key, &value)) {
        long long i;
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 17 || !as_ll(value, &i) || i < 0 || i >= sig->n) {
            PyErr_SetString(PyExc_TypeError, "renumbering: sigs must map 17-tuples to their indexes");
            return -1;
        }
        if (use_obj(ip, F(key, 0), sig->v[i]) < 0 || (F(key, 15) != Py_None && use_obj(name, F(key, 15), sig->v[i]) < 0))
            return -1;
    }
    pos = 0;
    while (PyDict_Next(rr, &pos, &key, &value)) {
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 4) {
            PyErr_SetString(PyExc_TypeError, "renumbering: rr must map 4-tuples to their indexes");
            return -1;
        }
        if (use_obj(name, F(key, 0), 1) < 0 || use_obj(name, F(key, 3), 1) < 0)
            return -1;
    }
    return 0;
}

/* (old indexes most used first, ties in index order; the new index of each old one). */
typedef struct {
    long long uses;
    Py_ssize_t index;
} Use;

static int by_more_use(const void *a, const void *b)
{
    const Use *x = a, *y = b;
    if (x->uses != y->uses)
        return x->uses > y->uses ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* u (in index order) sorted as by_more_use orders it. Use counts are small (at most the block's items, or twice
 * that), so a counting sort does it in two passes where one is at most a few times the table; qsort otherwise.
 * 0, or -1 (no memory). */
static int sort_by_more_use(Use *u, Py_ssize_t n)
{
    long long least = 0, most = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        least = Py_MIN(least, u[i].uses);
        most = Py_MAX(most, u[i].uses);
    }
    if (least < 0 || most > 4 * (long long)n + 256) {
        qsort(u, n, sizeof *u, by_more_use);
        return 0;
    }
    Py_ssize_t *at = PyMem_Calloc(most + 1, sizeof *at);
    Use *copy = PyMem_Malloc((n ? n : 1) * sizeof *copy);
    if (at == NULL || copy == NULL) {
        PyMem_Free(at);
        PyMem_Free(copy);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, u, n * sizeof *u);
    for (Py_ssize_t i = 0; i < n; i++)
        at[copy[i].uses]++;
    Py_ssize_t pos = 0;
    for (long long k = most; k >= 0; k--) { /* most used first: the first slot of each count */
        Py_ssize_t c = at[k];
        at[k] = pos;
        pos += c;
    }
    for (Py_ssize_t i = 0; i < n; i++) /* in index order: ties keep it */
        u[at[copy[i].uses]++] = copy[i];
    PyMem_Free(at);
    PyMem_Free(copy);
    return 0;
}


static PyObject *by_use(const Uses *uses)
{
    Py_ssize_t n = uses->n;
    Use *u = PyMem_Malloc((n ? n : 1) * sizeof *u);
    if (u == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        u[i] = (Use){uses->v[i], i};
    PyObject *order = NULL, *renumbered_list = NULL, *result = NULL;
    if (sort_by_more_use(u, n) < 0)
        goto done;
    order = PyList_New(n);
    renumbered_list = PyList_New(n);
    if (order == NULL || renumbered_list == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *old = index_int(u[j].index), *new = index_int(j);
        if (old == NULL || new == NULL) {
            Py_XDECREF(old);
            Py_XDECREF(new);
            goto done;
        }
        PyList_SET_ITEM(order, j, old);
        PyList_SET_ITEM(renumbered_list, u[j].index, new);
    }
    result = PyTuple_Pack(2, order, renumbered_list);
done:
    Py_XDECREF(order);
    Py_XDECREF(renumbered_list);
    PyMem_Free(u);
    return result;
}

/* renumbering(items, sigs, n_ip, n_names, rr): encode._renumbering in one pass in C (it counted into lists of ints
 * and sorted them in Python, a call per table and a loop over the signatures). */
static PyObject *renumbering(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *items, *sigs, *rr;
    Py_ssize_t n_ip, n_names;
    if (!PyArg_ParseTuple(args, "OOnnO!:renumbering", &items, &sigs, &n_ip, &n_names, &PyDict_Type, &rr))
        return NULL;
    if (n_ip < 0 || n_names < 0) {
        PyErr_SetString(PyExc_ValueError, "renumbering: table sizes must not be negative");
        return NULL;
    }
    if (!PyDict_Check(sigs) && !(Py_IS_TYPE(sigs, &KeysType) && ((Keys *)sigs)->arity == SIG_FIELDS)) {
        PyErr_SetString(PyExc_TypeError, "renumbering: sigs must be a dict or a Keys(arity=17)");
        return NULL;
    }
    Py_ssize_t n_sigs = PyDict_Check(sigs) ? PyDict_GET_SIZE(sigs) : (Py_ssize_t)((Keys *)sigs)->n;
    Uses sig = {PyMem_Calloc(n_sigs + 1, sizeof(long long)), n_sigs};
    Uses ip = {PyMem_Calloc(n_ip + 1, sizeof(long long)), n_ip};
    Uses name = {PyMem_Calloc(n_names + 1, sizeof(long long)), n_names};
    PyObject *result = NULL;
    if (sig.v == NULL || ip.v == NULL || name.v == NULL)
        PyErr_NoMemory();
    else if (count_items(items, &ip, &sig, &name) == 0 && count_references(sigs, rr, &ip, &sig, &name) == 0)
        result = Py_BuildValue("NNN", by_use(&sig), by_use(&ip), by_use(&name));
    PyMem_Free(sig.v);
    PyMem_Free(ip.v);
    PyMem_Free(name.v);
    return result;
}

static PyMethodDef methods[] = {
    {"renumbering", renumbering, METH_VARARGS,
     "renumbering(items, sigs, n_ip, n_names, rr) -> ((order, new) of the signatures, of the addresses, of the "
     "names): encode._renumbering, old indexes most used first (ties in index order), new index of each old one."},
    {"add_records", add_records, METH_VARARGS,
     "add_records(txs, start, stop, ip, names, classtype, sigs, items, earliest, qr_type[, cache]) -> (stop, "
     "earliest, processed, unmatched_queries, unmatched_responses): Block.add_python's loop over transactions "
     "start..stop-1 of a probe._records.TxBatch, up to the first one it leaves to Python (a malformed one); ip, "
     "names: Keys; sigs: a Keys(arity=17); items: an Items; cache: the block's Cache (classtype, memos)."},
    {"encode_items", encode_items, METH_VARARGS,
     "encode_items(items, earliest, new_ip, new_sig, new_name) -> bytes or None: cbor2.dumps of the item maps, "
     "or None where an item has a value other than an int or None (extended sections)."},
    {"encode_table", encode_table, METH_VARARGS,
     "encode_table(table, order) -> bytes or None: cbor2.dumps([list(table)[i] for i in order]) for a table of bytes "
     "keys (their values 0..len-1 in insertion order), or None for other keys or indexes."},
    {"encode_signatures", encode_signatures, METH_VARARGS,
     "encode_signatures(sigs, order, new_ip, new_name) -> bytes or None: cbor2.dumps of cdns._signature over the "
     "signatures of sigs (a Keys(arity=17), or a list of tuples) in order, or None (a value not an int)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__cdnsblock(void)
{
    /* Message records (add_records) where probe._records is built; the encoder works without it (the reference
     * pipeline's blocks). */
    if (records_import() < 0)
        PyErr_Clear();
    PyObject *mod = ext_module("export.cdns._cdnsblock", NULL, methods,
                               (PyTypeObject *[]){&CacheType, &KeysType, &ItemsType, NULL}, NULL, NULL);
    if (mod == NULL)
        return NULL;
    PyObject *transports = PyTuple_New(N_TRANSPORTS);
    for (Py_ssize_t k = 0; transports != NULL && k < N_TRANSPORTS; k++)
        ext_set_item(&transports, k, PyLong_FromLong(CDNS_TRANSPORT[k]));
    PyObject *constants = transports == NULL ? NULL : Py_BuildValue(
        "{sisNsisisisisisisisi}", "NS_PER_TICK", NS_PER_TICK, "CDNS_TRANSPORT", transports, "TRANSPORT_QUERY_TRAILINGDATA",
        TRANSPORT_QUERY_TRAILINGDATA, "QR_HAS_QUERY", QR_HAS_QUERY, "QR_HAS_RESPONSE", QR_HAS_RESPONSE,
        "QR_QUERY_HAS_OPT", QR_QUERY_HAS_OPT, "QR_RESPONSE_HAS_OPT", QR_RESPONSE_HAS_OPT, "QR_QUERY_HAS_NO_QUESTION",
        QR_QUERY_HAS_NO_QUESTION, "QR_RESPONSE_HAS_NO_QUESTION", QR_RESPONSE_HAS_NO_QUESTION, "QUERY_DO", QUERY_DO);
    if (PyModule_AddObject(mod, "CONSTANTS", constants) < 0) {
        Py_XDECREF(constants);
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
