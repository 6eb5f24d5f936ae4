/* tsfront._native: placeholder until the ring code lands. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *abi_version(PyObject *self, PyObject *args) { return PyLong_FromLong(1); }

static PyMethodDef methods[] = {
    {"abi_version", abi_version, METH_NOARGS, "Version of the shared-memory layout."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tsfront._native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
