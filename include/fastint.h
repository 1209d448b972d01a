/* Reading a Python int as a C integer without a call into libpython for the usual values.
 *
 * Why: the column, matching and C-DNS loops read tens of ints per transaction; PyLong_AsLongLong and
 * friends are calls with several checks each, a visible part of those loops. Almost all of these ints are
 * "compact" (one 30-bit digit): their value is read inline here. Anything else (big, negative beyond a
 * digit, subclasses, objects with __index__) goes to the libpython call the loops used before, so the
 * results and errors are the same. */
#ifndef DNSPROBE_FASTINT_H
#define DNSPROBE_FASTINT_H

#include <Python.h>

/* 1 and *out = the value when o is an exact int of at most one digit, else 0 (nothing set). */
static inline int compact_int(PyObject *o, long long *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
        return 0;
    *out = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1)
        return 0;
    *out = size * (long long)((PyLongObject *)o)->ob_digit[0];
    return 1;
#endif
}

/* PyLong_AsLongLong with the compact fast path. */
static inline long long as_long_long(PyObject *o)
{
    long long v;
    return compact_int(o, &v) ? v : PyLong_AsLongLong(o);
}

/* PyLong_AsLong with the compact fast path. */
static inline long as_long(PyObject *o)
{
    long long v;
    return compact_int(o, &v) ? (long)v : PyLong_AsLong(o);
}

#endif
