/* Text of the Parquet columns made in C: addresses as inet_ntop (and so socket.inet_ntop) writes them, without
 * its sprintf, DNS Probe's domain name and an EDNS client subnet; the tuples of values the extensions make. Shared
 * by the column pass over message records (export/parquet/_parquetrec.c), the record decoder, the DNS walker
 * (_fastwire.c), the records module, the answers column and the resolvers table; compiled into each of them
 * (valuetext.c). */
#ifndef DNSPROBE_VALUETEXT_H
#define DNSPROBE_VALUETEXT_H

#include <Python.h>
#include <string.h>

/* Defined in valuetext.c (setup.py UNITS): hidden, so that each extension calls its own copy directly. */
#define VALUETEXT_API __attribute__((visibility("hidden")))

/* Dotted-quad text of an IPv4 address, as inet_ntop writes it, and a NUL (out: room for 16 bytes); returns its
 * length. Written out because glibc's inet_ntop formats through sprintf, which made it a large part of the column
 * pass with four address columns. */
VALUETEXT_API Py_ssize_t ipv4_text(const unsigned char *a, char *out);

/* IPv6 text exactly as glibc's inet_ntop (and so socket.inet_ntop) writes it: lower-case hex groups, the
 * longest run of two or more zero groups (the first of equal runs) as "::", and the last 32 bits as a
 * dotted quad for IPv4-compatible (::a.b.c.d, but not ::1 or ::) and IPv4-mapped (::ffff:a.b.c.d)
 * addresses. Written out because inet_ntop formats through sprintf. tests/export/test_columns.py compares it
 * with socket.inet_ntop. */
VALUETEXT_API Py_ssize_t ipv6_text(const unsigned char *a, char *out);

/* dnswire._ecs for an ECS option value v[0..len) that the walk accepted (wire.h opt_scan): "address/source-prefix"
 * into out (room for 64 bytes); its length, or -1 with an exception. IPv6 text as Python's ipaddress writes it
 * (RFC 5952 with its rules for embedded IPv4, from the module itself where they apply). */
VALUETEXT_API Py_ssize_t ecs_text(const unsigned char *v, size_t len, char *out);

/* A new tuple of n new references (NULL items allowed: then NULL, the others released), taken off the cyclic
 * collector when it holds only atomic values and such tuples (CPython does it lazily, at the first collection
 * that sees it: this saves the collector a pass over every message). */
VALUETEXT_API PyObject *tuple_of(PyObject **v, Py_ssize_t n);

/* tuple_of's untracking, for a tuple filled otherwise. */
VALUETEXT_API void untrack_if_acyclic(PyObject *t);

/* domain_name (export/parquet/columns.py): the QNAME s[0..n) ASCII-lowercased into out, cut to its last two labels when
 * it has at least two dots and no newline before the second-to-last one; else the whole name. This is what the
 * regex replace ^.*\.([^.]*\.[^.]*)$ -> \1 gives (RE2's '.' stops at a newline), at a fraction of its cost.
 * Returns the length written (at most n; 8 bytes a step, so out has room for n). */
VALUETEXT_API Py_ssize_t domain_name(const char *s, Py_ssize_t n, char *out);

#endif
