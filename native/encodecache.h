/*
 * encodecache.h: token ids of prompt prefixes, shared by every worker (see encodecache.c).
 *
 * A prompt's text is cut at its anchors (added tokens the tokenizer always splits at, chosen by
 * tsfront.text.encode_cache); the ids of the text up to an anchor's end do not depend on what
 * follows it, so they are stored once and reused by any worker for any prompt that starts with
 * the same text. The store is one shared region (made by the master, mapped by every worker):
 * an index of seqlocked slots and an arena of records written in a ring.
 */
#ifndef TSFRONT_ENCODECACHE_H
#define TSFRONT_ENCODECACHE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject EncodeCacheType;

/* anchor_ends(data, anchors) -> (ends, which): see module.c. */
PyObject *py_anchor_ends(PyObject *self, PyObject *args);

/* encode_cache_format(buffer, seed) -> None: lays a fresh store out in a zeroed buffer. */
PyObject *py_encode_cache_format(PyObject *self, PyObject *args);

#endif
