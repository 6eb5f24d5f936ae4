/*
 * sse.h: a streamed token's event bytes in one pass (detokenizer table step, JSON string, SSE
 * event, HTTP/1.1 chunk), for tsfront/serve/core/push.py's native path.
 */
#ifndef TSFRONT_SSE_H
#define TSFRONT_SSE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* token_event(pieces, decoder, tokens, head, tail, errors, framed) -> bytes | None (see
 * module.c for the contract). */
PyObject *py_token_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
