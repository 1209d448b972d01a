/* What the C extensions of dnsprobe write alike: their types' fixed slots and the garbage collector's functions of
 * the types with one reference, the making of a module (with its types and the capsule of its C API), the import of
 * another extension's capsule, the filling of a new tuple or list and the growth of a buffer. One place for them,
 * so that an extension says only what is its own. */
#ifndef DNSPROBE_EXTMODULE_H
#define DNSPROBE_EXTMODULE_H

#include <Python.h>
#include <string.h>

/* A static type's initializer: its C struct, dotted name, flags beside Py_TPFLAGS_DEFAULT (0 or
 * Py_TPFLAGS_HAVE_GC) and doc, then its own slots as designated initializers. */
#define EXT_TYPE(cstruct, dotted, flags, doc, ...)                                                                 \
    {PyVarObject_HEAD_INIT(NULL, 0).tp_name = dotted, .tp_basicsize = sizeof(cstruct),                             \
     .tp_flags = Py_TPFLAGS_DEFAULT | (flags), .tp_doc = doc, __VA_ARGS__}

/* <prefix>_traverse and <prefix>_clear, the tp_traverse and tp_clear of a type of C struct ctype whose one
 * reference that can be part of a cycle is its `field`. */
#define EXT_GC_ONE_REF(prefix, ctype, field)                                                                       \
    static int prefix##_traverse(PyObject *self, visitproc visit, void *arg)                                       \
    {                                                                                                              \
        Py_VISIT(((ctype *)self)->field);                                                                          \
        return 0;                                                                                                  \
    }                                                                                                              \
    static int prefix##_clear(PyObject *self)                                                                      \
    {                                                                                                              \
        Py_CLEAR(((ctype *)self)->field);                                                                          \
        return 0;                                                                                                  \
    }

/* The module `name` with its doc and methods (either may be NULL), each type of the NULL-ended types (or NULL)
 * readied and added under the last part of its name (PyModule_AddType), and, where api is not NULL, api as the
 * capsule named `capsule`: "<name>.<attribute>", the attribute it is under, as PyCapsule_Import finds it. One
 * module a process (m_size -1, as every extension here keeps its state in statics). NULL with an exception. */
static inline PyObject *ext_module(const char *name, const char *doc, PyMethodDef *methods,
                                   PyTypeObject *const *types, const char *capsule, void *api)
{
    static struct PyModuleDef def = {.m_base = PyModuleDef_HEAD_INIT, .m_size = -1};
    def.m_name = name;
    def.m_doc = doc;
    def.m_methods = methods;
    PyObject *m = PyModule_Create(&def);
    for (int k = 0; m != NULL && types != NULL && types[k] != NULL; k++)
        if (PyModule_AddType(m, types[k]) < 0)
            Py_CLEAR(m);
    if (m != NULL && api != NULL) {
        PyObject *cap = PyCapsule_New(api, capsule, NULL);
        if (cap == NULL || PyModule_AddObject(m, strrchr(capsule, '.') + 1, cap) < 0) {
            Py_XDECREF(cap);
            Py_CLEAR(m);
        }
    }
    return m;
}

/* The pointer in the capsule `capsule` of the extension `module`, or NULL with an exception. (PyCapsule_Import
 * imports only the first part of the name before Python 3.12: the module is imported first.) */
static inline void *ext_import_capsule(const char *module, const char *capsule)
{
    PyObject *mod = PyImport_ImportModule(module);
    if (mod == NULL)
        return NULL;
    Py_DECREF(mod);
    return PyCapsule_Import(capsule, 0);
}

/* Item k of *seq, a new tuple or list being filled, set to v (a new reference); *seq cleared when v is NULL (an
 * exception set), which ends the loops that fill one (`seq != NULL && k < n`). */
static inline void ext_set_item(PyObject **seq, Py_ssize_t k, PyObject *v)
{
    if (v == NULL)
        Py_CLEAR(*seq);
    else if (PyList_Check(*seq))
        PyList_SET_ITEM(*seq, k, v);
    else
        PyTuple_SET_ITEM(*seq, k, v);
}

/* p reallocated for `need` units of `unit` bytes, its capacity (*cap, in units) doubled from `first`; NULL (a
 * MemoryError set, p still valid and *cap unchanged) when there is no memory. */
static inline void *ext_grow(void *p, size_t *cap, size_t need, size_t unit, size_t first)
{
    size_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    void *q = PyMem_Realloc(p, n * unit);
    if (q == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *cap = n;
    return q;
}

#endif
