/* export.parquet._columns: a batch of row tuples -> Arrow column buffers, in one pass in C.
 *
 * Why: the record builder turns thousands of transactions (tuples of message tuples) into ~60 Arrow
 * columns. Transposing them in Python (zip(*rows)) and converting each Python list with pa.array costs
 * more than the rest of the pipeline; reading the tuples here and writing the Arrow buffers directly
 * costs a small fraction of that. export/parquet/columns.py wraps the buffers with pa.Array.from_buffers and holds the
 * pure-Python reference implementation that the tests compare this one with.
 *
 * extract(rows, specs) -> list of results, one per spec.
 *   rows:  a list of tuples.
 *   specs: a sequence of (path, kind) or (path, kind, fill). path is a tuple of indexes followed from
 *          the row through nested tuples; a None anywhere on the path (or the value itself) is a null,
 *          except that with a fill value, a None met after the first tuple on the path (row[path[0]])
 *          gives `fill` (a transaction's query present, but without an OPT record: DNS Probe's zeros).
 *          path may also be a pair of paths (p1, p2): p2 is read where p1 gives None (a coalesce).
 *   kind:  'q' int64, 'i' int32, 'd' float64, 'b' bool, 's' str as UTF-8, 'y' bytes,
 *          'a' packed IPv4/IPv6 address bytes as text (inet_ntop, as socket.inet_ntop), 'L' a tuple or
 *          list of ints as list<int32>, 'D' a QNAME str as DNS Probe's domain_name (see domain_name in
 *          export/parquet/columns.py).
 *   result: (null_count, validity or None, buffers...) with the buffers Arrow's layout needs:
 *          fixed width and bool: (data,); 's' 'y' 'a': (offsets int32, data); 'L': (offsets, values).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <string.h>

#include "valuetext.h"
#include "fastint.h"

#define MAX_PATH 4

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_put(Buf *b, const void *src, Py_ssize_t n)
{
    if (n == 0)
        return 0; /* (b->p may still be NULL: memcpy to NULL is undefined even for no bytes) */
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *p = PyMem_Realloc(b->p, cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

typedef struct {
    Py_ssize_t path[MAX_PATH];
    int depth;
    Py_ssize_t alt[MAX_PATH]; /* second path, read when the first gives None (Arrow's coalesce) */
    int alt_depth;            /* 0: no second path */
    char kind;
    PyObject *fill;     /* value for a None met after the first tuple on the path, or NULL (then null) */
    PyObject *validity; /* bytearray-like: a bytes object written in place */
    PyObject *data;     /* fixed width / bool: bytes of the final size; var width: offsets */
    Buf var;            /* var width data, 'L' values */
    Py_ssize_t nulls;
} Column;

static inline PyObject *follow(PyObject *row, const Py_ssize_t *path, int depth)
{
    PyObject *v = row;
    for (int i = 0; i < depth; i++) {
        if (v == Py_None)
            return v;
        if (!PyTuple_Check(v)) {
            PyErr_Format(PyExc_TypeError, "expected a tuple on the path, got %.80s", Py_TYPE(v)->tp_name);
            return NULL;
        }
        Py_ssize_t k = path[i];
        if (k >= PyTuple_GET_SIZE(v)) {
            PyErr_Format(PyExc_IndexError, "index %zd out of range for a tuple of %zd", k, PyTuple_GET_SIZE(v));
            return NULL;
        }
        v = PyTuple_GET_ITEM(v, k);
    }
    return v;
}

/* How far ahead (in rows) each level of a row is prefetched: the row tuple itself, the tuples it holds
 * (a transaction's query and response), and the objects those hold (the values). Each level needs the
 * previous one to have arrived, hence the decreasing distances. */
#define PREFETCH_ROW 12
#define PREFETCH_ITEMS 8
#define PREFETCH_VALUES 4

static inline void prefetch_lines(const void *p, size_t size)
{
    for (size_t off = 0; off < size; off += 64)
        __builtin_prefetch((const char *)p + off);
}

/* level 0: the row tuple; 1: the tuples it holds; 2: the objects those tuples hold. */
static void prefetch_tuple(PyObject *row, int level)
{
    if (!PyTuple_Check(row))
        return;
    Py_ssize_t n = PyTuple_GET_SIZE(row);
    if (level == 0) {
        prefetch_lines(row, sizeof(PyTupleObject) + n * sizeof(PyObject *));
        return;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *inner = PyTuple_GET_ITEM(row, k);
        if (!PyTuple_Check(inner))
            continue;
        Py_ssize_t m = PyTuple_GET_SIZE(inner);
        if (level == 1) {
            prefetch_lines(inner, sizeof(PyTupleObject) + m * sizeof(PyObject *));
            continue;
        }
        for (Py_ssize_t j = 0; j < m; j++)
            prefetch_lines(PyTuple_GET_ITEM(inner, j), 64);
    }
}

static int fixed_width(char kind)
{
    switch (kind) {
    case 'q':
    case 'd':
        return 8;
    case 'i':
        return 4;
    default:
        return 0;
    }
}

static int var_width(char kind)
{
    return kind == 's' || kind == 'y' || kind == 'a' || kind == 'L' || kind == 'D';
}

/* Write value v (not None) of row i into column c. */
static int put_value(Column *c, Py_ssize_t i, PyObject *v, int32_t *offsets)
{
    char *data = PyBytes_AS_STRING(c->data);
    switch (c->kind) {
    case 'q': {
        long long x = as_long_long(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        ((int64_t *)data)[i] = (int64_t)x;
        return 0;
    }
    case 'i': {
        long x = as_long(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x < INT32_MIN || x > INT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "value %ld does not fit in int32", x);
            return -1;
        }
        ((int32_t *)data)[i] = (int32_t)x;
        return 0;
    }
    case 'd': {
        double x = PyFloat_AsDouble(v);
        if (x == -1.0 && PyErr_Occurred())
            return -1;
        ((double *)data)[i] = x;
        return 0;
    }
    case 'b': {
        if (!PyBool_Check(v)) {
            PyErr_Format(PyExc_TypeError, "expected a bool, got %.80s", Py_TYPE(v)->tp_name);
            return -1;
        }
        if (v == Py_True)
            data[i >> 3] |= (char)(1 << (i & 7));
        return 0;
    }
    case 's': {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL)
            return -1;
        if (buf_put(&c->var, s, n) < 0)
            return -1;
        break;
    }
    case 'D': {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL)
            return -1;
        if (n == 0)
            break; /* (c->var.p may still be NULL: no pointer arithmetic on it) */
        if (buf_put(&c->var, s, n) < 0) /* room for the name; domain_name writes at most n bytes */
            return -1;
        c->var.len -= n;
        c->var.len += domain_name(s, n, c->var.p + c->var.len);
        break;
    }
    case 'y': {
        if (!PyBytes_Check(v)) {
            PyErr_Format(PyExc_TypeError, "expected bytes, got %.80s", Py_TYPE(v)->tp_name);
            return -1;
        }
        if (buf_put(&c->var, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v)) < 0)
            return -1;
        break;
    }
    case 'a': {
        char text[INET6_ADDRSTRLEN];
        if (!PyBytes_Check(v) || (PyBytes_GET_SIZE(v) != 4 && PyBytes_GET_SIZE(v) != 16)) {
            PyErr_SetString(PyExc_ValueError, "an address must be 4 or 16 bytes");
            return -1;
        }
        Py_ssize_t len;
        if (PyBytes_GET_SIZE(v) == 4) {
            len = ipv4_text((const unsigned char *)PyBytes_AS_STRING(v), text);
        } else {
            len = ipv6_text((const unsigned char *)PyBytes_AS_STRING(v), text);
        }
        if (buf_put(&c->var, text, len) < 0)
            return -1;
        break;
    }
    case 'L': {
        /* A tuple (a list is copied): an item's __index__ is Python code that could change a list under us. */
        PyObject *seq = PySequence_Tuple(v);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(seq);
        for (Py_ssize_t k = 0; k < n; k++) {
            long x = as_long(PyTuple_GET_ITEM(seq, k));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            if (x < INT32_MIN || x > INT32_MAX) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_OverflowError, "value %ld does not fit in int32", x);
                return -1;
            }
            int32_t y = (int32_t)x;
            if (buf_put(&c->var, &y, 4) < 0) {
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(seq);
        break;
    }
    }
    /* variable width: close the value's slot */
    Py_ssize_t end = c->kind == 'L' ? c->var.len / 4 : c->var.len;
    if (end > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "column data over 2 GiB");
        return -1;
    }
    offsets[i + 1] = (int32_t)end;
    return 0;
}

static void free_columns(Column *cols, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(cols[k].fill);
        Py_XDECREF(cols[k].validity);
        Py_XDECREF(cols[k].data);
        PyMem_Free(cols[k].var.p);
    }
    PyMem_Free(cols);
}

static int parse_path(PyObject *path, Py_ssize_t *out, int *depth)
{
    if (!PyTuple_Check(path) || PyTuple_GET_SIZE(path) < 1 || PyTuple_GET_SIZE(path) > MAX_PATH) {
        PyErr_SetString(PyExc_TypeError, "a path is a tuple of 1 to 4 indexes (or a pair of such paths)");
        return -1;
    }
    *depth = (int)PyTuple_GET_SIZE(path);
    for (int i = 0; i < *depth; i++) {
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(path, i));
        if (k == -1 && PyErr_Occurred())
            return -1;
        if (k < 0) {
            PyErr_SetString(PyExc_ValueError, "path indexes must be >= 0");
            return -1;
        }
        out[i] = k;
    }
    return 0;
}

static int parse_spec(PyObject *spec, Column *c)
{
    PyObject *path, *kind;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 || PyTuple_GET_SIZE(spec) > 3) {
        PyErr_SetString(PyExc_TypeError, "a spec is a (path, kind) or (path, kind, fill) tuple");
        return -1;
    }
    path = PyTuple_GET_ITEM(spec, 0);
    kind = PyTuple_GET_ITEM(spec, 1);
    if (PyTuple_GET_SIZE(spec) == 3 && PyTuple_GET_ITEM(spec, 2) != Py_None) {
        c->fill = PyTuple_GET_ITEM(spec, 2);
        Py_INCREF(c->fill);
    }
    if (PyTuple_Check(path) && PyTuple_GET_SIZE(path) == 2 && PyTuple_Check(PyTuple_GET_ITEM(path, 0))) {
        /* two paths: the second is read where the first gives None */
        if (c->fill != NULL) {
            PyErr_SetString(PyExc_ValueError, "a fill value needs a single path");
            return -1;
        }
        if (parse_path(PyTuple_GET_ITEM(path, 0), c->path, &c->depth) < 0 ||
            parse_path(PyTuple_GET_ITEM(path, 1), c->alt, &c->alt_depth) < 0)
            return -1;
    } else if (parse_path(path, c->path, &c->depth) < 0) {
        return -1;
    }
    if (!PyUnicode_Check(kind) || PyUnicode_GET_LENGTH(kind) != 1) {
        PyErr_SetString(PyExc_TypeError, "kind is a one-letter string");
        return -1;
    }
    c->kind = (char)PyUnicode_READ_CHAR(kind, 0);
    if (!fixed_width(c->kind) && !var_width(c->kind) && c->kind != 'b') {
        PyErr_Format(PyExc_ValueError, "unknown kind %c", c->kind);
        return -1;
    }
    return 0;
}

/* Row i's values into the columns; -1 on an error. */
static int put_row(Column *cols, Py_ssize_t ncols, PyObject *row, Py_ssize_t i)
{
    for (Py_ssize_t k = 0; k < ncols; k++) {
        Column *c = &cols[k];
        int32_t *offsets = var_width(c->kind) ? (int32_t *)PyBytes_AS_STRING(c->data) : NULL;
        PyObject *v = follow(row, c->path, c->depth);
        if (v == Py_None && c->alt_depth)
            v = follow(row, c->alt, c->alt_depth);
        if (v == NULL)
            return -1;
        if (v == Py_None && c->fill != NULL && c->depth > 1 && PyTuple_Check(row) &&
            PyTuple_GET_SIZE(row) > c->path[0] && PyTuple_GET_ITEM(row, c->path[0]) != Py_None)
            v = c->fill;
        if (v == Py_None) {
            c->nulls++;
            PyBytes_AS_STRING(c->validity)[i >> 3] &= (char)~(1 << (i & 7));
            if (offsets)
                offsets[i + 1] = offsets[i];
            continue;
        }
        if (put_value(c, i, v, offsets) < 0)
            return -1;
    }
    return 0;
}

static PyObject *extract(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *rows, *specs;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &rows, &specs))
        return NULL;
    PyObject *specs_seq = PySequence_Tuple(specs); /* a copy: a path index's __index__ may change a list */
    if (specs_seq == NULL)
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(specs_seq);
    Py_ssize_t n = PyList_GET_SIZE(rows);
    Py_ssize_t bitmap = (n + 7) / 8;
    PyObject *result = NULL;
    Column *cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Column));
    if (cols == NULL) {
        Py_DECREF(specs_seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < ncols; k++) {
        Column *c = &cols[k];
        if (parse_spec(PyTuple_GET_ITEM(specs_seq, k), c) < 0)
            goto done;
        Py_ssize_t size = fixed_width(c->kind) ? fixed_width(c->kind) * n
                          : c->kind == 'b'     ? bitmap
                                               : 4 * (n + 1);
        if (column_buffers(n, size, &c->data, &c->validity) < 0)
            goto done;
    }
    /* Row-major, so that each row is read while it is in the cache, and with software prefetching:
     * the rows' tuples and the objects they hold are scattered on the heap, and reading them one after
     * the other waits for main memory at every pointer (most of the builder's time). Prefetching a few
     * rows ahead overlaps those waits. */
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Values' __index__ / __float__ are Python code that may change the list: its size is read again
         * for every row, and the row is held while its values are read. */
        if (PyList_GET_SIZE(rows) != n) {
            PyErr_SetString(PyExc_RuntimeError, "extract: rows changed size");
            goto done;
        }
        if (i + PREFETCH_ROW < n)
            prefetch_tuple(PyList_GET_ITEM(rows, i + PREFETCH_ROW), 0);
        if (i + PREFETCH_ITEMS < n)
            prefetch_tuple(PyList_GET_ITEM(rows, i + PREFETCH_ITEMS), 1);
        if (i + PREFETCH_VALUES < n)
            prefetch_tuple(PyList_GET_ITEM(rows, i + PREFETCH_VALUES), 2);
        PyObject *row = Py_NewRef(PyList_GET_ITEM(rows, i));
        int failed = put_row(cols, ncols, row, i);
        Py_DECREF(row);
        if (failed)
            goto done;
    }
    result = PyList_New(ncols);
    for (Py_ssize_t k = 0; result != NULL && k < ncols; k++) {
        Column *c = &cols[k];
        if (set_column_result(result, k, c->nulls, c->validity, c->data, var_width(c->kind), c->var.p, c->var.len) < 0)
            Py_CLEAR(result);
    }
done:
    free_columns(cols, ncols);
    Py_DECREF(specs_seq);
    return result;
}

static PyMethodDef methods[] = {
    {"extract", extract, METH_VARARGS,
     "extract(rows, specs) -> [(null_count, validity, buffers...)]: Arrow buffers for each (path, kind)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "export.parquet._columns", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__columns(void)
{
    return PyModule_Create(&module);
}
