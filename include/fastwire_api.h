/* The C API that probe.decode._fastwire exports to the other extensions (a capsule, the CPython way): the DNS
 * walker, so that a decoder of another input (dnstap: probe/decode/_dnstap.c) fills the DNS part of its message
 * tuples exactly as the packet decoder does, without a Python call per message. */
#ifndef DNSPROBE_FASTWIRE_API_H
#define DNSPROBE_FASTWIRE_API_H

#include <Python.h>

#define FASTWIRE_CAPSULE "probe.decode._fastwire._C_API"
#define FASTWIRE_API_VERSION 1

typedef struct {
    int version; /* FASTWIRE_API_VERSION */
    /* Store the DNS tuple of the message p[0..n) in t[first..first+15) (t: a new tuple whose items there are
     * unset), as parse_message gives it: raw is its raw field (NULL: None); names and max_names as
     * parse_message's (the cache of question names is bounded first). *flags: the header's flags word or -1,
     * *malformed: its malformed flag. -1 with an exception set on a Python error. */
    int (*fill_dns)(PyObject *t, Py_ssize_t first, const unsigned char *p, Py_ssize_t n, PyObject *raw,
                    PyObject *names, Py_ssize_t max_names, long *flags, int *malformed);
} FastwireAPI;

#endif
