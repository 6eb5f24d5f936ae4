/* writer.h: the I/O process's side of the slot region (see writer.c). */
#ifndef TSFRONT_WRITER_H
#define TSFRONT_WRITER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "region.h"

extern PyTypeObject WriterType;

/* For the native turn (turn.c), on a WriterType object, without a Python call: `bind` (1
 * bound, 0 the rid was bound already (the slot then ends with dup_code), -1 MemoryError), a
 * lookup of the rid (1 bound), `wake` (eventfd writes made), the region and its slot count. */
int writer_c_bind(PyObject *w, const uint8_t *rid, uint32_t rid_len, uint32_t slot,
                  uint64_t ticket, int with_logprobs, uint32_t dup_code, int32_t engine_index);
int writer_c_bound(PyObject *w, const uint8_t *rid, uint32_t rid_len);
uint32_t writer_c_wake(PyObject *w);
region_t *writer_c_region(PyObject *w);
uint32_t writer_c_total_slots(PyObject *w);
/* tsfront.errors.WireDecodeError, set by PyInit (module.c). */
extern PyObject *WireDecodeError;

#endif
