/*
 * push.h: the drain's native dispatch of pushed plain tokens (tsfront/serve/core/push.py's
 * `Pusher` base, tsfront/client/stream.py's `deliver_all`).
 */
#ifndef TSFRONT_PUSH_H
#define TSFRONT_PUSH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject PusherBaseType;
extern PyTypeObject ConnectionBaseType;

/* push_batch(updates, refs) -> list: see push.c. */
PyObject *py_push_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
