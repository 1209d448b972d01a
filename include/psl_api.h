/* What export.enrich._psl gives the other extensions (its capsule PSL_CAPSULE): the registered domain of one
 * QNAME, so that export._topk finds the registered domains of a table's distinct QNAMEs without a column. */
#ifndef DNSPROBE_PSL_API_H
#define DNSPROBE_PSL_API_H

#include <Python.h>

typedef struct {
    PyTypeObject *rules_type; /* export.enrich._psl.SuffixRules */
    /* The registered domain of the QNAME s[0..n) (UTF-8) as SuffixRules.columns gives it ("" when none) at *out,
     * valid until the next call with these rules; its length, or -1 with an exception. */
    Py_ssize_t (*registered_domain)(PyObject *rules, const char *s, Py_ssize_t n, const char **out);
} PslApi;

#define PSL_CAPSULE "export.enrich._psl.api"

#endif
