/*
 * reader.c: one worker's side of the slot region (tsfront._native.Reader).
 *
 * `poll` drains the worker's notify ring and reads each named slot; `park` publishes that the
 * worker is about to wait on its eventfd. Only this worker writes its slots' line B and its
 * control block's reader words.
 */
#include "reader.h"

#include <stdlib.h>

#include "region.h"

typedef struct {
    PyObject_HEAD region_t r;
    uint32_t worker;
    uint64_t *tickets; /* per local slot: the ticket this worker expects, 0 if none */
    /* Per local slot: the int objects last handed out for its slot number, prompt and cached
     * counts (they rarely change within a request), reused instead of allocated per update. */
    struct int_cache {
        PyObject *obj;
        uint32_t value;
    } *ints;
    uint32_t *entries; /* poll's copy of the notify entries it consumes (slots_per_worker) */
    int rescan_next;   /* read every slot on the next poll (this one failed half-way) */
    uint64_t rescans;  /* polls that read every slot */
} Reader;

enum { IC_LOCAL = 0, IC_PROMPT = 1, IC_CACHED = 2, IC_N = 3 };

static inline PyObject *cached_int(struct int_cache *c, uint32_t value) {
    if (c->obj == NULL || c->value != value) {
        PyObject *o = PyLong_FromUnsignedLong(value);
        if (!o) return NULL;
        Py_XSETREF(c->obj, o);
        c->value = value;
    }
    return Py_NewRef(c->obj);
}

static void reader_dealloc(Reader *self) {
    if (self->ints) {
        for (uint32_t i = 0; i < self->r.l.slots_per_worker * IC_N; i++) Py_XDECREF(self->ints[i].obj);
        free(self->ints);
    }
    free(self->tickets);
    free(self->entries);
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int reader_init(Reader *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer",        "worker",      "num_workers", "slots_per_worker",
                             "ring_capacity", "max_engines", "submit_ring_bytes", NULL};
    PyObject *buf;
    unsigned int worker, w, s, c, e, sub = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIIII|I", kwlist, &buf, &worker, &w, &s, &c, &e,
                                     &sub))
        return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, sub, 0) < 0) return -1;
    if (worker >= w) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return -1;
    }
    self->worker = worker;
    self->tickets = calloc(s, sizeof(uint64_t));
    self->ints = calloc((size_t)s * IC_N, sizeof(struct int_cache));
    self->entries = calloc(s, sizeof(uint32_t));
    if (!self->tickets || !self->ints || !self->entries) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *reader_expect(Reader *self, PyObject *args) {
    unsigned int local;
    unsigned long long ticket;
    if (!PyArg_ParseTuple(args, "IK", &local, &ticket)) return NULL;
    if (local >= self->r.l.slots_per_worker) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        return NULL;
    }
    uint32_t slot = self->worker * self->r.l.slots_per_worker + local;
    self->tickets[local] = ticket;
    /* Our own line: the I/O process reads it only after it binds the new ticket. */
    atomic_store_explicit(&slot_b(&self->r, slot)->read_seq, 0, memory_order_release);
    Py_RETURN_NONE;
}

static PyObject *reader_release(Reader *self, PyObject *arg) {
    long local = PyLong_AsLong(arg);
    if (local == -1 && PyErr_Occurred()) return NULL;
    if (local < 0 || (uint32_t)local >= self->r.l.slots_per_worker) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        return NULL;
    }
    self->tickets[local] = 0;
    Py_RETURN_NONE;
}

/* Read a slot's news since the last read: None, or a tuple
 * (local_slot, tokens, logprob_vals | None, logprob_idx | None, finish, prompt, completion,
 *  cached, engine_index). */
static PyObject *read_slot(Reader *self, uint32_t local) {
    region_t *r = &self->r;
    uint32_t slot = self->worker * r->l.slots_per_worker + local;
    uint64_t ticket = self->tickets[local];
    if (ticket == 0) return NULL;
    slot_a_t *a = slot_a(r, slot);
    /* Acquire generation: pairs with Writer.bind's release, so the header read below is the
     * one reset for our ticket. Acquire state then write_seq: DONE is released after the last
     * write_seq, so a DONE seen here comes with every token; write_seq is released after the
     * tokens and counts it covers. */
    if (atomic_load_explicit(&a->generation, memory_order_acquire) != ticket) return NULL;
    uint32_t state = atomic_load_explicit(&a->state, memory_order_acquire);
    uint64_t ws = atomic_load_explicit(&a->write_seq, memory_order_acquire);
    slot_b_t *b = slot_b(r, slot);
    uint64_t rs = atomic_load_explicit(&b->read_seq, memory_order_relaxed);
    uint32_t cap = r->l.ring_capacity;
    if (ws < rs || ws - rs > cap) return NULL; /* torn or foreign contents: never trust them */
    uint32_t n = (uint32_t)(ws - rs);
    if (n == 0 && state != SLOT_DONE) return NULL;
    int with_lp = atomic_load_explicit(&a->flags, memory_order_relaxed) & 1u;
    PyObject *toks = PyList_New(n);
    PyObject *vals = NULL, *idx = NULL;
    if (!toks) return NULL;
    const int32_t *tok = slot_tokens(r, slot);
    for (uint32_t j = 0; j < n; j++) {
        PyObject *o = PyLong_FromLong(tok[(rs + j) % cap]);
        if (!o) goto fail;
        PyList_SET_ITEM(toks, j, o);
    }
    if (with_lp) {
        vals = PyList_New(n);
        idx = PyList_New(n);
        if (!vals || !idx) goto fail;
        const float *lpv = slot_lpv(r, slot);
        const int32_t *lpi = slot_lpi(r, slot);
        for (uint32_t j = 0; j < n; j++) {
            PyObject *o = PyFloat_FromDouble(lpv[(rs + j) % cap]);
            if (!o) goto fail;
            PyList_SET_ITEM(vals, j, o);
            o = PyLong_FromLong(lpi[(rs + j) % cap]);
            if (!o) goto fail;
            PyList_SET_ITEM(idx, j, o);
        }
    }
    uint32_t prompt = atomic_load_explicit(&a->prompt_tokens, memory_order_relaxed);
    uint32_t completion = atomic_load_explicit(&a->completion_tokens, memory_order_relaxed);
    uint32_t cached = atomic_load_explicit(&a->cached_tokens, memory_order_relaxed);
    int32_t engine = atomic_load_explicit(&a->engine_index, memory_order_relaxed);
    uint32_t finish = state == SLOT_DONE ? atomic_load_explicit(&a->finish, memory_order_relaxed) : 0;
    /* The tokens are copied out: hand the room back to the I/O process. */
    atomic_store_explicit(&b->read_seq, ws, memory_order_release);
    /* The writer may already have stored the next step's count; never report more completion
     * tokens than have been delivered. */
    if (state != SLOT_DONE && completion > ws) completion = (uint32_t)ws;
    if (state == SLOT_DONE) self->tickets[local] = 0;
    PyObject *out = PyTuple_New(9);
    if (!out) goto fail;
    /* Built by hand: Py_BuildValue's format parsing costs more than the rest of a 1-token read. */
    struct int_cache *ic = &self->ints[(size_t)local * IC_N];
    PyTuple_SET_ITEM(out, 0, cached_int(&ic[IC_LOCAL], local));
    PyTuple_SET_ITEM(out, 1, toks);
    PyTuple_SET_ITEM(out, 2, vals ? vals : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(out, 3, idx ? idx : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(out, 4, PyLong_FromUnsignedLong(finish));
    PyTuple_SET_ITEM(out, 5, cached_int(&ic[IC_PROMPT], prompt));
    PyTuple_SET_ITEM(out, 6, PyLong_FromUnsignedLong(completion));
    PyTuple_SET_ITEM(out, 7, cached_int(&ic[IC_CACHED], cached));
    PyTuple_SET_ITEM(out, 8, PyLong_FromLong(engine));
    for (int k = 0; k < 9; k++) {
        if (!PyTuple_GET_ITEM(out, k)) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
fail:
    Py_XDECREF(toks);
    Py_XDECREF(vals);
    Py_XDECREF(idx);
    return NULL;
}

static int append_slot(Reader *self, PyObject *out, uint32_t local) {
    PyObject *item = read_slot(self, local);
    if (!item) return PyErr_Occurred() ? -1 : 0;
    int rc = PyList_Append(out, item);
    Py_DECREF(item);
    return rc;
}

/*
 * Drain this worker's notify ring and read every slot it names (or every slot, on a rescan).
 *
 * The reader's half of the notify ring invariant (see publish_notifications in writer.c): an
 * entry is consumed before its slot's `notified` flag is cleared. In order:
 *   1. load head (acquire: the entries and the slots' news before them are visible);
 *   2. copy the entries [tail, head) out of the ring;
 *   3. store tail = head: the cells may be reused now that nothing reads them (release: pairs
 *      with the writer's acquire load of tail before it reuses a cell);
 *   4. release fence, then clear each consumed slot's flag (a writer that sees a flag at 0
 *      sees the tail of step 3, so it never finds the ring full because of this entry);
 *   5. take the writer's rescan request (acquire: pairs with its release store);
 *   6. seq_cst fence (pairs with the writer's fence before its exchange on `notified`: either
 *      the writer saw the flag still set, and its news is visible to step 7, or it saw it
 *      cleared and pushed a new entry), then read the slots.
 * A ring whose head - tail exceeds slots_per_worker, or an entry naming no slot, cannot come
 * from a writer that keeps the invariant: its entries are not trusted, and the poll rescans.
 * A rescan clears every slot's flag and reads every slot this worker expects; a slot with no
 * news reads as nothing, so nothing is delivered twice. (A slot pushed after this poll's load
 * of head may so get a second entry: it too reads as nothing, and it can cost at most one more
 * counted overflow and rescan. Rescans happen only after the protocol was broken.)
 */
static PyObject *reader_poll(Reader *self, PyObject *unused) {
    region_t *r = &self->r;
    worker_ctl_t *ctl = worker_ctl(r, self->worker);
    uint32_t spw = r->l.slots_per_worker;
    uint32_t base = self->worker * spw;
    const uint32_t *ring = notify_ring(r, self->worker);
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_acquire);
    int rescan = self->rescan_next;
    uint32_t n = 0;
    if (head - tail > spw) {
        rescan = 1; /* a writer that keeps the invariant never gets here */
    } else {
        for (uint64_t t = tail; t != head; t++) {
            uint32_t local = ring[t % spw];
            if (local < spw) self->entries[n++] = local;
            else rescan = 1;
        }
    }
    if (head != tail) atomic_store_explicit(&ctl->tail, head, memory_order_release);
    atomic_thread_fence(memory_order_release);
    for (uint32_t i = 0; i < n; i++)
        atomic_store_explicit(&slot_a(r, base + self->entries[i])->notified, 0, memory_order_relaxed);
    if (atomic_load_explicit(&ctl->rescan, memory_order_relaxed) &&
        atomic_exchange_explicit(&ctl->rescan, 0, memory_order_acquire))
        rescan = 1;
    if (rescan) {
        for (uint32_t local = 0; local < spw; local++)
            atomic_store_explicit(&slot_a(r, base + local)->notified, 0, memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
    self->rescan_next = 0;
    PyObject *out = PyList_New(0);
    if (!out) goto fail;
    if (rescan) {
        self->rescans++;
        for (uint32_t local = 0; local < spw; local++)
            if (append_slot(self, out, local) < 0) goto fail;
    } else {
        for (uint32_t i = 0; i < n; i++)
            if (append_slot(self, out, self->entries[i]) < 0) goto fail;
    }
    return out;
fail:
    /* The entries are consumed and their flags cleared: read every slot next time instead. */
    self->rescan_next = 1;
    Py_XDECREF(out);
    return NULL;
}

static PyObject *reader_read(Reader *self, PyObject *arg) {
    long local = PyLong_AsLong(arg);
    if (local == -1 && PyErr_Occurred()) return NULL;
    if (local < 0 || (uint32_t)local >= self->r.l.slots_per_worker) {
        PyErr_SetString(PyExc_ValueError, "slot out of range");
        return NULL;
    }
    PyObject *item = read_slot(self, (uint32_t)local);
    if (!item && !PyErr_Occurred()) Py_RETURN_NONE;
    return item;
}

/* Publish that this worker is about to wait on its eventfd. False if notifications (or a
 * rescan) are already pending (then it stays unparked and should poll again). */
static PyObject *reader_park(Reader *self, PyObject *unused) {
    worker_ctl_t *ctl = worker_ctl(&self->r, self->worker);
    atomic_store_explicit(&ctl->parked, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
    /* Either the writer's wake (seq_cst fence, then load of `parked`) sees us parked, or we see
     * its head or its rescan request here. */
    if (head != tail || self->rescan_next || atomic_load_explicit(&ctl->rescan, memory_order_acquire)) {
        atomic_store_explicit(&ctl->parked, 0, memory_order_relaxed);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyObject *reader_rescans(Reader *self, PyObject *unused) {
    return PyLong_FromUnsignedLongLong(self->rescans);
}

static PyObject *reader_wakes(Reader *self, PyObject *unused) {
    worker_ctl_t *ctl = worker_ctl(&self->r, self->worker);
    return PyLong_FromUnsignedLongLong(atomic_load_explicit(&ctl->wakes, memory_order_relaxed));
}

static PyMethodDef reader_methods[] = {
    {"expect", (PyCFunction)reader_expect, METH_VARARGS,
     "expect(local_slot, ticket): the next request on this slot carries this ticket."},
    {"release", (PyCFunction)reader_release, METH_O,
     "release(local_slot): stop reading this slot (its stream ended or was dropped)."},
    {"poll", (PyCFunction)reader_poll, METH_NOARGS,
     "poll() -> list of update tuples for every notified slot, in one call."},
    {"read", (PyCFunction)reader_read, METH_O,
     "read(local_slot) -> update tuple or None: read one slot directly."},
    {"park", (PyCFunction)reader_park, METH_NOARGS,
     "park() -> bool: publish that this worker waits on its eventfd; False if work is pending."},
    {"rescans", (PyCFunction)reader_rescans, METH_NOARGS,
     "rescans() -> int: polls that read every slot (the writer found the notify ring full)."},
    {"wakes", (PyCFunction)reader_wakes, METH_NOARGS,
     "wakes() -> int: eventfd writes the I/O process has made to this worker."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One worker's side of the slot region: reads its slots' rings.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

