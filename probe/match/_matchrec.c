/* probe.match._matchrec: the matching stage (probe/match/table.py TransactionTable) on message records.
 *
 * Why: matching message tuples hashes a key tuple and goes through a Python dict per message; here the pending
 * queries are copies of their records in a hash table of its own, and completed
 * transactions are written into a TxBatch. Everything TransactionTable does is done here, with its exact
 * rules and order: the question check, the timeout rule, retries under one key, duplicates, response-only and
 * malformed messages, expiry and the max_pending bound (walking keys in the dict's insertion order, retries
 * re-inserted at the young end), zone transfers (summed counts capped to int32, at most max_transfers open, kept
 * in the order of their last message so that expiry and eviction take the oldest), and the flush order.
 * TransactionTable stays the reference; tests/match/test_matchrec.py compares the two on every capture.
 *
 * Matcher(timeout_ns, max_pending, max_pending_per_key, max_transfers, seed)
 *   m.add(msgs, out, now_ns=None) -> counts
 *                                match the MsgBatch msgs (capture order), append completed transactions to the
 *                                TxBatch out, then expire on the capture clock now_ns (the pipeline's: the time
 *                                of its last frame, also one that held no message); None: the time of the batch's
 *                                last message
 *   m.flush(out) -> counts       end of input: open transfers, then every pending query (query-only)
 *   len(m)                       pending keys; m.held(): pending queries (max_pending bounds them);
 *                                m.transfers(): open zone transfers (max_transfers bounds them)
 *   counts: (matched, response_only, duplicate_queries, query_only, match_evicted, zone_transfer_messages,
 *            lengths_capped, dnstap_embedded_used, transfers_evicted) of that call.
 *
 * dnstap messages (Rec.family set): their scope is compared as TransactionTable compares the tuple (transport,
 * family, identity or else producer): the transport and family codes in the key, the text (Rec.scope_name)
 * byte for byte when two keys are otherwise equal (its hash in the key); their addresses and ports may be None.
 * A query copy (Rec.query_copy) is taken as TransactionTable._query_copy takes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>

#include "records.h"

enum { FLAG_QR = 0x8000, QTYPE_IXFR = 251, QTYPE_AXFR = 252, TYPE_SOA = 6 };
#define INT32_CAP 0x7FFFFFFFLL

/* (scope, client, client port, server, server port, id): a query's key is its (src, sport, dst, dport), a
 * response's the same with the ends swapped. The scope: a packet's proto; a dnstap message's transport, family
 * and the hash of its scope name (the name itself is compared in omap_find). ipv: the addresses' length (0
 * without either, whose key then holds none: as the tuple's None, whatever the message's ipv). absent: the
 * K_ bits of the None among addresses and ports. Each part is a whole word, built in a register and stored once:
 * hash_key and omap_find read back words that one store wrote (a word over several smaller stores, as bytes and
 * shorts of a struct, waits for them to reach the cache: most of the hash's time). */
typedef struct {
    uint64_t client[2], server[2]; /* the address's bytes, zero past its length and when absent */
    uint64_t scope_hash;
    uint64_t ports_id; /* cport | sport << 16 | id << 32 */
    uint64_t scope;    /* proto | ipv << 8 | family << 16 | transport << 24 | absent << 32 */
} Key;

static inline int key_family(const Key *k)
{
    return (int)(k->scope >> 16) & 0xFF;
}

static inline int same_key(const Key *a, const Key *b)
{
    return ((a->client[0] ^ b->client[0]) | (a->client[1] ^ b->client[1]) | (a->server[0] ^ b->server[0])
            | (a->server[1] ^ b->server[1]) | (a->scope_hash ^ b->scope_hash) | (a->ports_id ^ b->ports_id)
            | (a->scope ^ b->scope))
           == 0;
}

enum { K_CLIENT = 1, K_SERVER = 2, K_CPORT = 4, K_SPORT = 8 };

/* A copy of a record, in a chain. */
typedef struct Held {
    struct Held *next;
    Rec rec; /* followed by its tail */
} Held;

/* Freed copies of up to HELD_CLASSES * HELD_CLASS bytes kept for the next ones, a stack by size class (of
 * HELD_CLASS bytes). Why: a query is copied and freed for nearly every transaction; a copy on a stack is ready at
 * once and was freed recently (in the cache), where pymalloc's call pair cost as much as the copy. */
enum { HELD_CLASS = 64, HELD_CLASSES = 8, MAX_SPARE_HELD = 256 };

typedef struct {
    Held *held[HELD_CLASSES];
    int n_held[HELD_CLASSES];
} Spares;

/* The size class of a copy of `bytes` (HELD_CLASSES: none, its own allocation). */
static inline size_t held_class(size_t bytes)
{
    return bytes <= HELD_CLASSES * HELD_CLASS ? (bytes - 1) / HELD_CLASS : HELD_CLASSES;
}

static Held *hold(Spares *s, const Rec *r)
{
    size_t bytes = offsetof(Held, rec) + r->size, c = held_class(bytes);
    Held *h = c < HELD_CLASSES ? s->held[c] : NULL;
    if (h != NULL) {
        s->held[c] = h->next;
        s->n_held[c]--;
    } else if ((h = PyMem_Malloc(c < HELD_CLASSES ? (c + 1) * HELD_CLASS : bytes)) == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    h->next = NULL;
    memcpy(&h->rec, r, r->size);
    h->rec.query_copy = 0; /* a copy that is kept is kept as the query itself (tuple(m) in _query_copy) */
    return h;
}

static void free_chain(Spares *s, Held *h)
{
    while (h != NULL) {
        Held *next = h->next;
        size_t c = held_class(offsetof(Held, rec) + h->rec.size);
        if (c < HELD_CLASSES && s->n_held[c] < MAX_SPARE_HELD) {
            h->next = s->held[c];
            s->held[c] = h;
            s->n_held[c]++;
        } else {
            PyMem_Free(h);
        }
        h = next;
    }
}

static void free_spares(Spares *s)
{
    for (int c = 0; c < HELD_CLASSES; c++) {
        for (Held *h = s->held[c], *next; h != NULL; h = next) {
            next = h->next;
            PyMem_Free(h);
        }
        s->held[c] = NULL;
        s->n_held[c] = 0;
    }
}

/* A key in an insertion-ordered hash map (Python's dict order: a replaced value keeps its place). */
typedef struct Node {
    struct Node *chain, *older, *younger;
    uint64_t hash;
    Key key;
} Node;

typedef struct {
    Node **buckets;
    size_t mask;
    Py_ssize_t count;
    Node *oldest, *youngest;
    const Rec *(*rec_of)(const Node *n); /* a message of the key (a dnstap key's scope name is in it) */
} OMap;

/* Pending queries under one key: oldest first; is_list as in Python (a second query made the value a list). */
typedef struct {
    Node node;
    Held *first, *last;
    Py_ssize_t count;
    int is_list;
} Pending;

/* An open zone transfer (match._Transfer). */
typedef struct {
    Node node;
    Held *query, *first;
    int64_t ancount, wirelen, dns_len, last_ts;
    int64_t messages;
} Transfer;

/* 64 x 64 -> 128-bit multiply, folded: a strong mix in one multiply. */
static inline uint64_t mum(uint64_t a, uint64_t b)
{
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

/* The key's seven words multiplied in four independent pairs, each word masked by the seed (a per-process
 * secret, both factors: crafted traffic can neither aim at one chain nor zero a factor), then mixed once more: a
 * chain of one multiply per word was a fifth of the matcher's time. */
static uint64_t hash_key(const Key *k, uint64_t seed)
{
    uint64_t s2 = (seed ^ 0x589965CC75374CC3ull) * 0x9E3779B97F4A7C15ull;
    uint64_t h = mum(k->client[0] ^ seed ^ 0xA0761D6478BD642Full, k->client[1] ^ s2)
                 ^ mum(k->server[0] ^ seed ^ 0xE7037ED1A0B428DBull, k->server[1] ^ s2 ^ 0x8EBC6AF09C88C6E3ull)
                 ^ mum(k->scope_hash ^ seed ^ 0x1D8E4E27C47D124Full, k->ports_id ^ s2 ^ 0xA0761D6478BD642Full)
                 ^ mum(k->scope ^ seed ^ 0x589965CC75374CC3ull, s2 ^ 0xE7037ED1A0B428DBull);
    return mum(h ^ seed, s2 ^ 0x1D8E4E27C47D124Full);
}

static int same_scope_name(const Rec *a, const Rec *b)
{
    return a->scope_name.len == b->scope_name.len
           && memcmp(rec_at(a, a->scope_name), rec_at(b, b->scope_name), a->scope_name.len) == 0;
}

/* The node of key k (hash h) of the message r. */
static Node *omap_find(const OMap *m, const Key *k, uint64_t h, const Rec *r)
{
    if (m->buckets == NULL)
        return NULL;
    for (Node *n = m->buckets[h & m->mask]; n != NULL; n = n->chain) {
        if (n->hash == h && same_key(&n->key, k) && (!key_family(k) || same_scope_name(m->rec_of(n), r)))
            return n;
    }
    return NULL;
}

static int omap_grow(OMap *m)
{
    size_t size = m->buckets ? 2 * (m->mask + 1) : 1024;
    Node **b = PyMem_Calloc(size, sizeof *b);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Node *n = m->oldest; n != NULL; n = n->younger) {
        n->chain = b[n->hash & (size - 1)];
        b[n->hash & (size - 1)] = n;
    }
    PyMem_Free(m->buckets);
    m->buckets = b;
    m->mask = size - 1;
    return 0;
}

/* Add n (key and hash set) at the young end. */
static int omap_insert(OMap *m, Node *n)
{
    if ((m->buckets == NULL || (size_t)m->count >= m->mask + 1) && omap_grow(m) < 0)
        return -1;
    n->chain = m->buckets[n->hash & m->mask];
    m->buckets[n->hash & m->mask] = n;
    n->younger = NULL;
    n->older = m->youngest;
    if (m->youngest)
        m->youngest->younger = n;
    else
        m->oldest = n;
    m->youngest = n;
    m->count++;
    return 0;
}

/* Node n of m moved to the young end of the age order (its bucket is unchanged). */
static void omap_touch(OMap *m, Node *n)
{
    if (m->youngest == n)
        return;
    if (n->older)
        n->older->younger = n->younger;
    else
        m->oldest = n->younger;
    n->younger->older = n->older; /* (n is not the youngest) */
    n->older = m->youngest;
    n->younger = NULL;
    m->youngest->younger = n;
    m->youngest = n;
}

static void omap_unlink(OMap *m, Node *n)
{
    Node **p = &m->buckets[n->hash & m->mask];
    while (*p != n)
        p = &(*p)->chain;
    *p = n->chain;
    if (n->older)
        n->older->younger = n->younger;
    else
        m->oldest = n->younger;
    if (n->younger)
        n->younger->older = n->older;
    else
        m->youngest = n->older;
    m->count--;
}

typedef struct {
    PyObject_HEAD OMap pending, transfers;
    int64_t timeout, now;
    Py_ssize_t max_pending, per_key, held; /* held: queries in pending */
    Py_ssize_t max_transfers;
    uint64_t seed;
    Pending *spare; /* freed nodes kept for the next keys (a stack through node.chain) */
    Spares spares;
    Py_ssize_t n_spare;
    long long matched, response_only, duplicates, query_only, evicted, xfr_messages, capped, embedded_used;
    long long xfr_evicted;
} Matcher;

enum { MAX_SPARE = 1024 };

/* Why spares: a pending key is made and freed for nearly every transaction; a node of the stack is ready at once
 * and was freed recently (in the cache). */
static Pending *pending_new(Matcher *m)
{
    Pending *p = m->spare;
    if (p != NULL) {
        m->spare = (Pending *)p->node.chain;
        m->n_spare--;
        return p;
    }
    p = PyMem_Malloc(sizeof *p);
    if (p == NULL)
        PyErr_NoMemory();
    return p;
}

static void pending_free(Matcher *m, Pending *p)
{
    if (m->n_spare >= MAX_SPARE) {
        PyMem_Free(p);
        return;
    }
    p->node.chain = (Node *)m->spare;
    m->spare = p;
    m->n_spare++;
}

static const Rec *pending_rec(const Node *n)
{
    return &((const Pending *)n)->first->rec; /* (a key without queries is removed at once) */
}

static const Rec *transfer_rec(const Node *n)
{
    return &((const Transfer *)n)->query->rec;
}

static void free_transfer(Matcher *m, Transfer *x)
{
    free_chain(&m->spares, x->query);
    free_chain(&m->spares, x->first);
    PyMem_Free(x);
}

static void clear_maps(Matcher *m)
{
    for (Node *n = m->pending.oldest; n != NULL;) {
        Node *next = n->younger;
        free_chain(&m->spares, ((Pending *)n)->first);
        PyMem_Free(n);
        n = next;
    }
    for (Node *n = m->transfers.oldest; n != NULL;) {
        Node *next = n->younger;
        free_transfer(m, (Transfer *)n);
        n = next;
    }
    PyMem_Free(m->pending.buckets);
    PyMem_Free(m->transfers.buckets);
    memset(&m->pending, 0, sizeof m->pending);
    memset(&m->transfers, 0, sizeof m->transfers);
    m->pending.rec_of = pending_rec;
    m->transfers.rec_of = transfer_rec;
}

/* FNV-1a: the scope name's part of the key hash (which hash_key seeds and mixes). */
static uint64_t hash_text(const char *s, uint32_t n)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001B3ull;
    return h;
}

/* The 16 bytes of an address (alen used, the rest zero) as two words, or zeros when absent. */
static inline void addr_words(const uint8_t *a, int alen, int absent, uint64_t w[2])
{
    w[0] = w[1] = 0;
    if (absent)
        return;
    if (alen == 16) {
        memcpy(w, a, 16);
    } else {
        uint32_t v4;
        memcpy(&v4, a, 4);
        memcpy(w, &v4, 4);
    }
}

static void make_key(const Rec *r, int response, Key *k)
{
    int alen = addr_len(r);
    int absent_client = response ? ABSENT_DST : ABSENT_SRC, absent_server = response ? ABSENT_SRC : ABSENT_DST;
    int32_t cport = response ? r->dport : r->sport, sport = response ? r->sport : r->dport;
    uint64_t client[2], server[2];
    addr_words(response ? r->dst : r->src, alen, r->absent & absent_client, client);
    addr_words(response ? r->src : r->dst, alen, r->absent & absent_server, server);
    k->client[0] = client[0];
    k->client[1] = client[1];
    k->server[0] = server[0];
    k->server[1] = server[1];
    k->ports_id = (uint64_t)(uint16_t)cport | (uint64_t)(uint16_t)sport << 16 | (uint64_t)(uint16_t)r->id << 32;
    if (r->family == 0) { /* a packet's: its scope is its IP protocol */
        k->scope_hash = 0;
        k->scope = (uint64_t)r->proto | (uint64_t)r->ipv << 8;
        return;
    }
    unsigned absent = (r->absent & absent_client ? K_CLIENT : 0) | (r->absent & absent_server ? K_SERVER : 0)
                      | (cport < 0 ? K_CPORT : 0) | (sport < 0 ? K_SPORT : 0);
    unsigned ipv = (absent & (K_CLIENT | K_SERVER)) == (K_CLIENT | K_SERVER) ? 0 : r->ipv;
    k->scope_hash = hash_text(rec_at(r, r->scope_name), r->scope_name.len);
    k->scope = (uint64_t)ipv << 8 | (uint64_t)r->family << 16 | (uint64_t)r->transport << 24 | (uint64_t)absent << 32;
}

static int is_ascii(const char *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if ((unsigned char)s[i] >= 0x80)
            return 0;
    }
    return 1;
}

/* qname == rname or qname.lower() == rname.lower(): 1, 0, or -1 with an exception. ASCII names (nearly all) are
 * compared here (str.lower changes only A-Z in them); others through str.lower itself, whose Unicode rules can
 * even make a non-ASCII name equal an ASCII one (KELVIN SIGN lowers to k). */
static int same_name(const Rec *q, const Rec *r)
{
    const char *a = rec_at(q, q->qname), *b = rec_at(r, r->qname);
    uint32_t n = q->qname.len, m = r->qname.len;
    if (n == m && memcmp(a, b, n) == 0)
        return 1;
    if (is_ascii(a, n) && is_ascii(b, m)) {
        if (n != m)
            return 0;
        for (uint32_t k = 0; k < n; k++) {
            unsigned char c = (unsigned char)a[k], d = (unsigned char)b[k];
            if (c != d && ((c | 0x20) != (d | 0x20) || (unsigned char)((c | 0x20) - 'a') > 'z' - 'a'))
                return 0;
        }
        return 1;
    }
    PyObject *x = PyUnicode_DecodeUTF8(a, n, "strict"), *y = PyUnicode_DecodeUTF8(b, m, "strict");
    PyObject *lx = x ? PyObject_CallMethod(x, "lower", NULL) : NULL;
    PyObject *ly = y ? PyObject_CallMethod(y, "lower", NULL) : NULL;
    int eq = lx && ly ? PyObject_RichCompareBool(lx, ly, Py_EQ) : -1;
    Py_XDECREF(x);
    Py_XDECREF(y);
    Py_XDECREF(lx);
    Py_XDECREF(ly);
    return eq;
}

/* match._answers: the pending query q (with the response's key) is the one response r answers (ts >= min_ts). */
static int answers(const Rec *q, const Rec *r, __int128 min_ts)
{
    if (r->qname.len == SPAN_NONE)
        return q->ts_ns >= min_ts;
    if (q->qtype != r->qtype || q->qname.len == SPAN_NONE)
        return 0;
    int same = same_name(q, r);
    if (same <= 0)
        return same;
    return q->ts_ns >= min_ts;
}

static int closes_transfer(const Rec *r)
{
    return (r->flags & 0x000F) != 0 || r->last_an == TYPE_SOA;
}

static int64_t cap32(Matcher *m, int64_t v)
{
    if (v > INT32_CAP) {
        m->capped++;
        return INT32_CAP;
    }
    return v;
}

/* The transfer as one transaction: its first response with the summed counts (match._Transfer.merged). */
static int emit_transfer(Matcher *m, Transfer *x, TxBatch *out)
{
    if (records->txbatch_add(out, &x->query->rec, &x->first->rec, (int32_t)Py_MIN(x->messages, INT32_CAP)) < 0)
        return -1;
    /* the response just added, not NULL (gcc -fanalyzer does not follow txbatch_add through the capsule) */
    Rec *r = (Rec *)tx_response(txbatch_get(out, out->txs.n - 1));
    r->ancount = (int32_t)cap32(m, x->ancount);
    r->wirelen = cap32(m, x->wirelen);
    r->dns_len = cap32(m, x->dns_len);
    m->matched++;
    return 0;
}

static void transfer_add(Transfer *x, const Rec *r)
{
    x->ancount += r->ancount < 0 ? 0 : r->ancount;
    x->wirelen = x->wirelen < 0 || r->wirelen < 0 ? -1 : x->wirelen + r->wirelen; /* dnstap: None */
    x->dns_len += r->dns_len;
    x->messages++;
    x->last_ts = r->ts_ns;
}

/* An open transfer closed now: exported as it stands (match._Transfer.merged) and freed. */
static int close_transfer(Matcher *m, Transfer *x, TxBatch *out)
{
    omap_unlink(&m->transfers, &x->node);
    int rc = emit_transfer(m, x, out);
    free_transfer(m, x);
    return rc;
}

/* TransactionTable._open_transfer: a new transfer at the young end; the one it replaces under its key, or else the
 * oldest when max_transfers are open, is closed first. q is taken over. */
static int open_transfer(Matcher *m, const Key *k, uint64_t h, Held *q, const Rec *r, TxBatch *out)
{
    Transfer *old = (Transfer *)omap_find(&m->transfers, k, h, r);
    if (old == NULL && m->transfers.count >= m->max_transfers) {
        old = (Transfer *)m->transfers.oldest;
        m->xfr_evicted++;
    }
    Held *first = hold(&m->spares, r);
    Transfer *x = first != NULL ? PyMem_Calloc(1, sizeof *x) : NULL;
    if (first != NULL && x == NULL)
        PyErr_NoMemory();
    if (x == NULL || (old != NULL && close_transfer(m, old, out) < 0)) {
        free_chain(&m->spares, q);
        free_chain(&m->spares, first);
        PyMem_Free(x);
        return -1;
    }
    x->node.key = *k;
    x->node.hash = h;
    x->query = q;
    x->first = first;
    transfer_add(x, r);
    if (omap_insert(&m->transfers, &x->node) < 0) {
        free_transfer(m, x);
        return -1;
    }
    return 0;
}

static int response(Matcher *m, const Rec *r, TxBatch *out)
{
    Key k;
    make_key(r, 1, &k);
    uint64_t h = hash_key(&k, m->seed);
    Pending *p = (Pending *)omap_find(&m->pending, &k, h, r);
    if (p != NULL) {
        __int128 min_ts = (__int128)r->ts_ns - m->timeout;
        Held *q = NULL, **link = &p->first, *prev = NULL;
        for (Held *c = p->first; c != NULL; prev = c, link = &c->next, c = c->next) {
            int a = answers(&c->rec, r, min_ts);
            if (a < 0)
                return -1;
            if (a) {
                q = c;
                break;
            }
            if (!p->is_list)
                break;
        }
        if (q != NULL) {
            *link = q->next;
            if (p->last == q)
                p->last = prev;
            q->next = NULL;
            p->count--;
            m->held--;
            if (p->first == NULL) {
                omap_unlink(&m->pending, &p->node);
                pending_free(m, p);
            }
            if ((q->rec.qtype == QTYPE_AXFR || q->rec.qtype == QTYPE_IXFR) && !closes_transfer(r))
                return open_transfer(m, &k, h, q, r, out);
            m->matched++;
            int rc = records->txbatch_add(out, &q->rec, r, 1);
            free_chain(&m->spares, q);
            return rc;
        }
    }
    if (m->transfers.count) {
        Transfer *x = (Transfer *)omap_find(&m->transfers, &k, h, r);
        if (x != NULL) {
            transfer_add(x, r);
            m->xfr_messages++;
            if (closes_transfer(r))
                return close_transfer(m, x, out);
            omap_touch(&m->transfers, &x->node); /* the age order is the order of last messages */
            return 0;
        }
    }
    m->response_only++;
    return records->txbatch_add(out, NULL, r, 1);
}

/* One query more than max_pending_per_key under a key: the oldest is exported as query-only. */
static int evict_oldest(Matcher *m, Pending *p, TxBatch *out)
{
    Held *old = p->first;
    p->first = old->next;
    if (p->last == old)
        p->last = NULL;
    old->next = NULL;
    p->count--;
    m->held--;
    m->query_only++;
    m->evicted++;
    int rc = records->txbatch_add(out, &old->rec, NULL, 1);
    free_chain(&m->spares, old);
    return rc;
}

static int query(Matcher *m, const Rec *r, TxBatch *out)
{
    Key k;
    make_key(r, 0, &k);
    uint64_t h = hash_key(&k, m->seed);
    Held *q = hold(&m->spares, r);
    if (q == NULL)
        return -1;
    Pending *p = (Pending *)omap_find(&m->pending, &k, h, r);
    if (p != NULL) {
        m->duplicates++;
        if ((p->is_list && p->count >= m->per_key) || (!p->is_list && m->per_key <= 1)) {
            if (evict_oldest(m, p, out) < 0) {
                free_chain(&m->spares, q);
                return -1;
            }
        } else {
            p->is_list = 1;
        }
        if (p->last != NULL)
            p->last->next = q;
        else
            p->first = q;
        p->last = q;
        p->count++;
        m->held++;
        return 0;
    }
    p = pending_new(m);
    if (p == NULL) {
        free_chain(&m->spares, q);
        return -1;
    }
    p->node.key = k;
    p->node.hash = h;
    p->first = p->last = q;
    p->count = 1;
    p->is_list = 0;
    if (omap_insert(&m->pending, &p->node) < 0) {
        free_chain(&m->spares, q);
        pending_free(m, p);
        return -1;
    }
    m->held++;
    return 0;
}

/* TransactionTable._query_copy: the query a dnstap response carries waits for that response like a query, unless
 * it is malformed or the query itself is pending (logged on its own): then it is dropped (a transaction counts
 * once). */
static int query_copy(Matcher *m, const Rec *r, TxBatch *out)
{
    if (r->malformed)
        return 0;
    Key k;
    make_key(r, 0, &k);
    Pending *p = (Pending *)omap_find(&m->pending, &k, hash_key(&k, m->seed), r);
    for (Held *c = p ? p->first : NULL; c != NULL; c = p->is_list ? c->next : NULL) {
        int a = answers(&c->rec, r, c->rec.ts_ns);
        if (a != 0)
            return a < 0 ? -1 : 0;
    }
    m->embedded_used++;
    return r->flags & FLAG_QR ? response(m, r, out) : query(m, r, out);
}

static int emit_queries(Matcher *m, Held *chain, TxBatch *out, __int128 cutoff)
{
    for (Held *q = chain; q != NULL; q = q->next) {
        if (records->txbatch_add(out, &q->rec, NULL, 1) < 0)
            return -1;
        m->query_only++;
        m->evicted += q->rec.ts_ns >= cutoff;
    }
    return 0;
}

/* TransactionTable._expire. */
static int expire(Matcher *m, TxBatch *out)
{
    __int128 cutoff = (__int128)m->now - m->timeout;
    Py_ssize_t excess = m->held - m->max_pending, due = 0;
    for (Node *n = m->pending.oldest; n != NULL; n = n->younger) {
        if (((Pending *)n)->first->rec.ts_ns >= cutoff && excess <= 0)
            break;
        due++;
        excess -= ((Pending *)n)->count;
    }
    /* Keys re-inserted below go to the young end, behind every key that was due. */
    for (Py_ssize_t i = 0; i < due; i++) {
        Pending *p = (Pending *)m->pending.oldest;
        omap_unlink(&m->pending, &p->node);
        Held *waiting = p->first;
        Py_ssize_t young = 0;
        if (p->is_list && p->last->rec.ts_ns >= cutoff) {
            for (Held *q = waiting; q != NULL; q = q->next)
                young += q->rec.ts_ns >= cutoff;
        }
        if (p->is_list && p->last->rec.ts_ns >= cutoff && m->held - p->count + young <= m->max_pending) {
            /* Retries still within the timeout stay pending, now at the young end. */
            Held *keep = NULL, **keep_end = &keep, *old = NULL, **old_end = &old, *keep_last = NULL;
            Py_ssize_t kept = 0;
            for (Held *q = waiting, *next; q != NULL; q = next) {
                next = q->next;
                q->next = NULL;
                if (q->rec.ts_ns >= cutoff) {
                    *keep_end = q;
                    keep_end = &q->next;
                    keep_last = q;
                    kept++;
                } else {
                    *old_end = q;
                    old_end = &q->next;
                }
            }
            p->first = keep;
            p->last = keep_last;
            m->held -= p->count - kept;
            p->count = kept;
            p->is_list = kept > 1;
            if (omap_insert(&m->pending, &p->node) < 0) {
                free_chain(&m->spares, keep);
                free_chain(&m->spares, old);
                pending_free(m, p);
                return -1;
            }
            waiting = old;
        } else {
            m->held -= p->count;
            pending_free(m, p);
        }
        int rc = emit_queries(m, waiting, out, cutoff);
        free_chain(&m->spares, waiting);
        if (rc < 0)
            return -1;
    }
    /* Oldest last message first: only the transfers that time out are looked at (and the one after them). */
    while (m->transfers.oldest != NULL && ((Transfer *)m->transfers.oldest)->last_ts < cutoff) {
        if (close_transfer(m, (Transfer *)m->transfers.oldest, out) < 0)
            return -1;
    }
    return 0;
}

#define N_COUNTERS 9
#define SNAPSHOT(m)                                                                                                 \
    {m->matched, m->response_only, m->duplicates, m->query_only, m->evicted, m->xfr_messages, m->capped,            \
     m->embedded_used, m->xfr_evicted}

static PyObject *counts_since(Matcher *m, const long long *before)
{
    long long now[N_COUNTERS] = SNAPSHOT(m);
    PyObject *t = PyTuple_New(N_COUNTERS);
    for (int k = 0; t != NULL && k < N_COUNTERS; k++)
        ext_set_item(&t, k, PyLong_FromLongLong(now[k] - before[k]));
    return t;
}

/* Why ahead: a message's first lines (its flags, then its addresses for the key) were most of make_key's and
 * matcher_add's time, each waited for in turn; asked for a few messages ahead, they are there at their turn. */
enum { AHEAD = 4 };
_Static_assert(offsetof(Rec, dst) + sizeof ((Rec *)0)->dst <= 3 * 64, "the key's fields in a record's first 3 lines");

static PyObject *matcher_add(PyObject *self, PyObject *args)
{
    Matcher *m = (Matcher *)self;
    MsgBatch *msgs;
    TxBatch *out;
    PyObject *clock = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|O:add", records->msgbatch_type, &msgs, records->txbatch_type, &out, &clock))
        return NULL;
    long long now_ns = 0;
    if (clock != Py_None && (now_ns = PyLong_AsLongLong(clock)) == -1 && PyErr_Occurred())
        return NULL;
    long long before[N_COUNTERS] = SNAPSHOT(m);
    for (Py_ssize_t i = 0; i < msgs->recs.n; i++) {
        const Rec *r = msgbatch_get(msgs, i);
        if (i + AHEAD < msgs->recs.n) { /* its first three lines: the header, the key's fields */
            const char *ahead = (const char *)msgbatch_get(msgs, i + AHEAD);
            __builtin_prefetch(ahead);
            __builtin_prefetch(ahead + 64);
            __builtin_prefetch(ahead + 128);
        }
        int rc;
        if (r->query_copy)
            rc = query_copy(m, r, out);
        else if (r->malformed) /* exported alone: on the query side unless the header says response */
            rc = r->flags >= 0 && (r->flags & FLAG_QR) ? records->txbatch_add(out, NULL, r, 1) : records->txbatch_add(out, r, NULL, 1);
        else
            rc = r->flags & FLAG_QR ? response(m, r, out) : query(m, r, out);
        if (rc < 0)
            return NULL;
    }
    if (clock != Py_None) {
        if (now_ns > m->now)
            m->now = now_ns;
    } else if (msgs->recs.n) {
        int64_t last = msgbatch_get(msgs, msgs->recs.n - 1)->ts_ns;
        if (last > m->now)
            m->now = last;
    }
    if (expire(m, out) < 0)
        return NULL;
    return counts_since(m, before);
}

/* A stable merge sort of the array by capture time. */
static void sort_by_time(Held **a, Held **tmp, Py_ssize_t n)
{
    if (n < 2)
        return;
    Py_ssize_t h = n / 2;
    sort_by_time(a, tmp, h);
    sort_by_time(a + h, tmp, n - h);
    Py_ssize_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = a[j]->rec.ts_ns < a[i]->rec.ts_ns ? a[j++] : a[i++];
    while (i < h)
        tmp[k++] = a[i++];
    while (j < n)
        tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
}

static PyObject *matcher_flush(PyObject *self, PyObject *args)
{
    Matcher *m = (Matcher *)self;
    TxBatch *out;
    if (!PyArg_ParseTuple(args, "O!:flush", records->txbatch_type, &out))
        return NULL;
    long long before[N_COUNTERS] = SNAPSHOT(m);
    for (Node *n = m->transfers.oldest; n != NULL; n = n->younger) {
        if (emit_transfer(m, (Transfer *)n, out) < 0)
            return NULL;
    }
    Py_ssize_t total = 0;
    int lists = 0;
    for (Node *n = m->pending.oldest; n != NULL; n = n->younger) {
        lists |= ((Pending *)n)->is_list;
        for (Held *q = ((Pending *)n)->first; q != NULL; q = q->next)
            total++;
    }
    Held **all = PyMem_Malloc((2 * total + 1) * sizeof *all);
    if (all == NULL)
        return PyErr_NoMemory();
    Py_ssize_t k = 0;
    for (Node *n = m->pending.oldest; n != NULL; n = n->younger) {
        for (Held *q = ((Pending *)n)->first; q != NULL; q = q->next)
            all[k++] = q;
    }
    if (lists) /* retries moved to the young end go back in capture order */
        sort_by_time(all, all + total, total);
    for (k = 0; k < total; k++) {
        if (records->txbatch_add(out, &all[k]->rec, NULL, 1) < 0) {
            PyMem_Free(all);
            return NULL;
        }
    }
    PyMem_Free(all);
    m->query_only += total;
    m->held = 0;
    clear_maps(m);
    return counts_since(m, before);
}

static Py_ssize_t matcher_len(PyObject *self)
{
    return ((Matcher *)self)->pending.count;
}

static PyObject *matcher_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    long long timeout, seed;
    Py_ssize_t max_pending, per_key, max_transfers;
    static char *kwlist[] = {"timeout_ns", "max_pending", "max_pending_per_key", "max_transfers", "seed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LnnnL:Matcher", kwlist, &timeout, &max_pending, &per_key,
                                     &max_transfers, &seed))
        return NULL;
    if (max_transfers < 1) {
        PyErr_SetString(PyExc_ValueError, "max_transfers must be at least 1");
        return NULL;
    }
    Matcher *m = (Matcher *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->timeout = timeout;
    m->max_pending = max_pending;
    m->per_key = per_key;
    m->max_transfers = max_transfers;
    m->seed = (uint64_t)seed;
    m->pending.rec_of = pending_rec;
    m->transfers.rec_of = transfer_rec;
    return (PyObject *)m;
}

static void matcher_dealloc(PyObject *self)
{
    Matcher *m = (Matcher *)self;
    clear_maps(m);
    while (m->spare != NULL) {
        Pending *p = m->spare;
        m->spare = (Pending *)p->node.chain;
        PyMem_Free(p);
    }
    free_spares(&m->spares);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *matcher_held(PyObject *self, PyObject *Py_UNUSED(unused))
{
    return PyLong_FromSsize_t(((Matcher *)self)->held);
}

static PyObject *matcher_transfers(PyObject *self, PyObject *Py_UNUSED(unused))
{
    return PyLong_FromSsize_t(((Matcher *)self)->transfers.count);
}

static PyMethodDef matcher_methods[] = {
    {"held", matcher_held, METH_NOARGS, "held() -> the pending queries (TransactionTable.held)."},
    {"transfers", matcher_transfers, METH_NOARGS, "transfers() -> the open zone transfers."},
    {"add", matcher_add, METH_VARARGS,
     "add(msgs, out, now_ns=None) -> counts: match a MsgBatch into a TxBatch, then expire at now_ns."},
    {"flush", matcher_flush, METH_VARARGS, "flush(out) -> counts: end of input, everything pending into out."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Matcher_Type = EXT_TYPE(Matcher, "probe.match._matchrec.Matcher", 0,
    "Pending queries and open zone transfers of message records (probe.match.TransactionTable in C).",
    .tp_new = matcher_new, .tp_dealloc = matcher_dealloc,
    .tp_as_sequence = &(PySequenceMethods){.sq_length = matcher_len}, .tp_methods = matcher_methods);

PyMODINIT_FUNC PyInit__matchrec(void)
{
    if (records_import() < 0)
        return NULL;
    return ext_module("probe.match._matchrec", NULL, NULL, (PyTypeObject *[]){&Matcher_Type, NULL}, NULL, NULL);
}
