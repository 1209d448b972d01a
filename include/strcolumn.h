/* Arrow string columns (int32 offsets, UTF-8) read and written by the lookups over a record table's columns
 * (export/_lookup.c, export/enrich/_psl.c), so that they walk a column's buffers once instead of having Arrow
 * find its distinct values and spread results back.
 *
 * In:  (length, offset, [validity or None, offsets, data or None]) as pyarrow gives them (Array.buffers());
 *      every row's bounds are checked against the buffers, so a bad set of buffers is a ValueError.
 * Out: (null_count, validity or None, offsets, data) as bytes, for pa.Array.from_buffers (export/lookup.py). */
#ifndef DNSPROBE_STRCOLUMN_H
#define DNSPROBE_STRCOLUMN_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "extmodule.h"

typedef struct {
    Py_ssize_t n, offset;
    const uint8_t *validity; /* NULL: no nulls */
    const int32_t *offsets;
    const char *data;
    Py_ssize_t data_len;
    Py_buffer views[3];
    int held[3];
} TextIn;

static inline void textin_close(TextIn *in)
{
    for (int k = 0; k < 3; k++) {
        if (in->held[k])
            PyBuffer_Release(&in->views[k]);
        in->held[k] = 0;
    }
}

/* Open the buffers of a string column; -1 with an exception set (and nothing held) when they do not fit. */
static inline int textin_open(TextIn *in, Py_ssize_t n, Py_ssize_t offset, PyObject *buffers)
{
    memset(in, 0, sizeof *in);
    if (n < 0 || offset < 0) {
        PyErr_SetString(PyExc_ValueError, "negative length or offset");
        return -1;
    }
    /* The last offset read, offset + n; past PY_SSIZE_T_MAX / 4 no buffer holds the offsets up to it, and end + 1
     * and end + 7 below stay in range (a signed overflow there let any length through). */
    Py_ssize_t end;
    if (__builtin_add_overflow(offset, n, &end) || end >= PY_SSIZE_T_MAX / 4) {
        PyErr_SetString(PyExc_ValueError, "string column length + offset too large");
        return -1;
    }
    if (!PyList_Check(buffers) || PyList_GET_SIZE(buffers) != 3) {
        PyErr_SetString(PyExc_TypeError, "buffers must be a list [validity, offsets, data]");
        return -1;
    }
    in->n = n;
    in->offset = offset;
    for (int k = 0; k < 3; k++) {
        PyObject *b = PyList_GET_ITEM(buffers, k);
        if (b == Py_None)
            continue;
        if (PyObject_GetBuffer(b, &in->views[k], PyBUF_SIMPLE) < 0) {
            textin_close(in);
            return -1;
        }
        in->held[k] = 1;
    }
    if (!in->held[1] || in->views[1].len / 4 < end + 1 ||
        (in->held[0] && n && in->views[0].len < (end + 7) / 8)) {
        textin_close(in);
        PyErr_SetString(PyExc_ValueError, "string column buffers shorter than the column");
        return -1;
    }
    in->validity = in->held[0] ? in->views[0].buf : NULL;
    in->offsets = in->views[1].buf;
    in->data = in->held[2] ? in->views[2].buf : "";
    in->data_len = in->held[2] ? in->views[2].len : 0;
    return 0;
}

/* Row i: 1 and its text, 0 for a null, -1 (ValueError set) when its offsets leave the data. */
static inline int textin_get(const TextIn *in, Py_ssize_t i, const char **s, Py_ssize_t *len)
{
    Py_ssize_t j = in->offset + i;
    if (in->validity != NULL && !(in->validity[j >> 3] & (1 << (j & 7))))
        return 0;
    int32_t a = in->offsets[j], b = in->offsets[j + 1];
    if (a < 0 || b < a || b > in->data_len) {
        PyErr_SetString(PyExc_ValueError, "string column offsets out of bounds");
        return -1;
    }
    *s = in->data + a;
    *len = b - a;
    return 1;
}

typedef struct {
    Py_ssize_t n, nulls;
    PyObject *offsets, *validity; /* bytes of their final size (validity: made at the first null) */
    int32_t *off;
    char *data;
    size_t len, cap;
} TextOut;

static inline int textout_init(TextOut *out, Py_ssize_t n)
{
    memset(out, 0, sizeof *out);
    out->n = n;
    out->offsets = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
    if (out->offsets == NULL)
        return -1;
    out->off = (int32_t *)PyBytes_AS_STRING(out->offsets);
    out->off[0] = 0;
    return 0;
}

static inline void textout_free(TextOut *out)
{
    Py_CLEAR(out->offsets);
    Py_CLEAR(out->validity);
    PyMem_Free(out->data);
    out->data = NULL;
}

static inline int textout_room(TextOut *out, size_t more)
{
    if (out->len + more <= out->cap)
        return 0;
    if (out->len + more > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "column data over 2 GiB");
        return -1;
    }
    char *p = ext_grow(out->data, &out->cap, out->len + more, 1, 1 << 12);
    if (p == NULL)
        return -1;
    out->data = p;
    return 0;
}

/* Row i (rows are written in order) ← s[0..len). */
static inline int textout_put(TextOut *out, Py_ssize_t i, const char *s, size_t len)
{
    if (len) {
        if (textout_room(out, len) < 0)
            return -1;
        memcpy(out->data + out->len, s, len);
        out->len += len;
    }
    out->off[i + 1] = (int32_t)out->len;
    return 0;
}

/* Row i (in order) ← null. */
static inline int textout_null(TextOut *out, Py_ssize_t i)
{
    if (out->validity == NULL) {
        Py_ssize_t bytes = (out->n + 7) / 8;
        out->validity = PyBytes_FromStringAndSize(NULL, bytes);
        if (out->validity == NULL)
            return -1;
        memset(PyBytes_AS_STRING(out->validity), 0xff, bytes);
    }
    PyBytes_AS_STRING(out->validity)[i >> 3] &= (char)~(1 << (i & 7));
    out->nulls++;
    out->off[i + 1] = (int32_t)out->len;
    return 0;
}

/* (null_count, validity or None, offsets, data); the column is given away (textout_free after either way). */
static inline PyObject *textout_finish(TextOut *out)
{
    PyObject *data = PyBytes_FromStringAndSize(out->data ? out->data : "", (Py_ssize_t)out->len);
    if (data == NULL)
        return NULL;
    return Py_BuildValue("(nOON)", out->nulls, out->validity ? out->validity : Py_None, out->offsets, data);
}

/* 64-bit hashing of short texts (addresses, labels): 8 bytes at a time, shorter texts read as wyhash reads
 * them (never a byte outside the text), one multiply-xorshift round per word. For hash tables, not for a
 * digest: equal hashes are always compared by content. */
static inline uint64_t text_hash(const char *s, size_t n, uint64_t seed)
{
    const uint64_t k1 = 0x9e3779b97f4a7c15ULL, k2 = 0xbf58476d1ce4e5b9ULL;
    uint64_t w, h = seed ^ ((uint64_t)n * 0x94d049bb133111ebULL + 1);
    if (n >= 8) {
        size_t k = 0;
        for (; k + 8 <= n; k += 8) {
            memcpy(&w, s + k, 8);
            h = (h ^ w) * k1;
            h ^= h >> 31;
        }
        if (k < n) {
            memcpy(&w, s + n - 8, 8);
            h = (h ^ w) * k1;
            h ^= h >> 31;
        }
    } else if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        h = (h ^ ((uint64_t)a << 32 | b)) * k1;
        h ^= h >> 31;
    } else if (n > 0) {
        w = (uint64_t)(unsigned char)s[0] << 16 | (uint64_t)(unsigned char)s[n >> 1] << 8 | (unsigned char)s[n - 1];
        h = (h ^ w) * k1;
        h ^= h >> 31;
    }
    h *= k2;
    return h ^ (h >> 29);
}

/* Whether a[0..n) and b[0..n) are equal: short texts without a call to memcmp. */
static inline int text_eq(const char *a, const char *b, size_t n)
{
    if (n >= 8) {
        uint64_t x, y;
        for (size_t k = 0; k + 8 <= n; k += 8) {
            memcpy(&x, a + k, 8);
            memcpy(&y, b + k, 8);
            if (x != y)
                return 0;
        }
        memcpy(&x, a + n - 8, 8);
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        uint32_t x1, y1, x2, y2;
        memcpy(&x1, a, 4);
        memcpy(&y1, b, 4);
        memcpy(&x2, a + n - 4, 4);
        memcpy(&y2, b + n - 4, 4);
        return x1 == y1 && x2 == y2;
    }
    for (size_t k = 0; k < n; k++) {
        if (a[k] != b[k])
            return 0;
    }
    return 1;
}

#endif
