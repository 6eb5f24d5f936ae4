/*
 * push.c: the drain's common case in one native pass (tsfront/client/stream.py `deliver_all`).
 *
 * A streamed token of a response on the push path's native step (tsfront/serve/core/push.py) used
 * to go: the drain's loop, the stream's weak reference, `RequestStream.deliver` and its checks,
 * the sink (`Pusher.__call__`) and its checks, `token_event`, the count of the choice's
 * tokens and the transport's write; each a Python frame or a handful of Python bytecodes.
 * `push_batch` does exactly that sequence for every update of a `Reader.poll` batch that
 * takes it, and returns the updates that do not, for `RequestStream.deliver` to take as
 * before. An update is taken here only when every check that `deliver` and `Pusher.__call__`
 * make before the native write passes:
 *   - its slot's stream is alive (the slot table's weak reference, by local slot);
 *   - the stream's ``_push`` (its sink while the reader is parked with nothing unread) is a
 *     `PusherBase` (a `Pusher`) with a native cycle (``_cycle`` not None);
 *   - the update carries tokens, no logprobs, no finish code;
 *   - the stream's waiter is not done (a cancelled reader);
 *   - the pusher has no send in flight and no error (``inflight``, ``error``);
 *   - its connection's flow control is not paused, the client not gone, the response not
 *     complete (``flow.write_paused``, ``cycle.disconnected``, ``cycle.response_complete``).
 * Then, as `deliver` and `Pusher.__call__`: the stream's ``engine_index`` is set, the event's
 * chunk made by `token_event`, the choice's ``tokens`` count raised, and the chunk written to
 * ``cycle.transport`` (an `Exception` from the write is the pusher's ``error``, as there).
 *
 * The write itself: when ``cycle.transport`` is the connection's own transport (the pusher's
 * ``_sock``, a plain TCP transport; not while tsfront serve's head writer stands in front of
 * it), that transport has nothing buffered (``get_write_buffer_size() == 0``) and is not
 * closing, the chunk is sent on its socket (``_fd``) here, one ``send``, which is what the
 * transport's own write does first in that state (uvloop's and asyncio's alike) less its
 * bookkeeping (~0.5-0.8 µs an event, docs/PERFORMANCE.md). Whatever that send did not take
 * (a partial send, EAGAIN, an error) goes to ``transport.write``, which buffers it or meets the
 * error and handles it as it always does, so the bytes keep their order and a broken
 * connection is still the transport's to report. The transport object is held by the pusher
 * and is open while not closing, so the descriptor is its own, not a reused number.
 *
 * A connection known clean (tsfront serve's own protocol): when the pusher's ``_sock`` is a
 * `ConnectionBase` (tsfront/serve/edge/transport.py's `ConnectionTransport`, the transport that
 * tsfront serve's protocol hands to uvicorn) whose ``_clean`` is set, the checks of the
 * cycle, its flow control and the transport (``write_paused``, ``disconnected``,
 * ``response_complete``, the cycle's transport, ``get_write_buffer_size``, ``is_closing``)
 * are skipped: they held when the flag was set and nothing that could change them has
 * happened since. The invariant: ``_clean`` is set only here, right after a direct send that
 * took the whole event with every one of those checks passed; it is cleared by every write,
 * close, abort, end-of-write or change of protocol through that transport (the only way
 * anything but this pass writes to the connection: uvicorn and the response's task alike), by
 * the protocol's ``pause_writing`` (belt and braces: a pause needs something held, which only
 * a write that cleared the flag can leave) and ``connection_lost`` (the transport closes the
 * socket only after ``connection_lost`` returns, uvloop's and asyncio's alike, so the
 * descriptor is still the connection's while the flag is set), and here by a send that did
 * not take the whole event.
 * So while it is set the transport holds nothing, is not paused, and the response is
 * streaming: a send is what the checks and the transport's own write would do. The stream's
 * checks (its ``_push``, its waiter) are made for every update, clean or not.
 * Anything that fails or raises before the tokens are consumed (an attribute missing, the
 * native step refusing its arguments) leaves the update to `deliver`, which makes the same
 * calls and so meets the same failure where the Python path handles it (the sink logged and
 * dropped). The updates not taken keep their order; an update taken here and one left to
 * `deliver` are of different slots (a poll names a slot at most once), so of different
 * responses: the order of events on each connection is the Python path's.
 */
#include "push.h"

#include <structmember.h>
#include <sys/socket.h>

#include "sse.h"

typedef struct {
    PyObject_HEAD PyObject *cycle; /* the uvicorn cycle (None/NULL: no native step) */
    PyObject *flow;
    PyObject *pieces;
    PyObject *decoder;
    PyObject *errors;
    PyObject *head;
    PyObject *tail;
    PyObject *choice;
    PyObject *inflight;
    PyObject *error;
    PyObject *sock;     /* the connection's own transport, for the direct send (NULL/None: none) */
    int fd;             /* its socket's descriptor (< 0: no direct send) */
    Py_ssize_t direct;  /* events this sink sent on the socket itself (whole or in part) */
} PusherBase;

static int pb_traverse(PusherBase *self, visitproc visit, void *arg) {
    Py_VISIT(self->cycle);
    Py_VISIT(self->flow);
    Py_VISIT(self->pieces);
    Py_VISIT(self->decoder);
    Py_VISIT(self->errors);
    Py_VISIT(self->head);
    Py_VISIT(self->tail);
    Py_VISIT(self->choice);
    Py_VISIT(self->inflight);
    Py_VISIT(self->error);
    Py_VISIT(self->sock);
    return 0;
}

static int pb_clear(PusherBase *self) {
    Py_CLEAR(self->cycle);
    Py_CLEAR(self->flow);
    Py_CLEAR(self->pieces);
    Py_CLEAR(self->decoder);
    Py_CLEAR(self->errors);
    Py_CLEAR(self->head);
    Py_CLEAR(self->tail);
    Py_CLEAR(self->choice);
    Py_CLEAR(self->inflight);
    Py_CLEAR(self->error);
    Py_CLEAR(self->sock);
    return 0;
}

static void pb_dealloc(PusherBase *self) {
    PyObject_GC_UnTrack(self);
    pb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pb_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PusherBase *self = (PusherBase *)PyType_GenericNew(type, args, kwds);
    if (self) self->fd = -1;
    return (PyObject *)self;
}

static PyMemberDef pb_members[] = {
    {"_cycle", T_OBJECT, offsetof(PusherBase, cycle), 0, NULL},
    {"_flow", T_OBJECT, offsetof(PusherBase, flow), 0, NULL},
    {"_pieces", T_OBJECT, offsetof(PusherBase, pieces), 0, NULL},
    {"_decoder", T_OBJECT, offsetof(PusherBase, decoder), 0, NULL},
    {"_errors", T_OBJECT, offsetof(PusherBase, errors), 0, NULL},
    {"_head", T_OBJECT, offsetof(PusherBase, head), 0, NULL},
    {"_tail", T_OBJECT, offsetof(PusherBase, tail), 0, NULL},
    {"_choice", T_OBJECT, offsetof(PusherBase, choice), 0, NULL},
    {"inflight", T_OBJECT, offsetof(PusherBase, inflight), 0,
     "The task finishing a send that the server suspended (back-pressure), or None."},
    {"error", T_OBJECT, offsetof(PusherBase, error), 0,
     "What a pushed send raised (a broken connection): the response ends with it."},
    {"_sock", T_OBJECT, offsetof(PusherBase, sock), 0, NULL},
    {"_fd", T_INT, offsetof(PusherBase, fd), 0, NULL},
    {"direct_sends", T_PYSSIZET, offsetof(PusherBase, direct), READONLY,
     "Events the drain's native pass sent on the connection's socket itself."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject PusherBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.PusherBase",
    .tp_basicsize = sizeof(PusherBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state push_batch reads of a streamed choice's sink (tsfront.serve.core.push.Pusher).",
    .tp_new = pb_new,
    .tp_traverse = (traverseproc)pb_traverse,
    .tp_clear = (inquiry)pb_clear,
    .tp_dealloc = (destructor)pb_dealloc,
    .tp_members = pb_members,
};

typedef struct {
    PyObject_HEAD int clean; /* see the invariant in this file's doc */
    Py_ssize_t clean_sends;  /* events sent with the checks skipped */
} ConnectionBase;

static PyMemberDef cb_members[] = {
    {"_clean", T_BOOL, offsetof(ConnectionBase, clean), 0, NULL},
    {"clean_sends", T_PYSSIZET, offsetof(ConnectionBase, clean_sends), READONLY,
     "Events the drain's native pass sent on this connection with its checks skipped."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject ConnectionBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.ConnectionBase",
    .tp_basicsize = sizeof(ConnectionBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The write state push_batch reads of a connection's transport "
              "(tsfront.serve.edge.transport.ConnectionTransport).",
    .tp_new = PyType_GenericNew,
    .tp_members = cb_members,
};

/* The pusher's connection when it keeps the clean flag, else NULL (borrowed). */
static inline ConnectionBase *connection_of(PusherBase *p) {
    PyObject *sock = p->sock;
    if (!sock || p->fd < 0 || !PyObject_TypeCheck(sock, &ConnectionBaseType)) return NULL;
    return (ConnectionBase *)sock;
}

static PyObject *S_BUFFERED, *S_IS_CLOSING;
static PyObject *S_PUSH, *S_WAITER, *S_DONE, *S_ENGINE_INDEX, *S_TOKENS, *S_WRITE_PAUSED,
    *S_DISCONNECTED, *S_RESPONSE_COMPLETE, *S_TRANSPORT, *S_WRITE;

static int intern_names(void) {
    if (S_WRITE) return 0;
#define INTERN(var, s) \
    if (!(var = PyUnicode_InternFromString(s))) return -1
    INTERN(S_PUSH, "_push");
    INTERN(S_WAITER, "_waiter");
    INTERN(S_DONE, "done");
    INTERN(S_ENGINE_INDEX, "engine_index");
    INTERN(S_TOKENS, "tokens");
    INTERN(S_WRITE_PAUSED, "write_paused");
    INTERN(S_DISCONNECTED, "disconnected");
    INTERN(S_RESPONSE_COMPLETE, "response_complete");
    INTERN(S_TRANSPORT, "transport");
    INTERN(S_WRITE, "write");
    INTERN(S_BUFFERED, "get_write_buffer_size");
    INTERN(S_IS_CLOSING, "is_closing");
#undef INTERN
    return 0;
}

static inline int is_none(PyObject *o) { return o == NULL || o == Py_None; }

/* The truth of a new reference, which it releases: 1 true; 0 false; -1 an error (set), also
 * when v is NULL (the call that made it failed). */
static int truth(PyObject *v) {
    if (!v) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* obj.name's truth. */
static inline int attr_true(PyObject *obj, PyObject *name) {
    return truth(PyObject_GetAttr(obj, name));
}

/* obj.name()'s truth. */
static inline int call_true(PyObject *obj, PyObject *name) {
    return truth(PyObject_CallMethodNoArgs(obj, name));
}

/* What a send of ``chunk`` did not take (``n`` bytes of it sent, or none: n <= 0) through the
 * transport's write, which buffers it or meets the send's error again. What that write
 * returns, or NULL with an error set. */
static PyObject *write_rest(PyObject *transport, PyObject *chunk, ssize_t n) {
    if (n <= 0) return PyObject_CallMethodOneArg(transport, S_WRITE, chunk);
    PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(chunk) + n,
                                               PyBytes_GET_SIZE(chunk) - n);
    if (!rest) return NULL;
    PyObject *res = PyObject_CallMethodOneArg(transport, S_WRITE, rest);
    Py_DECREF(rest);
    return res;
}

/* One send of the whole chunk on the pusher's socket, counted when it took any of it: what
 * send returned (the bytes taken, or -1). */
static inline ssize_t send_chunk(PusherBase *p, PyObject *chunk) {
    ssize_t n = send(p->fd, PyBytes_AS_STRING(chunk), (size_t)PyBytes_GET_SIZE(chunk),
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) p->direct++;
    return n;
}

/* The chunk written to the connection's own transport: sent on its socket here while the
 * transport holds nothing and is open, the rest (all of it otherwise) through its write; a
 * whole send marks the connection ``conn`` (if any) clean: every check has passed.
 * What the transport's write returns, or NULL with an error set. */
static PyObject *write_direct(PusherBase *p, ConnectionBase *conn, PyObject *transport,
                              PyObject *chunk) {
    PyObject *r = PyObject_CallMethodNoArgs(transport, S_BUFFERED);
    if (!r) return NULL;
    Py_ssize_t buffered = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    if (buffered == -1 && PyErr_Occurred()) return NULL;
    if (buffered == 0) {
        int closing = call_true(transport, S_IS_CLOSING);
        if (closing < 0) return NULL;
        if (!closing) {
            ssize_t n = send_chunk(p, chunk);
            if (n == PyBytes_GET_SIZE(chunk)) {
                if (conn) conn->clean = 1;
                Py_RETURN_NONE;
            }
            return write_rest(transport, chunk, n);
        }
    }
    return PyObject_CallMethodOneArg(transport, S_WRITE, chunk);
}

/* The chunk sent on a clean connection's socket (see this file's doc): what the socket does
 * not take goes through the transport's write, and the connection is clean no more. What
 * that write returns, or NULL with an error set. */
static PyObject *write_clean(PusherBase *p, ConnectionBase *conn, PyObject *chunk) {
    ssize_t n = send_chunk(p, chunk);
    if (n == PyBytes_GET_SIZE(chunk)) {
        conn->clean_sends++;
        Py_RETURN_NONE;
    }
    conn->clean = 0;
    return write_rest(p->sock, chunk, n);
}

/* The stream of a slot, a new reference (NULL: none, no error set). */
static PyObject *slot_stream(PyObject *refs, PyObject *local) {
    Py_ssize_t i = PyLong_AsSsize_t(local);
    if (i == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (i < 0 || i >= PyList_GET_SIZE(refs)) return NULL;
    PyObject *ref = PyList_GET_ITEM(refs, i);
    if (!PyWeakref_CheckRef(ref)) return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *stream = NULL;
    if (PyWeakref_GetRef(ref, &stream) < 0) PyErr_Clear();
    return stream;
#else
    PyObject *stream = PyWeakref_GET_OBJECT(ref);
    if (stream == Py_None) return NULL;
    return Py_NewRef(stream);
#endif
}

/* Take one update if it is the common case. 1: taken; 0: left (no error set); -1: an error
 * to raise (only what `deliver` would not catch: a BaseException from the write). */
static int take(PyObject *update, PyObject *refs) {
    if (!PyTuple_CheckExact(update) || PyTuple_GET_SIZE(update) != 9) return 0;
    PyObject *tokens = PyTuple_GET_ITEM(update, 1);
    if (!PyList_CheckExact(tokens) || PyList_GET_SIZE(tokens) == 0) return 0;
    if (PyTuple_GET_ITEM(update, 2) != Py_None) return 0;
    PyObject *finish = PyTuple_GET_ITEM(update, 4);
    if (!PyLong_CheckExact(finish)) return 0;
    int fin = PyObject_IsTrue(finish);
    if (fin != 0) {
        if (fin < 0) PyErr_Clear();
        return 0;
    }
    PyObject *stream = slot_stream(refs, PyTuple_GET_ITEM(update, 0));
    if (!stream) return 0;
    int rc = 0;
    PyObject *push = NULL, *waiter = NULL, *count = NULL, *chunk = NULL;
    push = PyObject_GetAttr(stream, S_PUSH);
    if (!push || !PyObject_TypeCheck(push, &PusherBaseType)) goto left;
    PusherBase *p = (PusherBase *)push;
    if (is_none(p->cycle) || is_none(p->flow) || is_none(p->choice) || !is_none(p->inflight) ||
        !is_none(p->error))
        goto left;
    if (!p->pieces || !p->decoder || !p->head || !p->tail || !p->errors) goto left;
    waiter = PyObject_GetAttr(stream, S_WAITER);
    if (!waiter || waiter == Py_None) goto left;
    if (call_true(waiter, S_DONE) != 0) goto left;
    /* Pusher.__call__'s own checks, in its order; held since the connection was found clean. */
    ConnectionBase *conn = connection_of(p);
    int clean = conn && conn->clean;
    if (!clean) {
        if (attr_true(p->flow, S_WRITE_PAUSED) != 0) goto left;
        if (attr_true(p->cycle, S_DISCONNECTED) != 0) goto left;
        if (attr_true(p->cycle, S_RESPONSE_COMPLETE) != 0) goto left;
    }
    if (PyObject_SetAttr(stream, S_ENGINE_INDEX, PyTuple_GET_ITEM(update, 8)) < 0) goto left;
    /* The choice's new count before the step: the step changes the stream's decoder, so
     * nothing that can fail comes between it and the write but the store of this count. */
    PyObject *old = PyObject_GetAttr(p->choice, S_TOKENS);
    if (!old) goto left;
    PyObject *n = PyLong_FromSsize_t(PyList_GET_SIZE(tokens));
    if (!n) {
        Py_DECREF(old);
        goto left;
    }
    count = PyNumber_InPlaceAdd(old, n);
    Py_DECREF(old);
    Py_DECREF(n);
    if (!count) goto left;
    PyObject *args[7] = {p->pieces, p->decoder, tokens, p->head, p->tail, p->errors, Py_True};
    chunk = py_token_event(NULL, args, 7);
    if (!chunk) goto left; /* a failed step leaves the stream as it was: deliver retries it */
    /* From here the tokens are consumed. */
    rc = 1;
    if (PyObject_SetAttr(p->choice, S_TOKENS, count) < 0) {
        /* Only MemoryError can get here (a plain int attribute): raise it from the drain. */
        rc = -1;
        goto out;
    }
    if (chunk != Py_None) {
        PyObject *res = NULL;
        if (clean && PyBytes_CheckExact(chunk)) {
            res = write_clean(p, conn, chunk);
        } else {
            PyObject *transport = PyObject_GetAttr(p->cycle, S_TRANSPORT);
            if (transport && !is_none(p->sock) && transport == p->sock && p->fd >= 0 &&
                PyBytes_CheckExact(chunk))
                res = write_direct(p, conn, transport, chunk);
            else if (transport)
                res = PyObject_CallMethodOneArg(transport, S_WRITE, chunk);
            Py_XDECREF(transport);
        }
        if (res) {
            Py_DECREF(res);
        } else if (PyErr_ExceptionMatches(PyExc_Exception)) {
            /* As a send that raised: the response ends with it. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb && value) PyException_SetTraceback(value, tb);
            Py_XSETREF(p->error, value ? value : Py_NewRef(Py_None));
            Py_XDECREF(type);
            Py_XDECREF(tb);
        } else {
            rc = -1;
        }
    }
    goto out;
left:
    if (PyErr_Occurred()) PyErr_Clear();
    rc = 0;
out:
    Py_XDECREF(chunk);
    Py_XDECREF(count);
    Py_XDECREF(waiter);
    Py_XDECREF(push);
    Py_DECREF(stream);
    return rc;
}

PyObject *py_push_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "push_batch(updates: list, refs: list)");
        return NULL;
    }
    if (intern_names() < 0) return NULL;
    PyObject *updates = args[0], *refs = args[1];
    PyObject *rest = PyList_New(0);
    if (!rest) return NULL;
    /* The list may not change under us: nothing here runs code that holds it, but index each
     * time against its current size anyway. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(updates); i++) {
        PyObject *update = Py_NewRef(PyList_GET_ITEM(updates, i));
        int rc = take(update, refs);
        if (rc == 0 && PyList_Append(rest, update) < 0) rc = -1;
        Py_DECREF(update);
        if (rc < 0) {
            Py_DECREF(rest);
            return NULL;
        }
    }
    return rest;
}
