/* export._topk: the Space-Saving summary of a stream of weighted items in k counters (its Python reference:
 * SpaceSaving in export/topk.py, which says the algorithm; tests/export/test_topk.py compares the two on random and
 * adversarial streams, fuzz/fuzz_topk.py on any).
 *
 * Why: the live top lists (probe.run.top) update a summary per QNAME, registered domain and client of every batch
 * written; in Python an eviction scans the k counters. Here the counters are a binary min-heap ordered by (count,
 * number of the last update), the reference's order (a total order: the smallest is the same whatever the heap's
 * shape), and a dict maps an item to its counter.
 *
 * SpaceSaving(k): k >= 1 counters.
 * SpaceSaving.add(items, weights=None): items a list of str or bytes (None skipped), weights None (1 each) or a
 *   list of positive ints as long as items.
 * SpaceSaving.entries() -> [(item, count, error)], unranked (export.topk.ranked ranks them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    Py_ssize_t k, used;
    PyObject *index;     /* item -> its counter's number (a PyLong of `numbers`) */
    PyObject **numbers;  /* the PyLongs 0..k-1 */
    PyObject **item;     /* per counter: its item (a reference) */
    long long *count, *error;
    unsigned long long *last;  /* per counter: the number of its last update */
    Py_ssize_t *heap, *pos;    /* heap of counter numbers; a counter's place in it */
    unsigned long long updates;
} Summary;

static int smaller(Summary *s, Py_ssize_t a, Py_ssize_t b)
{
    return s->count[a] < s->count[b] || (s->count[a] == s->count[b] && s->last[a] < s->last[b]);
}

static void place(Summary *s, Py_ssize_t at, Py_ssize_t c)
{
    s->heap[at] = c;
    s->pos[c] = at;
}

static void sift_down(Summary *s, Py_ssize_t at)
{
    Py_ssize_t c = s->heap[at];
    for (;;) {
        Py_ssize_t child = 2 * at + 1;
        if (child >= s->used)
            break;
        if (child + 1 < s->used && smaller(s, s->heap[child + 1], s->heap[child]))
            child++;
        if (!smaller(s, s->heap[child], c))
            break;
        place(s, at, s->heap[child]);
        at = child;
    }
    place(s, at, c);
}

static void summary_dealloc(Summary *s)
{
    if (s->item != NULL)
        for (Py_ssize_t i = 0; i < s->used; i++)
            Py_XDECREF(s->item[i]);
    if (s->numbers != NULL)
        for (Py_ssize_t i = 0; i < s->k; i++)
            Py_XDECREF(s->numbers[i]);
    Py_XDECREF(s->index);
    PyMem_Free(s->numbers);
    PyMem_Free(s->item);
    PyMem_Free(s->count);
    PyMem_Free(s->error);
    PyMem_Free(s->last);
    PyMem_Free(s->heap);
    PyMem_Free(s->pos);
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
    s->k = k;
    s->index = PyDict_New();
    s->numbers = PyMem_Calloc(k, sizeof(PyObject *));
    s->item = PyMem_Calloc(k, sizeof(PyObject *));
    s->count = PyMem_Calloc(k, sizeof(long long));
    s->error = PyMem_Calloc(k, sizeof(long long));
    s->last = PyMem_Calloc(k, sizeof(unsigned long long));
    s->heap = PyMem_Calloc(k, sizeof(Py_ssize_t));
    s->pos = PyMem_Calloc(k, sizeof(Py_ssize_t));
    if (s->index == NULL || !s->numbers || !s->item || !s->count || !s->error || !s->last || !s->heap || !s->pos) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if ((s->numbers[i] = PyLong_FromSsize_t(i)) == NULL) {
            Py_DECREF(s);
            return NULL;
        }
    return (PyObject *)s;
}

/* One update; -1 with an exception set on error. */
static int update(Summary *s, PyObject *item, long long weight)
{
    PyObject *number = PyDict_GetItemWithError(s->index, item);
    if (number == NULL && PyErr_Occurred())
        return -1;
    s->updates++;
    Py_ssize_t c;
    if (number != NULL) {
        c = PyLong_AsSsize_t(number);
        s->count[c] += weight;
        s->last[c] = s->updates;
        sift_down(s, s->pos[c]);  /* (only ever grows: it can only move down) */
        return 0;
    }
    if (s->used < s->k) {  /* a free counter: the newest update, the largest (count, last) of equal counts */
        c = s->used;
        if (PyDict_SetItem(s->index, item, s->numbers[c]) < 0)
            return -1;
        Py_INCREF(item);
        s->item[c] = item;
        s->count[c] = weight;
        s->error[c] = 0;
        s->last[c] = s->updates;
        /* sift up from the end */
        Py_ssize_t at = s->used++;
        while (at > 0) {
            Py_ssize_t parent = (at - 1) / 2;
            if (!smaller(s, c, s->heap[parent]))
                break;
            place(s, at, s->heap[parent]);
            at = parent;
        }
        place(s, at, c);
        return 0;
    }
    c = s->heap[0];  /* the smallest count, updated longest ago */
    if (PyDict_SetItem(s->index, item, s->numbers[c]) < 0)
        return -1;
    if (PyDict_DelItem(s->index, s->item[c]) < 0)
        return -1;
    Py_INCREF(item);
    Py_SETREF(s->item[c], item);
    s->error[c] = s->count[c];
    s->count[c] += weight;
    s->last[c] = s->updates;
    sift_down(s, 0);
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
    Py_INCREF(items);  /* (a weight's __index__ cannot run: only ints are taken, but keep the lists alive) */
    Py_INCREF(weights);
    PyObject *result = Py_None;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item == Py_None)
            continue;
        if (!PyUnicode_CheckExact(item) && !PyBytes_CheckExact(item)) {
            PyErr_SetString(PyExc_TypeError, "items must be str or bytes");
            result = NULL;
            break;
        }
        long long weight = 1;
        if (weights != Py_None) {
            PyObject *w = PyList_GET_ITEM(weights, i);
            if (!PyLong_CheckExact(w)) {
                PyErr_SetString(PyExc_TypeError, "weights must be ints");
                result = NULL;
                break;
            }
            weight = PyLong_AsLongLong(w);
            if (weight == -1 && PyErr_Occurred()) {
                result = NULL;
                break;
            }
            if (weight < 1) {
                PyErr_SetString(PyExc_ValueError, "weights must be positive");
                result = NULL;
                break;
            }
        }
        Py_INCREF(item);
        int failed = update(s, item, weight) < 0;
        Py_DECREF(item);
        if (failed) {
            result = NULL;
            break;
        }
    }
    Py_DECREF(items);
    Py_DECREF(weights);
    return Py_XNewRef(result);
}

static PyObject *summary_entries(Summary *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(s->used);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < s->used; c++) {
        PyObject *entry = Py_BuildValue("OLL", s->item[c], s->count[c], s->error[c]);
        if (entry == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, c, entry);
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
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddType(m, &SpaceSavingType) < 0)
        Py_CLEAR(m);
    return m;
}
