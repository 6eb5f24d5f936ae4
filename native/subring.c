/*
 * subring.c: the per-worker submission rings (see subring.h for the layout).
 *
 * `Submitter` is a worker's producer side: `add` / `abort` write one record and publish it;
 * `ring`, the doorbell (once per worker loop turn that published a record, not per record, and
 * at once from `add` / `abort` when a quarter of the ring is published unannounced), writes
 * the I/O process's eventfd only if it said it is parked. `Intake` is the I/O process's
 * consumer side over every worker's ring: `park` publishes that it is about to block, `take`
 * copies the published records out (validating each: the ring is written by another process,
 * which may lie), `applied` counts a ZMQ submission handled (the ordering rule between the two
 * paths). The invariant is in docs/DESIGN.md, "The submission rings".
 */
#include "subring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline uint64_t align_up(uint64_t v) { return (v + SUBMIT_ALIGN - 1) & ~(uint64_t)(SUBMIT_ALIGN - 1); }

/* ------------------------------------------------------------------ the worker's side */

typedef struct {
    PyObject_HEAD region_t r;
    uint32_t worker;
    int efd;            /* the I/O process's eventfd */
    uint64_t tail;      /* private copy of what this worker published (it is the only writer) */
    uint64_t head_seen; /* last head read from the I/O process */
    uint64_t sent;      /* ZMQ submissions this worker sent since its attach */
    uint64_t announced; /* tail at the last doorbell: records past it are not announced yet */
    uint64_t records, full, rings, early, wakes;
} Submitter;

static void submitter_dealloc(Submitter *self) {
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int submitter_init(Submitter *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer",      "worker",      "num_workers",       "slots_per_worker",
                             "ring_capacity", "max_engines", "submit_ring_bytes", "eventfd",
                             NULL};
    PyObject *buf;
    unsigned int worker, w, s, c, e, sub;
    int efd;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIIIIIi", kwlist, &buf, &worker, &w, &s, &c, &e,
                                     &sub, &efd))
        return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Submitter already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, sub, 0) < 0) return -1;
    if (worker >= w || sub == 0) {
        PyErr_SetString(PyExc_ValueError, "worker out of range, or the region has no rings");
        return -1;
    }
    self->worker = worker;
    self->efd = efd;
    /* The I/O process reset this ring (Intake.open) before it sent the region: we start at 0. */
    self->tail = self->head_seen = self->sent = self->announced = 0;
    return 0;
}

/* The doorbell (Dekker with Intake.park), rung after the records it announces were published
 * (their release stores of tail, in put): seq_cst fence, then parked loaded. The consumer
 * stores parked, fences, then loads tail: at least one of us sees the other's store, so either
 * it sees every record published before this fence before it blocks, or we see parked = 1. The
 * exchange makes exactly one waker write the eventfd per park. 1 if this call wrote. */
static int doorbell(Submitter *self) {
    self->announced = self->tail;
    atomic_thread_fence(memory_order_seq_cst);
    sub_shared_t *sh = sub_shared(&self->r);
    if (atomic_load_explicit(&sh->parked, memory_order_relaxed) &&
        atomic_exchange_explicit(&sh->parked, 0, memory_order_acq_rel) == 1) {
        uint64_t one = 1;
        ssize_t rc;
        do {
            rc = write(self->efd, &one, sizeof one);
        } while (rc < 0 && errno == EINTR);
        self->wakes++; /* EAGAIN: the counter is saturated, the I/O process is awake anyway */
        return 1;
    }
    return 0;
}

/* Write one record (kind, a, b, c) and publish it; a SUB_* code. */
static int submitter_put(Submitter *self, uint32_t kind, const Py_buffer *a, const Py_buffer *b,
                         const Py_buffer *c) {
    region_t *r = &self->r;
    sub_ctl_t *ctl = sub_ctl(r, self->worker);
    /* Ordering across the two paths: while a ZMQ submission of ours is not yet handled, every
     * record goes over ZMQ too (ZMQ keeps their order). The acquire pairs with the I/O
     * process's release store of `applied` (Intake.applied), made after it handled that
     * submission: a record we publish after seeing it is taken after it. */
    if (atomic_load_explicit(&ctl->applied, memory_order_acquire) != self->sent)
        return SUB_ZMQ_PENDING;
    uint64_t body = sizeof(sub_rec_t) + (uint64_t)a->len + (uint64_t)(b ? b->len : 0) +
                    (uint64_t)(c ? c->len : 0);
    uint64_t need = align_up(body);
    if (need > sub_max_record(r)) return SUB_TOO_BIG;
    uint64_t ring = r->l.submit_ring_bytes;
    uint64_t off = self->tail % ring;
    uint64_t total = need <= ring - off ? need : need + (ring - off); /* with a WRAP record */
    if (self->tail - self->head_seen + total > ring) {
        /* The acquire pairs with the consumer's release store of head (Intake.take), made
         * after it copied the records out: the room before head is ours to overwrite. */
        self->head_seen = atomic_load_explicit(&ctl->head, memory_order_acquire);
        uint64_t used = self->tail - self->head_seen; /* huge if head lies: then full */
        if (used > ring || used + total > ring) {
            self->full++;
            return SUB_FULL;
        }
    }
    uint8_t *base = sub_ring(r, self->worker);
    if (total != need) {
        sub_rec_t wrap = {.size = (uint32_t)(ring - off), .kind = SUB_WRAP};
        memcpy(base + off, &wrap, sizeof wrap);
        off = 0;
    }
    sub_rec_t head = {.size = (uint32_t)need,
                      .kind = kind,
                      .a_len = (uint32_t)a->len,
                      .b_len = b ? (uint32_t)b->len : 0,
                      .c_len = c ? (uint32_t)c->len : 0,
                      .flags = c ? SUB_HAS_HASHES : 0};
    uint8_t *p = base + off;
    memcpy(p, &head, sizeof head);
    p += sizeof head;
    memcpy(p, a->buf, a->len);
    p += a->len;
    if (b) {
        memcpy(p, b->buf, b->len);
        p += b->len;
    }
    if (c) memcpy(p, c->buf, c->len);
    self->tail += total;
    /* Publish: the record's bytes happen-before `tail` (release); the consumer acquires tail
     * before it reads them. */
    atomic_store_explicit(&ctl->tail, self->tail, memory_order_release);
    self->records++;
    /* A turn that has published a quarter of the ring or more rings now, not at the end of the
     * turn: the I/O process drains while the rest is written, so a burst of many
     * ADDs in one turn does not find the ring full for want of a doorbell. */
    if (self->tail - self->announced >= ring / 4) {
        self->early++;
        doorbell(self);
    }
    return SUB_OK;
}

/* The worker rings once per loop turn that published a record, at the end of it
 * (tsfront.client.attachment), not once per record. */
static PyObject *submitter_ring(Submitter *self, PyObject *noargs) {
    self->rings++;
    return PyBool_FromLong(doorbell(self));
}

static PyObject *submitter_add(Submitter *self, PyObject *args) {
    Py_buffer header, payload;
    PyObject *hashes = Py_None;
    if (!PyArg_ParseTuple(args, "y*y*|O", &header, &payload, &hashes)) return NULL;
    Py_buffer h = {0};
    int has = hashes != Py_None;
    if (has && PyObject_GetBuffer(hashes, &h, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&header);
        PyBuffer_Release(&payload);
        return NULL;
    }
    int rc = submitter_put(self, SUB_ADD, &header, &payload, has ? &h : NULL);
    if (has) PyBuffer_Release(&h);
    PyBuffer_Release(&header);
    PyBuffer_Release(&payload);
    return PyLong_FromLong(rc);
}

static PyObject *submitter_abort(Submitter *self, PyObject *args) {
    Py_buffer entries;
    if (!PyArg_ParseTuple(args, "y*", &entries)) return NULL;
    int rc = submitter_put(self, SUB_ABORT, &entries, NULL, NULL);
    PyBuffer_Release(&entries);
    return PyLong_FromLong(rc);
}

static PyObject *submitter_zmq_sent(Submitter *self, PyObject *noargs) {
    self->sent++;
    Py_RETURN_NONE;
}

static PyObject *submitter_stats(Submitter *self, PyObject *noargs) {
    return Py_BuildValue("{sKsKsKsKsKsKsK}", "records", self->records, "full", self->full,
                         "rings", self->rings, "early_rings", self->early, "wakes", self->wakes,
                         "zmq_sent", self->sent, "max_record",
                         (unsigned long long)sub_max_record(&self->r));
}

static PyMethodDef submitter_methods[] = {
    {"add", (PyCFunction)submitter_add, METH_VARARGS,
     "add(header, payload, hashes=None) -> int: write and publish an ADD record (announced by\n"
     "ring, or at once once a quarter of the ring is unannounced); 0 written, 1 the ring is full, 2 too large for the ring, 3 a ZMQ submission is\n"
     "not handled yet (send over ZMQ)."},
    {"abort", (PyCFunction)submitter_abort, METH_VARARGS,
     "abort(entries) -> int: write and publish an ABORT record; the codes of add."},
    {"ring", (PyCFunction)submitter_ring, METH_NOARGS,
     "ring() -> bool: the doorbell, after records were published: wake the I/O process if it\n"
     "is parked (True: this call wrote its eventfd)."},
    {"zmq_sent", (PyCFunction)submitter_zmq_sent, METH_NOARGS,
     "zmq_sent(): count one submission sent over ZMQ instead (the ordering rule)."},
    {"stats", (PyCFunction)submitter_stats, METH_NOARGS, "stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SubmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Submitter",
    .tp_basicsize = sizeof(Submitter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker's side of its submission ring: writes ADD and ABORT records.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)submitter_init,
    .tp_dealloc = (destructor)submitter_dealloc,
    .tp_methods = submitter_methods,
};

/* ------------------------------------------------------------------ the I/O process's side */

static void intake_dealloc(Intake *self) {
    free(self->head);
    free(self->applied);
    free(self->bad_tail);
    free(self->active);
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int intake_init(Intake *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer",      "num_workers",       "slots_per_worker", "ring_capacity",
                             "max_engines", "submit_ring_bytes", NULL};
    PyObject *buf;
    unsigned int w, s, c, e, sub;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIIII", kwlist, &buf, &w, &s, &c, &e, &sub))
        return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Intake already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, sub, 0) < 0) return -1;
    if (sub == 0) {
        PyErr_SetString(PyExc_ValueError, "the region has no submission rings");
        return -1;
    }
    self->head = calloc(w, sizeof(uint64_t));
    self->applied = calloc(w, sizeof(uint64_t));
    self->bad_tail = calloc(w, sizeof(uint64_t));
    self->active = calloc(w, 1);
    if (!self->head || !self->applied || !self->bad_tail || !self->active) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int worker_arg(Intake *self, PyObject *arg, uint32_t *w) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || (uint64_t)v >= self->r.l.num_workers) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return -1;
    }
    *w = (uint32_t)v;
    return 0;
}

static PyObject *intake_open(Intake *self, PyObject *arg) {
    uint32_t w;
    if (worker_arg(self, arg, &w) < 0) return NULL;
    /* Before the worker gets the region (the control message that carries it orders these
     * stores before any of its loads): a record half-written by the place's last worker, or
     * anything it left, is forgotten. */
    sub_ctl_t *ctl = sub_ctl(&self->r, w);
    atomic_store_explicit(&ctl->head, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->applied, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->tail, 0, memory_order_relaxed);
    self->head[w] = self->applied[w] = 0;
    self->bad_tail[w] = UINT64_MAX;
    self->active[w] = 1;
    Py_RETURN_NONE;
}

static PyObject *intake_close(Intake *self, PyObject *arg) {
    uint32_t w;
    if (worker_arg(self, arg, &w) < 0) return NULL;
    self->active[w] = 0;
    Py_RETURN_NONE;
}

/* Whether worker w's ring holds a record to take (a tail out of range counts as none). */
static inline int readable(Intake *self, uint32_t w) {
    uint64_t tail = atomic_load_explicit(&sub_ctl(&self->r, w)->tail, memory_order_acquire);
    uint64_t avail = tail - self->head[w];
    return avail != 0 && avail <= self->r.l.submit_ring_bytes && avail % SUBMIT_ALIGN == 0;
}

int intake_park_c(Intake *self) {
    sub_shared_t *sh = sub_shared(&self->r);
    /* parked stored, seq_cst fence, then every tail loaded: pairs with the producer's tail
     * stores (Submitter.put), then its fence and parked load (Submitter.ring). */
    atomic_store_explicit(&sh->parked, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    for (uint32_t w = 0; w < self->r.l.num_workers; w++) {
        if (self->active[w] && readable(self, w)) {
            atomic_store_explicit(&sh->parked, 0, memory_order_relaxed);
            self->refused++; /* a waker may have seen parked meanwhile: one write this park too */
            return 0;
        }
    }
    self->parks++;
    return 1;
}

static PyObject *intake_park(Intake *self, PyObject *noargs) {
    return PyBool_FromLong(intake_park_c(self));
}

static int append_bad(PyObject *out, uint32_t w, const char *why) {
    PyObject *t = Py_BuildValue("(IIsOO)", w, 0u, why, Py_None, Py_None);
    if (!t) return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

static PyObject *bytes_at(const uint8_t *p, uint32_t n) {
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)n);
}

/* Copy worker w's published records (up to `limit`) into `out`; -1 on a Python error (then
 * nothing of w's is consumed and `out` holds only what it held). */
static int take_one(Intake *self, uint32_t w, Py_ssize_t limit, PyObject *out) {
    region_t *r = &self->r;
    sub_ctl_t *ctl = sub_ctl(r, w);
    uint64_t ring = r->l.submit_ring_bytes;
    /* Acquire: pairs with the producer's release store of tail; the bytes of every record
     * before it are visible. */
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
    uint64_t h = self->head[w];
    uint64_t avail = tail - h;
    if (avail == 0) return 0;
    if (avail > ring || avail % SUBMIT_ALIGN != 0) {
        /* A tail behind head, past a full ring or off the record grid: nothing to read. Counted
         * once per such value (the loop would see it every turn). */
        if (tail != self->bad_tail[w]) {
            self->bad_tail[w] = tail;
            self->bad++;
            return append_bad(out, w, "the ring's tail is out of range");
        }
        return 0;
    }
    const uint8_t *base = sub_ring(r, w);
    Py_ssize_t start = PyList_GET_SIZE(out), n = 0;
    const char *why = NULL;
    while (h != tail && n < limit) {
        uint64_t off = h % ring, room = ring - off, left = tail - h;
        sub_rec_t rec;
        /* One snapshot of the head: a peer may rewrite it meanwhile; only this copy is used. */
        memcpy(&rec, base + off, sizeof rec);
        if (rec.kind == SUB_WRAP) {
            if (rec.size != room || room > left) {
                why = "a wrap record of the wrong size";
                break;
            }
            h += room;
            continue;
        }
        if (rec.kind != SUB_ADD && rec.kind != SUB_ABORT) {
            why = "a record of unknown kind";
            break;
        }
        if (rec.size < SUBMIT_ALIGN || rec.size % SUBMIT_ALIGN != 0 || rec.size > room ||
            rec.size > left) {
            why = "a record size out of range";
            break;
        }
        uint64_t body = sizeof rec + (uint64_t)rec.a_len + rec.b_len + rec.c_len;
        if (body > rec.size) {
            why = "record lengths beyond the record";
            break;
        }
        const uint8_t *p = base + off + sizeof rec;
        PyObject *a = bytes_at(p, rec.a_len), *b = NULL, *c = NULL, *t = NULL;
        if (!a) goto error;
        if (rec.kind == SUB_ADD) {
            b = bytes_at(p + rec.a_len, rec.b_len);
            if (b && (rec.flags & SUB_HAS_HASHES)) c = bytes_at(p + rec.a_len + rec.b_len, rec.c_len);
            if (!b || ((rec.flags & SUB_HAS_HASHES) && !c)) {
                Py_DECREF(a);
                Py_XDECREF(b);
                goto error;
            }
        }
        t = PyTuple_New(5);
        if (!t) {
            Py_DECREF(a);
            Py_XDECREF(b);
            Py_XDECREF(c);
            goto error;
        }
        PyTuple_SET_ITEM(t, 0, PyLong_FromUnsignedLong(w));
        PyTuple_SET_ITEM(t, 1, PyLong_FromUnsignedLong(rec.kind));
        PyTuple_SET_ITEM(t, 2, a);
        PyTuple_SET_ITEM(t, 3, b ? b : Py_NewRef(Py_None));
        PyTuple_SET_ITEM(t, 4, c ? c : Py_NewRef(Py_None));
        if (!PyTuple_GET_ITEM(t, 0) || !PyTuple_GET_ITEM(t, 1) || PyList_Append(out, t) < 0) {
            Py_DECREF(t);
            goto error;
        }
        Py_DECREF(t);
        h += rec.size;
        n++;
    }
    if (why != NULL) {
        /* No record boundary past a corrupt record can be trusted: drop what is published. */
        self->bad++;
        h = tail;
        if (append_bad(out, w, why) < 0) goto error;
    }
    self->records += (uint64_t)n;
    self->head[w] = h;
    /* Release: the copies above happen-before the producer reuses this room (it acquires
     * head before it writes there). */
    atomic_store_explicit(&ctl->head, h, memory_order_release);
    return 0;
error:
    PyList_SetSlice(out, start, PyList_GET_SIZE(out), NULL);
    return -1;
}

/* The native turn's pass over the rings (subring.h): worker w's published records, in order,
 * each offered to `fn` until it declines one; a record that fails the checks take_one makes
 * stops the pass there too, and is left for `take` to report. Only what was offered and
 * consumed moves the head. */
static int each_one(Intake *self, uint32_t w, sub_fn fn, void *ctx, Py_ssize_t *taken) {
    region_t *r = &self->r;
    sub_ctl_t *ctl = sub_ctl(r, w);
    uint64_t ring = r->l.submit_ring_bytes;
    /* Acquire: pairs with the producer's release store of tail (as in take_one). */
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_acquire);
    uint64_t h = self->head[w], start = h;
    uint64_t avail = tail - h;
    if (avail == 0 || avail > ring || avail % SUBMIT_ALIGN != 0) return 0;
    const uint8_t *base = sub_ring(r, w);
    int rc = 0;
    while (h != tail) {
        uint64_t off = h % ring, room = ring - off, left = tail - h;
        sub_rec_t rec;
        memcpy(&rec, base + off, sizeof rec); /* one snapshot of the head, as in take_one */
        if (rec.kind == SUB_WRAP) {
            if (rec.size != room || room > left) break;
            h += room;
            continue;
        }
        if ((rec.kind != SUB_ADD && rec.kind != SUB_ABORT) || rec.size < SUBMIT_ALIGN ||
            rec.size % SUBMIT_ALIGN != 0 || rec.size > room || rec.size > left ||
            sizeof rec + (uint64_t)rec.a_len + rec.b_len + rec.c_len > rec.size)
            break; /* take_one reports it */
        const uint8_t *p = base + off + sizeof rec;
        sub_view_t v = {.worker = w,
                        .kind = rec.kind,
                        .a = p,
                        .a_len = rec.a_len,
                        .b = p + rec.a_len,
                        .b_len = rec.kind == SUB_ADD ? rec.b_len : 0,
                        .c = p + rec.a_len + rec.b_len,
                        .c_len = rec.c_len,
                        .has_c = rec.kind == SUB_ADD && (rec.flags & SUB_HAS_HASHES)};
        rc = fn(ctx, &v);
        if (rc <= 0) break;
        h += rec.size;
        (*taken)++;
    }
    if (h != start) {
        /* Wraps skipped before a declined record are consumed too: harmless, take_one would
         * skip them the same way. */
        self->head[w] = h;
        /* Release: the copies fn made happen-before the producer reuses this room. */
        atomic_store_explicit(&ctl->head, h, memory_order_release);
    }
    return rc < 0 ? -1 : 0;
}

Py_ssize_t intake_each(Intake *self, sub_fn fn, void *ctx) {
    /* Awake: a producer need not write the eventfd until the next park (a hint; relaxed). */
    atomic_store_explicit(&sub_shared(&self->r)->parked, 0, memory_order_relaxed);
    Py_ssize_t taken = 0;
    for (uint32_t w = 0; w < self->r.l.num_workers; w++) {
        if (!self->active[w]) continue;
        if (each_one(self, w, fn, ctx, &taken) < 0) return -1;
    }
    self->records += (uint64_t)taken;
    return taken;
}

static PyObject *intake_take(Intake *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"limit", "worker", NULL};
    Py_ssize_t limit = 256;
    int worker = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|ni", kwlist, &limit, &worker)) return NULL;
    if (worker >= (int)self->r.l.num_workers) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return NULL;
    }
    /* Awake: a producer need not write the eventfd until the next park (a hint; relaxed). */
    atomic_store_explicit(&sub_shared(&self->r)->parked, 0, memory_order_relaxed);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    uint32_t first = worker < 0 ? 0 : (uint32_t)worker;
    uint32_t last = worker < 0 ? self->r.l.num_workers : (uint32_t)worker + 1;
    for (uint32_t w = first; w < last; w++) {
        if (!self->active[w]) continue;
        if (take_one(self, w, limit, out) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyObject *intake_applied(Intake *self, PyObject *arg) {
    uint32_t w;
    if (worker_arg(self, arg, &w) < 0) return NULL;
    /* Release: pairs with the producer's acquire load (Submitter.put); stored after the ZMQ
     * submission was handled, so a ring record written after it is seen is taken after it. */
    atomic_store_explicit(&sub_ctl(&self->r, w)->applied, ++self->applied[w], memory_order_release);
    Py_RETURN_NONE;
}

static PyObject *intake_stats(Intake *self, PyObject *noargs) {
    return Py_BuildValue("{sKsKsKsK}", "records", self->records, "bad_records", self->bad, "parks",
                         self->parks, "refused_parks", self->refused);
}

static PyMethodDef intake_methods[] = {
    {"open", (PyCFunction)intake_open, METH_O,
     "open(worker): reset the worker's ring and read it from now on (at attach)."},
    {"close", (PyCFunction)intake_close, METH_O, "close(worker): stop reading its ring (detach)."},
    {"park", (PyCFunction)intake_park, METH_NOARGS,
     "park() -> bool: publish that the I/O process is about to block; False (and not parked)\n"
     "if a ring already holds a record."},
    {"take", (PyCFunction)(void (*)(void))intake_take, METH_VARARGS | METH_KEYWORDS,
     "take(limit=256, worker=-1) -> list of (worker, kind, a, b, c): the published records of\n"
     "every attached worker (or one), at most limit a worker; kind 65 ADD (a header + rid,\n"
     "b payload, c hashes or None), 88 ABORT (a entries), 0 a corrupt ring (a: why; what it\n"
     "held is dropped). Clears parked."},
    {"applied", (PyCFunction)intake_applied, METH_O,
     "applied(worker): one ZMQ submission of that worker was handled (publish the count)."},
    {"stats", (PyCFunction)intake_stats, METH_NOARGS, "stats() -> dict of counters."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject IntakeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Intake",
    .tp_basicsize = sizeof(Intake),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The I/O process's side of the workers' submission rings: takes their records.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)intake_init,
    .tp_dealloc = (destructor)intake_dealloc,
    .tp_methods = intake_methods,
};
