/* The text of values and the tuples declared (and explained) in valuetext.h; their Python
 * references are socket.inet_ntop, domain_name in export/parquet/columns.py and dnswire._ecs. */
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "valuetext.h"

Py_ssize_t ipv4_text(const unsigned char *a, char *out)
{
    /* Each byte as three digits and a dot in a register, stored from its first significant digit on: no branch a
     * byte to mispredict (the addresses of a column vary). The last dot becomes the NUL. */
    char *p = out;
    for (int k = 0; k < 4; k++) {
        uint32_t b = a[k], skip = (b < 100) + (b < 10);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint32_t text = ('0' + b / 100) | ('0' + b / 10 % 10) << 8 | ('0' + b % 10) << 16 | (uint32_t)'.' << 24;
        text >>= 8 * skip;
#else
        uint32_t text = ('0' + b / 100) << 24 | ('0' + b / 10 % 10) << 16 | ('0' + b % 10) << 8 | (uint32_t)'.';
        text <<= 8 * skip;
#endif
        memcpy(p, &text, 4);
        p += 4 - skip;
    }
    *--p = 0;
    return p - out;
}

Py_ssize_t ipv6_text(const unsigned char *a, char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned w[8];
    int best = -1, best_len = 0, cur = -1, cur_len = 0;
    for (int i = 0; i < 8; i++) {
        w[i] = (unsigned)a[2 * i] << 8 | a[2 * i + 1];
        if (w[i] == 0) {
            if (cur < 0)
                cur = i, cur_len = 0;
            if (++cur_len > best_len)
                best = cur, best_len = cur_len;
        } else {
            cur = -1;
        }
    }
    if (best_len < 2)
        best = -1;
    char *p = out;
    for (int i = 0; i < 8; i++) {
        if (best >= 0 && i >= best && i < best + best_len) {
            if (i == best)
                *p++ = ':';
            continue;
        }
        if (i != 0)
            *p++ = ':';
        if (i == 6 && best == 0 && (best_len == 6 || (best_len == 5 && w[5] == 0xffff))) {
            p += ipv4_text(a + 12, p);
            return p - out;
        }
        int started = 0;
        for (int shift = 12; shift >= 0; shift -= 4) {
            unsigned d = (w[i] >> shift) & 0xF;
            if (d || started || shift == 0) {
                *p++ = hex[d];
                started = 1;
            }
        }
    }
    if (best >= 0 && best + best_len == 8)
        *p++ = ':';
    *p = 0;
    return p - out;
}

/* x with its ASCII upper-case letters in lower case, 8 bytes at once: a byte's high bit says, in ge_a whether its
 * low 7 bits are 'A' or over, in gt_z whether they are over 'Z' (no carry leaves a byte: 0x7f + 0x3f < 0x100). */
static inline uint64_t ascii_lower8(uint64_t x)
{
    uint64_t low7 = x & 0x7f7f7f7f7f7f7f7full;
    uint64_t ge_a = low7 + 0x3f3f3f3f3f3f3f3full, gt_z = low7 + 0x2525252525252525ull;
    uint64_t upper = ge_a & ~gt_z & ~x & 0x8080808080808080ull;
    return x | upper >> 2;
}

Py_ssize_t domain_name(const char *s, Py_ssize_t n, char *out)
{
    Py_ssize_t last = -1, second = -1;
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        if (s[k] == '.') {
            if (last < 0) {
                last = k;
            } else {
                second = k;
                break;
            }
        }
    }
    Py_ssize_t start = 0;
    if (second >= 0 && memchr(s, '\n', second) == NULL)
        start = second + 1;
    const char *from = s + start;
    Py_ssize_t len = n - start, k = 0;
    uint64_t x;
    for (; k + 8 <= len; k += 8) {
        memcpy(&x, from + k, 8);
        x = ascii_lower8(x);
        memcpy(out + k, &x, 8);
    }
    if (k < len && len >= 8) { /* the last 8 bytes again, overlapping */
        memcpy(&x, from + len - 8, 8);
        x = ascii_lower8(x);
        memcpy(out + len - 8, &x, 8);
    } else {
        for (; k < len; k++)
            out[k] = (from[k] >= 'A' && from[k] <= 'Z') ? (char)(from[k] + 'a' - 'A') : from[k];
    }
    return len;
}

/* Whether an IPv6 address is in ::/96 or ::ffff:0:0/96, where texts of it differ (see ecs_text). */
static int embeds_ipv4(const unsigned char *a)
{
    static const unsigned char zero[10] = {0};
    return memcmp(a, zero, 10) == 0 && ((a[10] == 0 && a[11] == 0) || (a[10] == 0xff && a[11] == 0xff));
}

Py_ssize_t ecs_text(const unsigned char *v, size_t len, char *out)
{
    static PyObject *ipv6_address; /* ipaddress.IPv6Address, imported at first use */
    unsigned family = (unsigned)v[0] << 8 | v[1], source = v[2];
    unsigned char addr[16] = {0};
    memcpy(addr, v + 4, len - 4);
    if (family == 1)
        return sprintf(out, "%u.%u.%u.%u/%u", addr[0], addr[1], addr[2], addr[3], source);
    /* Outside ::/96 and ::ffff:0:0/96, inet_ntop's text is Python's (RFC 5952: lower-case groups, the first
     * longest run of two or more zero groups as "::"), and costs a hundredth of a call into ipaddress. */
    if (!embeds_ipv4(addr)) {
        Py_ssize_t n = ipv6_text(addr, out);
        return n + sprintf(out + n, "/%u", source);
    }
    /* There the last 32 bits may be written dotted, and Python's versions differ: the ipaddress module's text. */
    if (ipv6_address == NULL) {
        PyObject *mod = PyImport_ImportModule("ipaddress");
        ipv6_address = mod ? PyObject_GetAttrString(mod, "IPv6Address") : NULL;
        Py_XDECREF(mod);
        if (ipv6_address == NULL)
            return -1;
    }
    PyObject *packed = PyBytes_FromStringAndSize((const char *)addr, 16);
    PyObject *obj = packed ? PyObject_CallOneArg(ipv6_address, packed) : NULL;
    PyObject *text = obj ? PyObject_Str(obj) : NULL;
    Py_XDECREF(packed);
    Py_XDECREF(obj);
    Py_ssize_t n = -1;
    const char *s = text ? PyUnicode_AsUTF8AndSize(text, &n) : NULL;
    if (s != NULL && n > 48)
        PyErr_SetString(PyExc_ValueError, "unexpected IPv6 address text");
    if (s != NULL && n <= 48) {
        memcpy(out, s, n);
        n += sprintf(out + n, "/%u", source);
    } else {
        n = -1;
    }
    Py_XDECREF(text);
    return n;
}

static int acyclic(PyObject *o)
{
    return o == Py_None || PyLong_CheckExact(o) || PyUnicode_CheckExact(o) || PyBytes_CheckExact(o)
           || PyBool_Check(o) || (PyTuple_CheckExact(o) && !PyObject_GC_IsTracked(o));
}

void untrack_if_acyclic(PyObject *t)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++) {
        if (!acyclic(PyTuple_GET_ITEM(t, i)))
            return;
    }
    PyObject_GC_UnTrack(t);
}

PyObject *tuple_of(PyObject **v, Py_ssize_t n)
{
    PyObject *t = PyTuple_New(n);
    int bad = t == NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        bad |= v[i] == NULL;
        if (t != NULL)
            PyTuple_SET_ITEM(t, i, v[i]);
        else
            Py_XDECREF(v[i]);
    }
    if (bad) {
        Py_XDECREF(t);
        return NULL;
    }
    untrack_if_acyclic(t);
    return t;
}
