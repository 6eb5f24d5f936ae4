/*
 * prefix.h: chained hashes of a prompt's token blocks, for prefix-affinity routing.
 *
 * Two sources, one hash: the ADD payload's msgpack input_ids (the I/O process, for a worker
 * that sent no hashes) and a worker's list of ids (sent along with its ADD, so the I/O
 * process only looks the hashes up). Decoding the payload in Python would cost ~20 us per
 * 1,000 tokens.
 */
#ifndef TSFRONT_PREFIX_H
#define TSFRONT_PREFIX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* block_hashes(payload, granularity, limit) -> list[int] (see module.c for the contract). */
PyObject *py_block_hashes(PyObject *self, PyObject *args);

/* packed_block_hashes(ids, granularity, limit) -> bytes: the same hashes of a list of ids,
 * as u64 granularity then one native-endian u64 per block (what a worker sends along). */
PyObject *py_packed_block_hashes(PyObject *self, PyObject *args);

#endif
