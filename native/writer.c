/*
 * writer.c: the I/O process's side of the slot region (tsfront._native.Writer).
 *
 * `ingest` decodes each BatchTokenIDOutSlim frame (frame.c, pass 1), then applies it (pass 2):
 * maps each rid to its slot (ridmap.c) if the rid was sent to the engine whose socket the frame
 * came from, appends the delta tokens to the slot's ring (spilling
 * to private memory when a reader lags), queues the slot on its worker's notify ring once, and
 * `wake` writes a worker's eventfd only if that worker has published that it is parked.
 */
#include "writer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "region.h"
#include "ridmap.h"

#define SPILL_MAX_TOKENS (1u << 30)

typedef struct {
    int32_t *tok;
    float *lpv;
    int32_t *lpi;
    uint32_t n, cap;
    uint32_t finish;      /* terminal code to publish once the spill drains */
    uint32_t prompt, completion, cached;
    int32_t engine_index;
    int listed;
} spill_t;

/* Each engine's rows of its last frame, by position: an engine's batch keeps its order from
 * step to step, so row i of a frame is most often the rid row i of the last one was, and
 * checking that slot's key costs fewer cache misses than the hash probe (the rows of a paced
 * frame find the map cold). A small table of engines, replaced round robin past HINT_ENGINES. */
#define HINT_ENGINES 16
#define HINT_MAX_ROWS 65536u
typedef struct {
    int32_t engine_index; /* -1: unused */
    uint32_t cap;
    uint32_t *slot1; /* per row position: slot + 1, 0 none */
} hint_t;

typedef struct {
    PyObject_HEAD region_t r;
    uint32_t total_slots;
    ridmap_t rids;
    /* per slot: the engine its bound rid was sent to (-1: none). A row is applied only from
     * that engine's socket, so one engine (or a peer on its output port) cannot write into
     * another engine's streams. */
    int32_t *owner;
    /* per-slot spill, list of slots that have one */
    spill_t *spill;
    uint32_t *spill_list;
    uint32_t spill_count;
    /* per-frame scratch */
    frame_rows_t frame;
    uint32_t *touched;     /* slots to notify at the end of this turn, each at most once */
    uint8_t *touched_mark; /* per slot: 1 while it is in `touched` */
    uint32_t touched_n;
    /* workers */
    int *wake_fd;
    uint8_t *worker_touched;
    uint32_t *touched_workers;
    uint32_t touched_workers_n;
    uint64_t *pending_head; /* local copy of each worker's head */
    uint64_t *tail_seen;    /* each worker's tail as last loaded (it only grows) */
    hint_t hints[HINT_ENGINES];
    uint32_t hint_next;
    /* counters */
    uint64_t frames, rows_total, unknown_rows, spilled_tokens, wakes, tokens, notify_overflows;
} Writer;

static void publish_stats(Writer *self);

static void writer_dealloc(Writer *self) {
    if (self->spill) {
        for (uint32_t i = 0; i < self->total_slots; i++) {
            free(self->spill[i].tok);
            free(self->spill[i].lpv);
            free(self->spill[i].lpi);
        }
    }
    ridmap_free(&self->rids);
    for (uint32_t i = 0; i < HINT_ENGINES; i++) free(self->hints[i].slot1);
    free(self->owner);
    free(self->spill);
    free(self->spill_list);
    free(self->frame.rows);
    free(self->touched);
    free(self->touched_mark);
    free(self->tail_seen);
    free(self->wake_fd);
    free(self->worker_touched);
    free(self->touched_workers);
    free(self->pending_head);
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int writer_init(Writer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "num_workers", "slots_per_worker", "ring_capacity",
                             "max_engines", "submit_ring_bytes", NULL};
    PyObject *buf;
    unsigned int w, s, c, e, sub = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIII|I", kwlist, &buf, &w, &s, &c, &e, &sub))
        return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Writer already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, sub, 1) < 0) return -1;
    uint64_t total = (uint64_t)w * s;
    if (total > (1u << 24)) {
        PyErr_SetString(PyExc_ValueError, "too many slots (at most 16M)");
        return -1;
    }
    self->total_slots = (uint32_t)total;
    int map_ok = ridmap_init(&self->rids, self->total_slots) == 0;
    self->owner = malloc(total * sizeof(int32_t));
    self->spill = calloc(total, sizeof(spill_t));
    self->spill_list = calloc(total, sizeof(uint32_t));
    self->touched = calloc(total, sizeof(uint32_t));
    self->touched_mark = calloc(total, 1);
    self->tail_seen = calloc(w, sizeof(uint64_t));
    self->wake_fd = malloc(w * sizeof(int));
    self->worker_touched = calloc(w, 1);
    self->touched_workers = calloc(w, sizeof(uint32_t));
    self->pending_head = calloc(w, sizeof(uint64_t));
    if (!map_ok || !self->owner || !self->spill || !self->spill_list ||
        !self->touched || !self->wake_fd || !self->worker_touched || !self->touched_workers ||
        !self->pending_head || !self->touched_mark || !self->tail_seen) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < w; i++) self->wake_fd[i] = -1;
    for (uint32_t i = 0; i < self->total_slots; i++) self->owner[i] = -1;
    for (uint32_t i = 0; i < HINT_ENGINES; i++) self->hints[i].engine_index = -1;
    memset(self->r.base + HEADER_BYTES, 0, self->r.l.slots_off - HEADER_BYTES);
    return 0;
}

static void spill_drop(Writer *self, uint32_t slot) {
    spill_t *sp = &self->spill[slot];
    sp->n = 0;
    sp->finish = FIN_NONE;
}

/* Queue a slot for notification at the end of this turn. A slot is queued at most once per turn
 * (its private mark), so `touched` never holds more than total_slots entries, however many rows
 * of one frame name the same rid. */
static inline void notify_slot(Writer *self, uint32_t slot) {
    if (self->touched_mark[slot]) return;
    self->touched_mark[slot] = 1;
    self->touched[self->touched_n++] = slot;
}

static inline void touch_worker(Writer *self, uint32_t w) {
    if (!self->worker_touched[w]) {
        self->worker_touched[w] = 1;
        self->touched_workers[self->touched_workers_n++] = w;
    }
}

/*
 * Publish queued notifications: each touched slot goes on its worker's notify ring unless it
 * already has an entry there, then each worker's head is released.
 *
 * THE NOTIFY RING INVARIANT: a slot has at most one entry outstanding on its worker's ring, so
 * head - tail <= slots_per_worker and a ring of slots_per_worker entries never overflows.
 * Why it holds: the writer pushes an entry for a slot only when it flips the slot's `notified`
 * flag from 0 to 1 (the exchange below); the reader clears the flag only after it has consumed
 * that entry, i.e. copied it out of the ring AND published a tail past it (reader_poll). So
 * while an entry for a slot is between tail and head, its flag is 1 and no second entry can be
 * pushed. The acquire on the exchange pairs with the reader's release fence before it clears
 * the flag: having seen the flag at 0, the writer also sees the tail that consumed the entry.
 *
 * The writer does not trust it: before storing an entry it checks the reader's tail (acquire,
 * cached until the ring looks full). If the ring is full anyway (a reader that broke the
 * protocol, or a corrupted control block), the entry is not stored (that would overwrite one
 * the reader has not read), the overflow is counted, the slot's flag goes back to 0, and the
 * worker's `rescan` flag tells its reader to read every slot on its next poll; the worker is
 * woken like any notified worker. Nothing is lost silently.
 */
static void publish_notifications(Writer *self) {
    if (self->touched_n == 0) return;
    region_t *r = &self->r;
    /* Pairs with the reader's seq_cst fence between clearing `notified` and loading write_seq:
     * if our exchange below still sees the flag set, the reader is guaranteed to see our
     * writes (write_seq, state) when it reads the slot. */
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t spw = r->l.slots_per_worker;
    for (uint32_t i = 0; i < self->touched_n; i++) {
        uint32_t slot = self->touched[i];
        self->touched_mark[slot] = 0;
        slot_a_t *a = slot_a(r, slot);
        if (atomic_exchange_explicit(&a->notified, 1, memory_order_acquire) != 0) continue;
        uint32_t w = slot / spw;
        worker_ctl_t *ctl = worker_ctl(r, w);
        uint64_t head = self->pending_head[w];
        if (head - self->tail_seen[w] >= spw) {
            /* Acquire: the reader has copied out every entry before the tail it published, so
             * the cells we are about to reuse are no longer read. */
            self->tail_seen[w] = atomic_load_explicit(&ctl->tail, memory_order_acquire);
            if (head - self->tail_seen[w] >= spw) {
                self->notify_overflows++;
                atomic_store_explicit(&a->notified, 0, memory_order_relaxed);
                /* Release: a reader that sees the request for a rescan sees the slot's news. */
                atomic_store_explicit(&ctl->rescan, 1, memory_order_release);
                touch_worker(self, w);
                continue;
            }
        }
        notify_ring(r, w)[head % spw] = slot % spw;
        self->pending_head[w] = head + 1;
        touch_worker(self, w);
    }
    for (uint32_t i = 0; i < self->touched_workers_n; i++) {
        uint32_t w = self->touched_workers[i];
        /* Release: the entries (and the slots' news before them) happen-before a reader's
         * acquire load of head. */
        atomic_store_explicit(&worker_ctl(r, w)->head, self->pending_head[w], memory_order_release);
    }
    self->touched_n = 0;
}

static int slot_in_range(Writer *self, long long slot) {
    if (slot < 0 || slot >= (long long)self->total_slots) {
        PyErr_Format(PyExc_ValueError, "slot %lld out of range", slot);
        return 0;
    }
    return 1;
}

/* Terminal write: counts, then the finish code, then state DONE (release). */
static void publish_done(Writer *self, uint32_t slot, uint32_t finish) {
    slot_a_t *a = slot_a(&self->r, slot);
    atomic_store_explicit(&a->finish, finish, memory_order_relaxed);
    atomic_store_explicit(&a->state, SLOT_DONE, memory_order_release);
    notify_slot(self, slot);
}

/* Bind (writer.h); the caller checked slot, ticket and engine_index. */
static int bind_slot(Writer *self, const uint8_t *rid, uint32_t rid_len, uint32_t s,
                     uint64_t ticket, int with_logprobs, uint32_t dup_code, int32_t engine_index) {
    region_t *r = &self->r;
    /* The worker gave this slot up; drop anything still tied to its previous request. */
    ridmap_remove_slot(&self->rids, s);
    spill_drop(self, s);
    slot_a_t *a = slot_a(r, s);
    atomic_store_explicit(&a->state, SLOT_IDLE, memory_order_relaxed);
    atomic_store_explicit(&a->write_seq, 0, memory_order_relaxed);
    atomic_store_explicit(&a->finish, FIN_NONE, memory_order_relaxed);
    atomic_store_explicit(&a->prompt_tokens, 0, memory_order_relaxed);
    atomic_store_explicit(&a->completion_tokens, 0, memory_order_relaxed);
    atomic_store_explicit(&a->cached_tokens, 0, memory_order_relaxed);
    atomic_store_explicit(&a->engine_index, -1, memory_order_relaxed);
    atomic_store_explicit(&a->flags, with_logprobs ? 1u : 0u, memory_order_relaxed);
    atomic_store_explicit(&a->spilled, 0, memory_order_relaxed);
    atomic_store_explicit(&a->state, SLOT_LIVE, memory_order_relaxed);
    /* A reader that sees the new generation sees the reset header. */
    atomic_store_explicit(&a->generation, ticket, memory_order_release);

    if (ridmap_lookup(&self->rids, rid, rid_len) >= 0) {
        publish_done(self, s, dup_code);
        publish_notifications(self);
        return 0;
    }
    if (ridmap_insert(&self->rids, rid, rid_len, s) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->owner[s] = engine_index;
    return 1;
}

static PyObject *writer_bind(Writer *self, PyObject *args) {
    const char *rid;
    Py_ssize_t rid_len;
    long long slot;
    unsigned long long ticket;
    int with_logprobs;
    unsigned int dup_code;
    int engine_index;
    if (!PyArg_ParseTuple(args, "y#LKpIi", &rid, &rid_len, &slot, &ticket, &with_logprobs,
                          &dup_code, &engine_index))
        return NULL;
    if (!slot_in_range(self, slot)) return NULL;
    if (engine_index < -1 || engine_index > FRAME_MAX_ENGINE_INDEX) {
        PyErr_Format(PyExc_ValueError, "engine_index %d out of range [-1, 65535]", engine_index);
        return NULL;
    }
    if (ticket == 0) {
        PyErr_SetString(PyExc_ValueError, "ticket 0 is reserved");
        return NULL;
    }
    if (rid_len > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "rid too long");
        return NULL;
    }
    int rc = bind_slot(self, (const uint8_t *)rid, (uint32_t)rid_len, (uint32_t)slot, ticket,
                       with_logprobs, dup_code, engine_index);
    if (rc < 0) return NULL;
    return PyBool_FromLong(rc);
}

/* ------------------------------------------------------------------ for the native turn */

int writer_c_bind(PyObject *w, const uint8_t *rid, uint32_t rid_len, uint32_t slot,
                  uint64_t ticket, int with_logprobs, uint32_t dup_code, int32_t engine_index) {
    return bind_slot((Writer *)w, rid, rid_len, slot, ticket, with_logprobs, dup_code,
                     engine_index);
}

int writer_c_bound(PyObject *w, const uint8_t *rid, uint32_t rid_len) {
    return ridmap_lookup(&((Writer *)w)->rids, rid, rid_len) >= 0;
}

region_t *writer_c_region(PyObject *w) { return &((Writer *)w)->r; }

uint32_t writer_c_total_slots(PyObject *w) { return ((Writer *)w)->total_slots; }

static PyObject *writer_unbind(Writer *self, PyObject *arg) {
    long long slot = PyLong_AsLongLong(arg);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    if (!slot_in_range(self, slot)) return NULL;
    int was = ridmap_bound(&self->rids, (uint32_t)slot);
    ridmap_remove_slot(&self->rids, (uint32_t)slot);
    spill_drop(self, (uint32_t)slot);
    return PyBool_FromLong(was);
}

static PyObject *writer_finish(Writer *self, PyObject *args) {
    long long slot;
    unsigned int code;
    int engine_index;
    if (!PyArg_ParseTuple(args, "LIi", &slot, &code, &engine_index)) return NULL;
    if (!slot_in_range(self, slot)) return NULL;
    uint32_t s = (uint32_t)slot;
    int was = ridmap_bound(&self->rids, s);
    ridmap_remove_slot(&self->rids, s);
    slot_a_t *a = slot_a(&self->r, s);
    if (atomic_load_explicit(&a->state, memory_order_relaxed) != SLOT_LIVE) Py_RETURN_FALSE;
    if (engine_index >= 0) atomic_store_explicit(&a->engine_index, engine_index, memory_order_relaxed);
    spill_t *sp = &self->spill[s];
    if (sp->n > 0) {
        sp->finish = code; /* published after the spilled tokens */
    } else {
        publish_done(self, s, code);
        publish_notifications(self);
    }
    return PyBool_FromLong(was);
}

static int spill_push(Writer *self, uint32_t slot, int32_t tok, float lpv, int32_t lpi) {
    spill_t *sp = &self->spill[slot];
    if (sp->n == sp->cap) {
        /* The cap stays below 2**31 tokens (8 GiB of spill per slot across its three arrays):
         * past that, refuse like any failed allocation rather than wrap the u32. */
        if (sp->cap >= SPILL_MAX_TOKENS) return -1;
        size_t ncap = sp->cap ? (size_t)sp->cap * 2 : 64;
        int32_t *t = realloc(sp->tok, ncap * sizeof(int32_t));
        if (!t) return -1;
        sp->tok = t;
        float *v = realloc(sp->lpv, ncap * sizeof(float));
        if (!v) return -1;
        sp->lpv = v;
        int32_t *ix = realloc(sp->lpi, ncap * sizeof(int32_t));
        if (!ix) return -1;
        sp->lpi = ix;
        sp->cap = (uint32_t)ncap;
    }
    sp->tok[sp->n] = tok;
    sp->lpv[sp->n] = lpv;
    sp->lpi[sp->n] = lpi;
    sp->n++;
    if (!sp->listed) {
        sp->listed = 1;
        self->spill_list[self->spill_count++] = slot;
    }
    return 0;
}

/* Move spilled tokens into the ring as far as the reader has made room. Returns 1 when the
 * spill is empty afterwards. */
static int spill_flush_one(Writer *self, uint32_t slot) {
    region_t *r = &self->r;
    spill_t *sp = &self->spill[slot];
    slot_a_t *a = slot_a(r, slot);
    uint32_t cap = r->l.ring_capacity;
    uint64_t ws = atomic_load_explicit(&a->write_seq, memory_order_relaxed);
    /* Acquire: pairs with the reader's release of read_seq after it copied its tokens out, so
     * the cells below read_seq + cap are free to overwrite. */
    uint64_t rs = atomic_load_explicit(&slot_b(r, slot)->read_seq, memory_order_acquire);
    uint64_t room = cap - (ws - rs);
    uint32_t k = sp->n < room ? sp->n : (uint32_t)room;
    if (k > 0) {
        int32_t *tok = slot_tokens(r, slot);
        float *lpv = slot_lpv(r, slot);
        int32_t *lpi = slot_lpi(r, slot);
        for (uint32_t j = 0; j < k; j++) {
            uint64_t at = (ws + j) % cap;
            tok[at] = sp->tok[j];
            lpv[at] = sp->lpv[j];
            lpi[at] = sp->lpi[j];
        }
        memmove(sp->tok, sp->tok + k, (sp->n - k) * sizeof(int32_t));
        memmove(sp->lpv, sp->lpv + k, (sp->n - k) * sizeof(float));
        memmove(sp->lpi, sp->lpi + k, (sp->n - k) * sizeof(int32_t));
        sp->n -= k;
    }
    if (sp->n == 0) {
        atomic_store_explicit(&a->prompt_tokens, sp->prompt, memory_order_relaxed);
        atomic_store_explicit(&a->completion_tokens, sp->completion, memory_order_relaxed);
        atomic_store_explicit(&a->cached_tokens, sp->cached, memory_order_relaxed);
        atomic_store_explicit(&a->engine_index, sp->engine_index, memory_order_relaxed);
    }
    if (k > 0) {
        /* Release: the tokens and counts above happen-before a reader's acquire of write_seq. */
        atomic_store_explicit(&a->write_seq, ws + k, memory_order_release);
        notify_slot(self, slot);
    }
    if (sp->n == 0 && sp->finish != FIN_NONE) {
        uint32_t fin = sp->finish;
        sp->finish = FIN_NONE;
        publish_done(self, slot, fin);
    }
    return sp->n == 0;
}

static PyObject *writer_flush_spills(Writer *self, PyObject *unused) {
    uint32_t keep = 0;
    for (uint32_t i = 0; i < self->spill_count; i++) {
        uint32_t slot = self->spill_list[i];
        spill_t *sp = &self->spill[slot];
        if (sp->n == 0 && sp->finish == FIN_NONE) {
            sp->listed = 0;
            continue;
        }
        if (spill_flush_one(self, slot)) {
            sp->listed = 0;
        } else {
            self->spill_list[keep++] = slot;
        }
    }
    self->spill_count = keep;
    publish_notifications(self);
    return PyLong_FromUnsignedLong(keep);
}

/* The engine's row hints, sized for `nrows` rows; NULL if no memory (lookups then hash). */
static hint_t *hints_for(Writer *self, int32_t engine_index, uint32_t nrows) {
    hint_t *h = NULL;
    for (uint32_t i = 0; i < HINT_ENGINES; i++) {
        if (self->hints[i].engine_index == engine_index) {
            h = &self->hints[i];
            break;
        }
    }
    if (!h) {
        h = &self->hints[self->hint_next++ % HINT_ENGINES];
        h->engine_index = engine_index;
        if (h->slot1) memset(h->slot1, 0, (size_t)h->cap * sizeof(uint32_t));
    }
    if (nrows > h->cap) {
        if (nrows > HINT_MAX_ROWS) return NULL;
        uint32_t *grown = realloc(h->slot1, (size_t)nrows * sizeof(uint32_t));
        if (!grown) return NULL;
        memset(grown + h->cap, 0, (size_t)(nrows - h->cap) * sizeof(uint32_t));
        h->slot1 = grown;
        h->cap = nrows;
    }
    return h;
}

/* The frame's load tail into row `row` of the engine table (words E_RUNNING .. E_LOAD_MS_HI:
 * the four figures, then the time it was read in CLOCK_MONOTONIC ms, the clock of Python's
 * time.monotonic()). Advisory words (DESIGN.md, "Memory-ordering rules"): single aligned u32
 * stores, little-endian as the table is. frame_parse refused any figure outside u32. */
static void publish_tail(Writer *self, uint32_t row, const frame_tail_t *tail) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    uint32_t words[6] = {(uint32_t)tail->running, (uint32_t)tail->waiting,
                         (uint32_t)tail->kv_active, (uint32_t)tail->kv_total,
                         (uint32_t)(ms & 0xFFFFFFFFu), (uint32_t)(ms >> 32)};
    uint8_t *at = self->r.base + self->r.l.engines_off + (uint64_t)row * ENGINE_BYTES;
    for (int i = 0; i < 6; i++) {
        uint32_t v = words[i];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
#endif
        atomic_store_explicit((_Atomic uint32_t *)(at + 4u * (E_RUNNING + i)), v,
                              memory_order_relaxed);
    }
}

static PyObject *writer_ingest(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "ingest(frame, engine_index=0, table_row=-1)");
        return NULL;
    }
    PyObject *arg = args[0];
    long long default_index = 0;
    if (nargs >= 2) {
        default_index = PyLong_AsLongLong(args[1]);
        if (default_index == -1 && PyErr_Occurred()) return NULL;
        if (default_index < 0 || default_index > FRAME_MAX_ENGINE_INDEX) {
            PyErr_Format(PyExc_ValueError, "engine_index %lld out of range [0, 65535]",
                         default_index);
            return NULL;
        }
    }
    long long table_row = -1;
    if (nargs == 3) {
        table_row = PyLong_AsLongLong(args[2]);
        if (table_row == -1 && PyErr_Occurred()) return NULL;
        if (table_row < -1 || table_row >= (long long)self->r.l.max_engines) {
            PyErr_Format(PyExc_ValueError, "table_row %lld out of range [-1, %u)", table_row,
                         self->r.l.max_engines);
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *data = view.buf;
    if (view.len == 16 && memcmp(data, "ENGINE_CORE_DEAD", 16) == 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    cur_t c = {data, data + view.len, NULL};
    uint32_t nrows = 0;
    frame_tail_t tail;
    if (frame_parse(&self->frame, &c, &nrows, &tail, default_index) < 0) {
        PyBuffer_Release(&view);
        PyErr_Format(WireDecodeError, "invalid BatchTokenIDOutSlim frame (%zd bytes): %s",
                     (Py_ssize_t)(c.end - data), c.err ? c.err : "malformed");
        return NULL;
    }
    /* Pass 2: apply. Nothing below can fail on the frame's content. */
    region_t *r = &self->r;
    uint32_t cap = r->l.ring_capacity;
    PyObject *finished = PyList_New(0);
    if (!finished) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint32_t unknown = 0;
    hint_t *hint = nrows ? hints_for(self, (int32_t)default_index, nrows) : NULL;
    for (uint32_t i = 0; i < nrows; i++) {
        row_t *row = &self->frame.rows[i];
        int64_t bound = -1;
        if (hint && hint->slot1[i] &&
            ridmap_holds(&self->rids, hint->slot1[i] - 1, row->rid, row->rid_len))
            bound = (int64_t)hint->slot1[i] - 1;
        else
            bound = ridmap_lookup(&self->rids, row->rid, row->rid_len);
        if (hint) hint->slot1[i] = bound < 0 ? 0 : (uint32_t)bound + 1;
        if (bound < 0 || self->owner[bound] != (int32_t)default_index) {
            /* Aborted locally, or not ours (the engine may still be flushing it), or sent to
             * another engine: a row from this socket never touches that engine's stream. */
            unknown++;
            continue;
        }
        uint32_t slot = (uint32_t)bound;
        slot_a_t *a = slot_a(r, slot);
        /* No slot spills (the common case): its spill record is not read (one cache line less
         * a row). A slot that starts spilling below is listed, so the count is then non-zero. */
        spill_t *sp = &self->spill[slot];
        uint64_t ws = atomic_load_explicit(&a->write_seq, memory_order_relaxed);
        /* Acquire: pairs with the reader's release of read_seq (see spill_flush_one). */
        uint64_t rs = atomic_load_explicit(&slot_b(r, slot)->read_seq, memory_order_acquire);
        uint64_t room = (self->spill_count && sp->n) ? 0 : cap - (ws - rs);
        /* Logprobs are stored only for a request that asked for them (the reader reads them
         * only then): two cache lines less a row for the others. */
        int with_lp = atomic_load_explicit(&a->flags, memory_order_relaxed) & 1u;
        cur_t t = {row->out, c.end, NULL}, v = {row->lpv, c.end, NULL}, x = {row->lpi, c.end, NULL};
        int32_t *tok = slot_tokens(r, slot);
        float *lpv = slot_lpv(r, slot);
        int32_t *lpi = slot_lpi(r, slot);
        uint32_t written = 0;
        for (uint32_t j = 0; j < row->out_n; j++) {
            int64_t tv, iv = 0;
            double dv = 0.0;
            rd_int(&t, &tv);
            if (row->lpv_n) {
                rd_num(&v, &dv);
                rd_int(&x, &iv);
            }
            if (written < room) {
                uint64_t pos = (ws + written) % cap;
                tok[pos] = (int32_t)tv;
                if (with_lp) {
                    lpv[pos] = (float)dv;
                    lpi[pos] = (int32_t)iv;
                }
                written++;
            } else {
                if (spill_push(self, slot, (int32_t)tv, (float)dv, (int32_t)iv) < 0) {
                    PyBuffer_Release(&view);
                    Py_DECREF(finished);
                    return PyErr_NoMemory();
                }
                self->spilled_tokens++;
                atomic_fetch_add_explicit(&a->spilled, 1, memory_order_relaxed);
            }
        }
        self->tokens += row->out_n;
        int spilling = self->spill_count && sp->n;
        if (spilling) {
            /* Counts go out with the last spilled token, so they never run ahead of it. */
            sp->prompt = (uint32_t)row->prompt;
            sp->completion = (uint32_t)row->completion;
            sp->cached = (uint32_t)row->cached;
            sp->engine_index = (int32_t)tail.engine_index;
        } else {
            atomic_store_explicit(&a->prompt_tokens, (uint32_t)row->prompt, memory_order_relaxed);
            atomic_store_explicit(&a->completion_tokens, (uint32_t)row->completion,
                                  memory_order_relaxed);
            atomic_store_explicit(&a->cached_tokens, (uint32_t)row->cached, memory_order_relaxed);
            atomic_store_explicit(&a->engine_index, (int32_t)tail.engine_index, memory_order_relaxed);
        }
        /* Tokens and counts happen-before a reader's acquire load of write_seq. */
        atomic_store_explicit(&a->write_seq, ws + written, memory_order_release);
        if (row->finish != FIN_NONE) {
            ridmap_remove_slot(&self->rids, slot);
            if (spilling) {
                sp->finish = row->finish; /* published after the spilled tokens */
            } else {
                /* Release, after the last write_seq: a reader that acquires DONE sees every
                 * token and the finish code. */
                atomic_store_explicit(&a->finish, row->finish, memory_order_relaxed);
                atomic_store_explicit(&a->state, SLOT_DONE, memory_order_release);
            }
            PyObject *s = PyLong_FromUnsignedLong(slot);
            if (!s || PyList_Append(finished, s) < 0) {
                Py_XDECREF(s);
                Py_DECREF(finished);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(s);
        }
        if (written || row->finish != FIN_NONE) notify_slot(self, slot);
    }
    publish_notifications(self);
    /* A frame with no tail says kv_total 0 (the engine table keeps the last one). */
    if (table_row >= 0 && tail.kv_total) publish_tail(self, (uint32_t)table_row, &tail);
    self->frames++;
    self->rows_total += nrows;
    self->unknown_rows += unknown;
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLLLLIIN)", (long long)tail.engine_index, (long long)tail.running,
                         (long long)tail.waiting, (long long)tail.kv_active,
                         (long long)tail.kv_total, nrows, unknown, finished);
}

static PyObject *writer_set_worker_fd(Writer *self, PyObject *args) {
    unsigned int w;
    int fd;
    if (!PyArg_ParseTuple(args, "Ii", &w, &fd)) return NULL;
    if (w >= self->r.l.num_workers) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return NULL;
    }
    self->wake_fd[w] = fd;
    Py_RETURN_NONE;
}

/* Wake every worker that got a notification since the last call and has published that it is
 * parked: at most one eventfd write per worker per call. */
static uint32_t wake_workers(Writer *self) {
    region_t *r = &self->r;
    uint32_t writes = 0;
    /* Counters first: a worker woken below must see the state that woke it. */
    publish_stats(self);
    if (self->touched_workers_n) {
        /* Pairs with the reader's fence between setting `parked` and loading `head`. */
        atomic_thread_fence(memory_order_seq_cst);
        for (uint32_t i = 0; i < self->touched_workers_n; i++) {
            uint32_t w = self->touched_workers[i];
            self->worker_touched[w] = 0;
            worker_ctl_t *ctl = worker_ctl(r, w);
            if (atomic_load_explicit(&ctl->parked, memory_order_relaxed) == 0) continue;
            if (atomic_exchange_explicit(&ctl->parked, 0, memory_order_relaxed) == 0) continue;
            int fd = self->wake_fd[w];
            if (fd >= 0) {
                uint64_t one = 1;
                ssize_t rc;
                do {
                    rc = write(fd, &one, sizeof one);
                } while (rc < 0 && errno == EINTR);
                /* EAGAIN means the counter is already non-zero: the worker is awake anyway. */
                writes++;
                atomic_fetch_add_explicit(&ctl->wakes, 1, memory_order_relaxed);
            }
        }
        self->touched_workers_n = 0;
    }
    self->wakes += writes;
    return writes;
}

static PyObject *writer_wake(Writer *self, PyObject *unused) {
    return PyLong_FromUnsignedLong(wake_workers(self));
}

uint32_t writer_c_wake(PyObject *w) { return wake_workers((Writer *)w); }

/* A worker left (or crashed): forget every request of its slots and zero its control block. */
static PyObject *writer_reset_worker(Writer *self, PyObject *arg) {
    long w = PyLong_AsLong(arg);
    if (w == -1 && PyErr_Occurred()) return NULL;
    region_t *r = &self->r;
    if (w < 0 || (uint32_t)w >= r->l.num_workers) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return NULL;
    }
    uint32_t spw = r->l.slots_per_worker;
    for (uint32_t i = 0; i < spw; i++) {
        uint32_t slot = (uint32_t)w * spw + i;
        ridmap_remove_slot(&self->rids, slot);
        spill_drop(self, slot);
        slot_a_t *a = slot_a(r, slot);
        atomic_store_explicit(&a->generation, 0, memory_order_relaxed);
        atomic_store_explicit(&a->state, SLOT_IDLE, memory_order_relaxed);
        atomic_store_explicit(&a->notified, 0, memory_order_relaxed);
        atomic_store_explicit(&slot_b(r, slot)->read_seq, 0, memory_order_relaxed);
    }
    /* Touched lists may still name this worker's slots; drop them. */
    uint32_t keep = 0;
    for (uint32_t i = 0; i < self->touched_n; i++) {
        uint32_t slot = self->touched[i];
        if (slot / spw != (uint32_t)w) self->touched[keep++] = slot;
        else self->touched_mark[slot] = 0;
    }
    self->touched_n = keep;
    worker_ctl_t *ctl = worker_ctl(r, (uint32_t)w);
    atomic_store_explicit(&ctl->head, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->tail, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->parked, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->wakes, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->rescan, 0, memory_order_relaxed);
    self->pending_head[w] = 0;
    self->tail_seen[w] = 0;
    self->wake_fd[w] = -1;
    /* The next worker on this number maps the region only after the I/O process answers its
     * attach (a socket round trip), which orders these stores; the fence documents the intent. */
    atomic_thread_fence(memory_order_release);
    Py_RETURN_NONE;
}

/* Counters the workers can read (header + 64: u64 words, see tsfront/ipc/region.py METRICS). */
#define METRICS_OFF 64
static void publish_stats(Writer *self) {
    _Atomic uint64_t *m = (_Atomic uint64_t *)(self->r.base + METRICS_OFF);
    atomic_store_explicit(&m[0], self->frames, memory_order_relaxed);
    atomic_store_explicit(&m[1], self->rows_total, memory_order_relaxed);
    atomic_store_explicit(&m[2], self->tokens, memory_order_relaxed);
    atomic_store_explicit(&m[3], self->unknown_rows, memory_order_relaxed);
    atomic_store_explicit(&m[4], self->spilled_tokens, memory_order_relaxed);
    atomic_store_explicit(&m[5], self->wakes, memory_order_relaxed);
    atomic_store_explicit(&m[6], self->rids.used, memory_order_relaxed);
    atomic_store_explicit(&m[7], self->spill_count, memory_order_relaxed);
    atomic_store_explicit(&m[8], self->notify_overflows, memory_order_relaxed);
}

static PyObject *writer_spilling(Writer *self, PyObject *unused) {
    return PyLong_FromUnsignedLong(self->spill_count);
}

static PyObject *writer_stats(Writer *self, PyObject *unused) {
    return Py_BuildValue("{sKsKsKsKsKsKsIsIsK}", "frames", self->frames, "rows", self->rows_total,
                         "unknown_rows", self->unknown_rows, "tokens", self->tokens,
                         "spilled_tokens", self->spilled_tokens, "wakes", self->wakes,
                         "bound", self->rids.used, "spilling_slots", self->spill_count,
                         "notify_overflows", self->notify_overflows);
}

static PyMethodDef writer_methods[] = {
    {"bind", (PyCFunction)writer_bind, METH_VARARGS,
     "bind(rid: bytes, slot, ticket, with_logprobs, dup_code, engine_index) -> bool\n\nActivate "
     "a slot for a request sent to engine engine_index (-1: none): ingest applies its rows only "
     "from that engine's socket. False (and the slot finished with dup_code) if the rid is "
     "already bound."},
    {"unbind", (PyCFunction)writer_unbind, METH_O,
     "unbind(slot) -> bool: forget the slot's request (its worker aborted it)."},
    {"finish", (PyCFunction)writer_finish, METH_VARARGS,
     "finish(slot, code, engine_index) -> bool: end a live slot with a local terminal code."},
    {"ingest", (PyCFunction)(void (*)(void))writer_ingest, METH_FASTCALL,
     "ingest(frame, engine_index=0, table_row=-1) -> (engine_index, running, waiting, "
     "kv_active, kv_total, rows, unknown, finished_slots) | None\n\nApply one output frame; "
     "None for ENGINE_CORE_DEAD. engine_index is the engine whose socket it came from: a row "
     "whose rid was bound to another engine counts as unknown; also the index reported when "
     "the frame does not say (the 9-element form). table_row >= 0: a frame with a load tail "
     "(kv_total > 0) also writes it, with the time in CLOCK_MONOTONIC ms, into that row of the "
     "engine table (words E_RUNNING .. E_LOAD_MS_HI)."},
    {"flush_spills", (PyCFunction)writer_flush_spills, METH_NOARGS,
     "flush_spills() -> int: move spilled tokens into rings with room; slots still spilling."},
    {"set_worker_fd", (PyCFunction)writer_set_worker_fd, METH_VARARGS,
     "set_worker_fd(worker, fd): the eventfd that wakes a worker."},
    {"wake", (PyCFunction)writer_wake, METH_NOARGS,
     "wake() -> int: write the eventfd of each notified, parked worker; the number written."},
    {"reset_worker", (PyCFunction)writer_reset_worker, METH_O,
     "reset_worker(worker): forget a departed worker's requests and zero its slots."},
    {"stats", (PyCFunction)writer_stats, METH_NOARGS, "stats() -> dict of counters."},
    {"spilling", (PyCFunction)writer_spilling, METH_NOARGS,
     "spilling() -> int: slots whose tokens wait in the spill path."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The I/O process's side of the slot region: binds requests, ingests output frames.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
};
