/* The text of values and the column buffers declared (and explained) in valuetext.h; their Python references are
 * socket.inet_ntop, domain_name in export/parquet/columns.py and pa.Array.from_buffers. */
#include <Python.h>
#include <string.h>

#include "valuetext.h"

Py_ssize_t ipv4_text(const unsigned char *a, char *out)
{
    char *p = out;
    for (int k = 0; k < 4; k++) {
        unsigned b = a[k];
        if (b >= 100) {
            *p++ = (char)('0' + b / 100);
            b %= 100;
            *p++ = (char)('0' + b / 10);
        } else if (b >= 10) {
            *p++ = (char)('0' + b / 10);
        }
        *p++ = (char)('0' + b % 10);
        if (k < 3)
            *p++ = '.';
    }
    *p = 0;
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
    for (Py_ssize_t k = start; k < n; k++)
        out[k - start] = (s[k] >= 'A' && s[k] <= 'Z') ? (char)(s[k] + 'a' - 'A') : s[k];
    return n - start;
}

int column_buffers(Py_ssize_t n, Py_ssize_t size, PyObject **data, PyObject **validity)
{
    Py_ssize_t bitmap = (n + 7) / 8;
    *data = PyBytes_FromStringAndSize(NULL, size);
    *validity = PyBytes_FromStringAndSize(NULL, bitmap);
    if (*data == NULL || *validity == NULL)
        return -1;
    memset(PyBytes_AS_STRING(*data), 0, size);
    memset(PyBytes_AS_STRING(*validity), 0xff, bitmap);
    return 0;
}

int set_column_result(PyObject *results, Py_ssize_t k, Py_ssize_t nulls, PyObject *validity, PyObject *data,
                      int var_width, const char *var, Py_ssize_t var_len)
{
    PyObject *item, *none_or_validity = nulls ? validity : Py_None;
    if (var_width) {
        PyObject *bytes = PyBytes_FromStringAndSize(var ? var : "", var_len);
        item = bytes ? Py_BuildValue("(nOON)", nulls, none_or_validity, data, bytes) : NULL;
    } else {
        item = Py_BuildValue("(nOO)", nulls, none_or_validity, data);
    }
    if (item == NULL)
        return -1;
    PyList_SET_ITEM(results, k, item);
    return 0;
}
