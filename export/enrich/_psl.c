/* export.enrich._psl: public suffix and registered domain of every QNAME of a string column, by the rules of
 * the Public Suffix List, in one pass (its Python reference: PublicSuffixes.suffixes in export/enrich/psl.py).
 *
 * Why: QNAMEs repeat far less than addresses, so a cache in front of the publicsuffixlist package (Python)
 * still ran it for many rows. Here the rules are a hash table that also holds every suffix of a rule, and a
 * name is walked from its last label: a probe per label, until no rule ends with what was read (two or three
 * probes for most names). export/enrich/psl.py reads the rules from the list's file (read_rules) and keeps the package as the
 * Python twin and the reference: tests/export/test_psl.py compares the two on every QNAME of the test captures,
 * on names made from every rule and on an edge-case list; fuzz/fuzz_psl.py on any text.
 *
 * The algorithm is the package's (publicsuffixlist 1.x, PublicSuffixList._countpublic), which the tests pin:
 *   - a trailing dot is dropped; the name is lower-cased (ASCII here; a name with other characters through
 *     Python's str.lower, as the package does); a name with an empty label has no answer ("", "");
 *   - a one-label name is its own suffix; else from the longest candidate (maxlabel + 1 labels) down to the
 *     last label, the first suffix s for which "!s" is a rule gives depth(s) - 1 labels, "*.s" depth(s) + 1
 *     (depth(s) when s is the whole name), "s" itself depth(s); none: the last label (the '*' rule). (Walked
 *     from the right here: the deepest suffix that is one of these decides, which is the same.)
 *   - public suffix: the last n labels; registered domain: the last n + 1 labels ("" when the name has only n).
 *
 * SuffixRules(rules, maxlabel): rules, an iterable of the list's rules as str ("com", "*.ck", "!www.ck");
 *   maxlabel: the most labels of a rule.
 * SuffixRules.columns(length, offset, buffers) -> ((public suffix column), (registered domain column)),
 *   (null_count, validity, offsets, data) each (strcolumn.h); a null name gives "" in both.
 * Its capsule PSL_CAPSULE (psl_api.h): the registered domain of one name, for export/_topk.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "extmodule.h"
#include "psl_api.h"
#include "strcolumn.h"

enum { EXACT = 1, EXCEPTION = 2, WILDCARD = 4 }; /* s is a rule; "!s" is; "*.s" is. 0: s ends a longer one */

typedef struct {
    uint64_t hash;
    size_t off; /* into text */
    size_t len;
    int flags;
} Rule;

typedef struct {
    PyObject_HEAD
    int maxlabel;
    Rule *rules; /* every rule, what follows its '!' or '*.', and every suffix of these (by labels) */
    size_t nrules;
    uint32_t *slots; /* rule index + 1; 0: empty */
    size_t mask;
    char *text;
    size_t text_len;
    char *work; /* the lower-cased name being split */
    Py_ssize_t *dots; /* the positions of its dots */
    size_t work_cap;
} SuffixRules;

/* The hash of a suffix, made a label at a time from the right (h: the hash of the labels after this one), so
 * that a name's candidates cost one step each. */
static inline uint64_t with_label(uint64_t h, const char *s, size_t n)
{
    return text_hash(s, n, h);
}

static const Rule *find(const SuffixRules *r, const char *s, size_t n, uint64_t h)
{
    for (size_t i = h & r->mask;; i = (i + 1) & r->mask) { /* (the table is at most a quarter full) */
        uint32_t k = r->slots[i];
        if (k == 0)
            return NULL;
        const Rule *rule = &r->rules[k - 1];
        if (rule->hash == h && rule->len == n && text_eq(r->text + rule->off, s, n))
            return rule;
    }
}

/* Add flag to the entry of s, and entries (flag 0) for the suffixes of s, each made if new. The text of s is at
 * r->text + r->text_len (copied there by the caller), and kept when an entry is made for it. */
static void add(SuffixRules *r, size_t n, int flag)
{
    const char *s = r->text + r->text_len;
    uint64_t h = 0;
    size_t end = n;
    for (size_t k = n + 1; k-- > 0;) {
        if (k > 0 && s[k - 1] != '.')
            continue;
        h = with_label(h, s + k, end - k); /* the suffix s[k..n) */
        end = k ? k - 1 : 0;
        int f = k == 0 ? flag : 0;
        size_t i = h & r->mask;
        for (; r->slots[i]; i = (i + 1) & r->mask) {
            Rule *rule = &r->rules[r->slots[i] - 1];
            if (rule->hash == h && rule->len == n - k && memcmp(r->text + rule->off, s + k, n - k) == 0)
                break;
        }
        if (r->slots[i]) {
            r->rules[r->slots[i] - 1].flags |= f;
            continue;
        }
        r->rules[r->nrules] = (Rule){h, r->text_len + k, n - k, f};
        r->slots[i] = (uint32_t)++r->nrules;
        if (k == 0)
            r->text_len += n; /* (entries of its suffixes point into it: made before it, kept with it) */
    }
}

static void rules_free(SuffixRules *r)
{
    PyMem_Free(r->rules);
    PyMem_Free(r->slots);
    PyMem_Free(r->text);
    PyMem_Free(r->work);
    PyMem_Free(r->dots);
    r->rules = NULL;
    r->slots = NULL;
    r->text = r->work = NULL;
    r->dots = NULL;
    r->nrules = r->text_len = r->work_cap = 0;
    r->mask = 0;
}

static int work_room(SuffixRules *r, size_t n)
{
    if (n <= r->work_cap)
        return 0;
    size_t cap = r->work_cap, dots_cap = r->work_cap;
    char *w = ext_grow(r->work, &cap, n, 1, 256);
    if (w == NULL)
        return -1;
    r->work = w;
    Py_ssize_t *d = ext_grow(r->dots, &dots_cap, cap, sizeof(Py_ssize_t), 256);
    if (d == NULL)
        return -1; /* (work_cap unchanged: the dots are grown again next time) */
    r->dots = d;
    r->work_cap = cap;
    return 0;
}

static int rules_init(SuffixRules *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rules", "maxlabel", NULL};
    PyObject *iterable;
    int maxlabel;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oi:SuffixRules", kwlist, &iterable, &maxlabel))
        return -1;
    if (maxlabel < 0) {
        PyErr_SetString(PyExc_ValueError, "maxlabel must be at least 0");
        return -1;
    }
    PyObject *seq = PySequence_Fast(iterable, "rules must be an iterable of str");
    if (seq == NULL)
        return -1;
    rules_free(r);
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    size_t text = 0, most = 1; /* bytes of the entries' text, and entries: at most one per label of a rule, twice */
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *rule = PySequence_Fast_GET_ITEM(seq, k);
        Py_ssize_t n;
        const char *s = PyUnicode_Check(rule) ? PyUnicode_AsUTF8AndSize(rule, &n) : NULL;
        if (s == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "a rule must be a str, not %R", rule);
            Py_DECREF(seq);
            return -1;
        }
        text += 2 * (size_t)n;
        most += 2;
        for (Py_ssize_t j = 0; j < n; j++)
            most += 2 * (s[j] == '.');
    }
    size_t cap = 16;
    while (cap < 4 * most)
        cap *= 2;
    if (cap > UINT32_MAX) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many rules");
        return -1;
    }
    r->maxlabel = maxlabel;
    r->rules = PyMem_Calloc(most, sizeof(Rule));
    r->slots = PyMem_Calloc(cap, sizeof(uint32_t));
    r->text = PyMem_Malloc(text + 1);
    if (r->rules == NULL || r->slots == NULL || r->text == NULL) {
        rules_free(r);
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    r->mask = cap - 1;
    if (work_room(r, 256) < 0) {
        rules_free(r);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, k), &n);
        memcpy(r->text + r->text_len, s, (size_t)n);
        add(r, (size_t)n, EXACT);
        if (n >= 1 && s[0] == '!') {
            memcpy(r->text + r->text_len, s + 1, (size_t)n - 1);
            add(r, (size_t)n - 1, EXCEPTION);
        } else if (n >= 2 && s[0] == '*' && s[1] == '.') {
            memcpy(r->text + r->text_len, s + 2, (size_t)n - 2);
            add(r, (size_t)n - 2, WILDCARD);
        }
    }
    Py_DECREF(seq);
    return 0;
}

/* The name s[0..n) lower-cased into r->work as Python's str.lower() does (ASCII here, else through Python), its
 * dots' positions into r->dots; its length (*dots: how many dots), or -1 (an exception). */
static Py_ssize_t lower(SuffixRules *r, const char *s, Py_ssize_t n, Py_ssize_t *dots)
{
    if (work_room(r, (size_t)n) < 0)
        return -1;
    char *work = r->work;
    Py_ssize_t *at = r->dots, nd = 0, k = 0;
    uint64_t high = 0;
    const uint64_t ones = 0x0101010101010101ULL, low7 = 0x7f7f7f7f7f7f7f7fULL, tops = 0x8080808080808080ULL;
    for (; k + 8 <= n; k += 8) { /* 8 bytes at a time: A-Z to a-z, and where the dots are */
        uint64_t w, x;
        memcpy(&w, s + k, 8);
        high |= w;
        uint64_t upper = (((w & low7) + 0x3f * ones) ^ ((w & low7) + 0x25 * ones)) & ~w & tops; /* 'A' to 'Z' */
        w |= upper >> 2;
        memcpy(work + k, &w, 8);
        x = w ^ ('.' * ones);
        for (uint64_t dot = ~(((x & low7) + low7) | x | low7); dot; dot &= dot - 1) /* bytes that are '.' */
            at[nd++] = k + (__builtin_ctzll(dot) >> 3);
    }
    for (; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        high |= c;
        work[k] = (char)(c + ((unsigned char)(c - 'A') < 26 ? 'a' - 'A' : 0));
        at[nd] = k;
        nd += c == '.';
    }
    *dots = nd;
    if (!(high & tops))
        return n;
    PyObject *text = PyUnicode_DecodeUTF8(s, n, "strict");
    if (text == NULL)
        return -1;
    PyObject *low = PyObject_CallMethod(text, "lower", NULL);
    Py_DECREF(text);
    if (low == NULL)
        return -1;
    Py_ssize_t len;
    const char *u = PyUnicode_AsUTF8AndSize(low, &len);
    if (u == NULL || work_room(r, (size_t)len) < 0) {
        Py_DECREF(low);
        return -1;
    }
    memcpy(r->work, u, (size_t)len);
    Py_DECREF(low);
    nd = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        r->dots[nd] = k;
        nd += r->work[k] == '.';
    }
    *dots = nd;
    return len;
}

/* Where the public suffix (*suffix) and the registered domain (*registered, = *end: none) of the lower-cased
 * name r->work[0..n) with nd dots start, and where they end (*end); 0 when the name has no answer. */
static int split_name(const SuffixRules *r, Py_ssize_t n, Py_ssize_t nd, Py_ssize_t *suffix, Py_ssize_t *registered,
                      Py_ssize_t *end)
{
    const char *s = r->work;
    const Py_ssize_t *dots = r->dots;
    if (n > 0 && s[n - 1] == '.') {
        n--; /* (the last dot: dropped) */
        nd--;
    }
    if (n == 0 || (nd > 0 && (dots[0] == 0 || dots[nd - 1] == n - 1)))
        return 0; /* the root, a leading or trailing empty label */
    for (Py_ssize_t k = 1; k < nd; k++) {
        if (dots[k] == dots[k - 1] + 1)
            return 0; /* an empty label */
    }
    Py_ssize_t labels = nd + 1, pub = 1;
#define START(d) ((d) < labels ? dots[nd - (d)] + 1 : 0) /* where the last d labels start */
    if (labels > 1) {
        /* The deepest suffix with an entry that is a rule decides (the package's first match from the longest
         * candidate); the walk stops at the first suffix that no rule ends with. */
        Py_ssize_t most = labels < (Py_ssize_t)r->maxlabel + 1 ? labels : (Py_ssize_t)r->maxlabel + 1, best = 0;
        int flags = 0;
        uint64_t h = 0;
        for (Py_ssize_t d = 1; d <= most; d++) {
            Py_ssize_t at = START(d), to = d == 1 ? n : dots[nd - d + 1];
            h = with_label(h, s + at, (size_t)(to - at));
            const Rule *rule = find(r, s + at, (size_t)(n - at), h);
            if (rule == NULL)
                break;
            if (rule->flags)
                best = d, flags = rule->flags;
        }
        pub = best == 0                ? 1
              : flags & EXCEPTION      ? best - 1
              : flags & WILDCARD       ? (best < labels ? best + 1 : best)
                                       : best;
    }
    if (pub == 0 || pub > labels)
        return 0; /* (as the package: no suffix of more labels than the name has) */
    *end = n;
    *suffix = START(pub);
    *registered = labels > pub ? START(pub + 1) : n;
#undef START
    return 1;
}

static PyObject *rules_columns(SuffixRules *r, PyObject *args)
{
    Py_ssize_t n, offset;
    PyObject *buffers;
    if (!PyArg_ParseTuple(args, "nnO:columns", &n, &offset, &buffers))
        return NULL;
    if (r->rules == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixRules not initialised");
        return NULL;
    }
    TextIn in;
    if (textin_open(&in, n, offset, buffers) < 0)
        return NULL;
    TextOut suffix, registered;
    PyObject *result = NULL, *a = NULL, *b = NULL;
    int made = 0;
    if (textout_init(&suffix, n) < 0)
        goto done;
    made = 1;
    if (textout_init(&registered, n) < 0)
        goto done;
    made = 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s;
        Py_ssize_t len, dots, suffix_at = 0, registered_at = 0, end = 0;
        int got = textin_get(&in, i, &s, &len);
        if (got < 0)
            goto done;
        if (got) {
            Py_ssize_t m = lower(r, s, len, &dots);
            if (m < 0)
                goto done;
            if (!split_name(r, m, dots, &suffix_at, &registered_at, &end))
                suffix_at = registered_at = end = 0;
        }
        if (textout_put(&suffix, i, r->work + suffix_at, (size_t)(end - suffix_at)) < 0 ||
            textout_put(&registered, i, r->work + registered_at, (size_t)(end - registered_at)) < 0)
            goto done;
    }
    a = textout_finish(&suffix);
    b = a ? textout_finish(&registered) : NULL;
    if (b != NULL)
        result = PyTuple_Pack(2, a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
done:
    if (made > 0)
        textout_free(&suffix);
    if (made > 1)
        textout_free(&registered);
    textin_close(&in);
    return result;
}

/* PslApi.registered_domain: what columns() writes in the registered domain column for one name. */
static Py_ssize_t registered_domain(PyObject *rules, const char *s, Py_ssize_t n, const char **out)
{
    SuffixRules *r = (SuffixRules *)rules;
    if (r->rules == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixRules not initialised");
        return -1;
    }
    Py_ssize_t dots, suffix_at, registered_at, end;
    Py_ssize_t m = lower(r, s, n, &dots);
    if (m < 0)
        return -1;
    *out = "";
    if (!split_name(r, m, dots, &suffix_at, &registered_at, &end))
        return 0;
    *out = r->work + registered_at;
    return end - registered_at;
}

static PyObject *rules_len(SuffixRules *r, void *Py_UNUSED(closure))
{
    return PyLong_FromSize_t(r->nrules);
}

static void rules_dealloc(SuffixRules *r)
{
    rules_free(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef rules_methods[] = {
    {"columns", (PyCFunction)rules_columns, METH_VARARGS,
     "columns(length, offset, buffers) -> (public suffix column, registered domain column) of a QNAME column."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rules_getset[] = {
    {"entries", (getter)rules_len, NULL, "entries of the table (rules, and what follows each '!' or '*.')", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SuffixRulesType = EXT_TYPE(SuffixRules, "export.enrich._psl.SuffixRules", 0,
    "SuffixRules(rules, maxlabel): the Public Suffix List's rules, applied to QNAME columns.",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)rules_init, .tp_dealloc = (destructor)rules_dealloc,
    .tp_methods = rules_methods, .tp_getset = rules_getset);

static PslApi api = {&SuffixRulesType, registered_domain};

PyMODINIT_FUNC PyInit__psl(void)
{
    return ext_module("export.enrich._psl", NULL, NULL, (PyTypeObject *[]){&SuffixRulesType, NULL}, PSL_CAPSULE, &api);
}
