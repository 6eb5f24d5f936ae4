/*
 * lanes.c: each engine input connection's outgoing stream (tsfront._native.InputLanes).
 *
 * tsfront/io/inputs.py's `InputPort` used to keep, per connection, a bytearray of framed
 * messages and a deque of where each ends; the native turn (turn.c) must queue ADDs on the same
 * stream without a Python frame, so the stream is here: a lane per engine of the group, opened
 * on the connection routed by the engine's identity and closed when that connection ends. Both
 * writers are on the I/O process's one thread; a lane is one ordered stream of whole ZMTP units
 * (the handshake's remainder, messages, PONGs), whoever queued them.
 *
 * The queue depth is libzmq's SNDHWM as `InputPort` kept it: a message counts until the kernel
 * took its last byte; a lane holding `depth` such messages refuses the next (LANE_FULL) and
 * queues nothing of it, and a lane with no connection refuses with LANE_UNREACHABLE
 * (ROUTER_MANDATORY's EHOSTUNREACH). Bytes are offered to the kernel once a turn (`flush`, one
 * send a dirty lane) and when the connection is writable (`write`); what the kernel does not
 * take waits, and the lane says it wants EPOLLOUT (`polled`) until it is gone. A failed send
 * is kept (`failed`) for the port to end the connection; nothing here closes a descriptor.
 */
#include "lanes.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MSG_MORE_FLAG 0x01
#define MSG_LONG_FLAG 0x02
/* A lane's buffer past this is freed when its connection closes (a burst's backlog). */
#define KEEP_BYTES (1u << 20)

static void lane_clear(lane_t *l) {
    l->fd = -1;
    l->ident_len = 0;
    l->off = l->len = 0;
    l->queued = l->taken = 0;
    l->ends_head = l->ends_n = 0;
    l->polled = l->dirty = l->failed = l->changed = 0;
}

static void inputlanes_dealloc(InputLanes *self) {
    if (self->lanes) {
        for (uint32_t i = 0; i < self->count; i++) {
            free(self->lanes[i].buf);
            free(self->lanes[i].ends);
        }
    }
    free(self->lanes);
    free(self->dirty);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int inputlanes_init(InputLanes *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"count", "depth", NULL};
    unsigned int count, depth;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "II", kwlist, &count, &depth)) return -1;
    if (self->lanes) {
        PyErr_SetString(PyExc_RuntimeError, "InputLanes already initialised");
        return -1;
    }
    if (count == 0 || count > 65536 || depth == 0 || depth > (1u << 24)) {
        PyErr_SetString(PyExc_ValueError, "count in [1, 65536] and depth in [1, 2**24]");
        return -1;
    }
    self->count = count;
    self->depth = depth;
    self->lanes = calloc(count, sizeof(lane_t));
    self->dirty = calloc(count, sizeof(uint32_t));
    if (!self->lanes || !self->dirty) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < count; i++) lane_clear(&self->lanes[i]);
    return 0;
}

static int lane_arg(InputLanes *self, PyObject *arg, uint32_t *i) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || (uint64_t)v >= self->count) {
        PyErr_SetString(PyExc_ValueError, "lane out of range");
        return -1;
    }
    *i = (uint32_t)v;
    return 0;
}

/* Room for `need` more bytes after len; 0, or -1 (MemoryError). */
static int lane_reserve(lane_t *l, size_t need) {
    if (l->len + need <= l->cap) return 0;
    if (l->off) {
        memmove(l->buf, l->buf + l->off, l->len - l->off);
        l->len -= l->off;
        l->off = 0;
        if (l->len + need <= l->cap) return 0;
    }
    size_t cap = l->cap ? l->cap : 4096;
    while (cap < l->len + need) cap *= 2;
    uint8_t *grown = realloc(l->buf, cap);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    l->buf = grown;
    l->cap = cap;
    return 0;
}

static void mark_dirty(InputLanes *self, uint32_t i) {
    lane_t *l = &self->lanes[i];
    if (!l->dirty) {
        l->dirty = 1;
        self->dirty[self->dirty_n++] = i; /* at most once a lane: count entries */
    }
}

int lanes_find(InputLanes *self, const uint8_t *identity, size_t len) {
    for (uint32_t i = 0; i < self->count; i++) {
        lane_t *l = &self->lanes[i];
        if (l->fd >= 0 && l->ident_len == len && memcmp(l->ident, identity, len) == 0)
            return (int)i;
    }
    return -1;
}

int lanes_room(InputLanes *self, uint32_t i) {
    lane_t *l = &self->lanes[i];
    if (l->fd < 0) return LANE_UNREACHABLE;
    /* The messages the kernel took whole no longer count. */
    while (l->ends_n && l->ends[l->ends_head] <= l->taken) {
        l->ends_head = (l->ends_head + 1) % self->depth;
        l->ends_n--;
    }
    return l->ends_n >= self->depth ? LANE_FULL : LANE_SENT;
}

static size_t frame_header(uint8_t *p, size_t size, uint8_t flags) {
    if (size > 255) {
        p[0] = flags | MSG_LONG_FLAG;
        for (int k = 0; k < 8; k++) p[1 + k] = (uint8_t)(size >> (56 - 8 * k));
        return 9;
    }
    p[0] = flags;
    p[1] = (uint8_t)size;
    return 2;
}

int lanes_reserve(InputLanes *self, uint32_t i, size_t kind_len, size_t payload_len) {
    lane_t *l = &self->lanes[i];
    if (!l->ends) {
        l->ends = malloc((size_t)self->depth * sizeof(uint64_t));
        if (!l->ends) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return lane_reserve(l, 18 + kind_len + payload_len);
}

void lanes_put_message(InputLanes *self, uint32_t i, const uint8_t *kind, size_t kind_len,
                       const uint8_t *payload, size_t payload_len) {
    lane_t *l = &self->lanes[i];
    uint8_t *p = l->buf + l->len;
    size_t n = frame_header(p, kind_len, MSG_MORE_FLAG);
    memcpy(p + n, kind, kind_len);
    n += kind_len;
    n += frame_header(p + n, payload_len, 0);
    memcpy(p + n, payload, payload_len);
    n += payload_len;
    l->len += n;
    l->queued += n;
    l->ends[(l->ends_head + l->ends_n) % self->depth] = l->queued;
    l->ends_n++;
    self->messages++;
    mark_dirty(self, i);
}

int lanes_queue(InputLanes *self, uint32_t i, const uint8_t *kind, size_t kind_len,
                const uint8_t *payload, size_t payload_len) {
    if (lanes_reserve(self, i, kind_len, payload_len) < 0) return -1;
    lanes_put_message(self, i, kind, kind_len, payload, payload_len);
    return 0;
}

/* One send of what lane i holds (as InputPort's write did); whether it changed (polled flipped
 * or failed). */
static int lane_write(InputLanes *self, uint32_t i) {
    lane_t *l = &self->lanes[i];
    l->dirty = 0;
    if (l->fd < 0 || l->failed) return 0;
    if (l->off < l->len) {
        ssize_t n = send(l->fd, l->buf + l->off, l->len - l->off, MSG_DONTWAIT | MSG_NOSIGNAL);
        self->writes++;
        if (n > 0) {
            l->off += (size_t)n;
            l->taken += (uint64_t)n;
            if (l->off == l->len) l->off = l->len = 0;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            l->failed = errno;
            l->changed = 1;
            return 1;
        }
    }
    int want = l->off < l->len;
    if (want != l->polled) {
        l->polled = want;
        l->changed = 1;
        return 1;
    }
    return 0;
}

uint32_t lanes_flush_all(InputLanes *self) {
    uint32_t changed = 0;
    for (uint32_t k = 0; k < self->dirty_n; k++) changed += (uint32_t)lane_write(self, self->dirty[k]);
    self->dirty_n = 0;
    if (changed) self->changes = 1;
    return changed;
}

/* ------------------------------------------------------------------ Python methods */

static PyObject *inputlanes_open(InputLanes *self, PyObject *args) {
    unsigned int i;
    int fd;
    Py_buffer ident;
    if (!PyArg_ParseTuple(args, "Iiy*", &i, &fd, &ident)) return NULL;
    if (i >= self->count || fd < 0 || ident.len > 255) {
        PyBuffer_Release(&ident);
        PyErr_SetString(PyExc_ValueError, "lane out of range, a negative fd or a long identity");
        return NULL;
    }
    lane_t *l = &self->lanes[i];
    if (l->fd >= 0) {
        PyBuffer_Release(&ident);
        PyErr_SetString(PyExc_RuntimeError, "lane already open");
        return NULL;
    }
    lane_clear(l);
    l->fd = fd;
    l->ident_len = (uint8_t)ident.len;
    memcpy(l->ident, ident.buf, (size_t)ident.len);
    PyBuffer_Release(&ident);
    Py_RETURN_NONE;
}

static PyObject *inputlanes_close(InputLanes *self, PyObject *arg) {
    uint32_t i;
    if (lane_arg(self, arg, &i) < 0) return NULL;
    lane_t *l = &self->lanes[i];
    lane_clear(l);
    if (l->cap > KEEP_BYTES) {
        free(l->buf);
        l->buf = NULL;
        l->cap = 0;
    }
    /* Out of the dirty list: a lane is listed at most once (its dirty flag is now clear). */
    uint32_t keep = 0;
    for (uint32_t k = 0; k < self->dirty_n; k++)
        if (self->dirty[k] != i) self->dirty[keep++] = self->dirty[k];
    self->dirty_n = keep;
    Py_RETURN_NONE;
}

static PyObject *inputlanes_send(InputLanes *self, PyObject *args) {
    unsigned int i;
    Py_buffer kind, payload;
    if (!PyArg_ParseTuple(args, "Iy*y*", &i, &kind, &payload)) return NULL;
    PyObject *out = NULL;
    if (i >= self->count) {
        PyErr_SetString(PyExc_ValueError, "lane out of range");
    } else {
        int rc = lanes_room(self, i);
        if (rc == LANE_FULL) self->full++;
        if (rc != LANE_SENT ||
            lanes_queue(self, i, kind.buf, (size_t)kind.len, payload.buf, (size_t)payload.len) == 0)
            out = PyLong_FromLong(rc);
    }
    PyBuffer_Release(&kind);
    PyBuffer_Release(&payload);
    return out;
}

static PyObject *inputlanes_put(InputLanes *self, PyObject *args) {
    unsigned int i;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "Iy*", &i, &data)) return NULL;
    PyObject *out = NULL;
    if (i >= self->count) {
        PyErr_SetString(PyExc_ValueError, "lane out of range");
    } else if (self->lanes[i].fd < 0 || data.len == 0) {
        out = Py_NewRef(Py_False);
    } else if (lane_reserve(&self->lanes[i], (size_t)data.len) == 0) {
        lane_t *l = &self->lanes[i];
        memcpy(l->buf + l->len, data.buf, (size_t)data.len);
        l->len += (size_t)data.len;
        l->queued += (uint64_t)data.len;
        mark_dirty(self, i);
        out = Py_NewRef(Py_True);
    }
    PyBuffer_Release(&data);
    return out;
}

static PyObject *inputlanes_write(InputLanes *self, PyObject *arg) {
    uint32_t i;
    if (lane_arg(self, arg, &i) < 0) return NULL;
    lane_t *l = &self->lanes[i];
    lane_write(self, i);
    l->changed = 0; /* reported here */
    return Py_BuildValue("(iN)", l->failed, PyBool_FromLong(l->polled));
}

static PyObject *inputlanes_flush(InputLanes *self, PyObject *noargs) {
    lanes_flush_all(self);
    PyObject *out = PyList_New(0);
    if (!out || !self->changes) return out;
    for (uint32_t i = 0; i < self->count; i++) {
        lane_t *l = &self->lanes[i];
        if (!l->changed) continue;
        l->changed = 0;
        PyObject *t = Py_BuildValue("(IiN)", i, l->failed, PyBool_FromLong(l->polled));
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
    }
    self->changes = 0;
    return out;
}

static PyObject *inputlanes_pending(InputLanes *self, PyObject *arg) {
    uint32_t i;
    if (lane_arg(self, arg, &i) < 0) return NULL;
    lane_t *l = &self->lanes[i];
    return PyBytes_FromStringAndSize((const char *)l->buf + l->off, (Py_ssize_t)(l->len - l->off));
}

static PyObject *inputlanes_fd(InputLanes *self, PyObject *arg) {
    uint32_t i;
    if (lane_arg(self, arg, &i) < 0) return NULL;
    return PyLong_FromLong(self->lanes[i].fd);
}

static PyObject *inputlanes_dirty(InputLanes *self, void *closure) {
    return PyBool_FromLong(self->dirty_n != 0 || self->changes != 0);
}

static PyObject *inputlanes_stats(InputLanes *self, PyObject *noargs) {
    return Py_BuildValue("{sKsKsK}", "writes", self->writes, "messages", self->messages, "full",
                         self->full);
}

static PyMethodDef inputlanes_methods[] = {
    {"open", (PyCFunction)inputlanes_open, METH_VARARGS,
     "open(lane, fd, identity): a connection routed by its identity: its writing is the lane's\n"
     "from now on."},
    {"close", (PyCFunction)inputlanes_close, METH_O,
     "close(lane): its connection ended: forget it and what it held (nothing is closed here)."},
    {"send", (PyCFunction)inputlanes_send, METH_VARARGS,
     "send(lane, kind, payload) -> int: queue the message [kind, payload]: 0 queued, 1 the lane\n"
     "holds depth messages the kernel has not taken (nothing queued), 2 no connection."},
    {"put", (PyCFunction)inputlanes_put, METH_VARARGS,
     "put(lane, data) -> bool: queue raw ZMTP bytes (the handshake's rest, a PONG) behind what\n"
     "the lane holds; False if it has no connection."},
    {"write", (PyCFunction)inputlanes_write, METH_O,
     "write(lane) -> (errno, polled): offer its bytes to the kernel now (it is writable);\n"
     "errno of a failed send (0: none), and whether bytes still wait (EPOLLOUT wanted)."},
    {"flush", (PyCFunction)inputlanes_flush, METH_NOARGS,
     "flush() -> list of (lane, errno, polled): offer every dirty lane's bytes to the kernel\n"
     "(one send each); the lanes whose polled flag flipped or whose send failed, since the last\n"
     "flush (the native turn's flushes included)."},
    {"pending", (PyCFunction)inputlanes_pending, METH_O,
     "pending(lane) -> bytes: what the kernel has not taken (a close's linger)."},
    {"fd", (PyCFunction)inputlanes_fd, METH_O, "fd(lane) -> int: its connection's fd, or -1."},
    {"stats", (PyCFunction)inputlanes_stats, METH_NOARGS, "stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef inputlanes_getset[] = {
    {"dirty", (getter)inputlanes_dirty, NULL,
     "Whether a flush has something to do or to report.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject InputLanesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.InputLanes",
    .tp_basicsize = sizeof(InputLanes),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Each routed input connection's outgoing stream (one lane a connection).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)inputlanes_init,
    .tp_dealloc = (destructor)inputlanes_dealloc,
    .tp_methods = inputlanes_methods,
    .tp_getset = inputlanes_getset,
};
