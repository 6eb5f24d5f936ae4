/* writer.h: the I/O process's side of the slot region (see writer.c). */
#ifndef TSFRONT_WRITER_H
#define TSFRONT_WRITER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject WriterType;
/* tsfront.errors.WireDecodeError, set by PyInit (module.c). */
extern PyObject *WireDecodeError;

#endif
