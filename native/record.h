/*
 * record.h: a request in flight as the I/O core keeps it (tsfront._native.Record; see
 * record.c). A C type so that the native turn (turn.c) makes one without a Python frame.
 */
#ifndef TSFRONT_RECORD_H
#define TSFRONT_RECORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD PyObject *rid; /* bytes */
    PyObject *engine;            /* tsfront.io.engines.Engine */
    PyObject *prefill;           /* the prefill half's engine, or None */
    unsigned long long ticket;
    unsigned long long room;
    char sent, prefill_sent;
} RequestRecord;

extern PyTypeObject RecordType;

/* A new Record (sent false, no prefill half); NULL with an exception. */
PyObject *record_new(PyObject *rid, PyObject *engine, uint64_t ticket);

#endif
