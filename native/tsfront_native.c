/*
 * tsfront._native: the shared-memory slot rings and the I/O process's output hot path.
 *
 * One region of shared memory (a memfd mapped by the I/O process and by every worker) holds
 * a header, one control block and one notify ring per worker, and one slot per request the
 * worker can have in flight. A slot is written only by the I/O process (its "Writer") and read
 * only by the worker that owns it (its "Reader"); nothing is locked, ordering comes from C11
 * atomics. The layout and its ordering rules are described in docs/DESIGN.md; `layout()` below
 * is the single source of truth for offsets.
 *
 * The Writer parses each BatchTokenIDOutSlim frame straight from the ZMQ buffer (a two-pass
 * msgpack walk: validate everything, then apply), maps each rid to its slot with an
 * open-addressing table, appends the delta tokens to the slot's ring (spilling to private
 * memory when a reader lags), queues the slot on its worker's notify ring once, and wakes a
 * worker through its eventfd only if that worker has published that it is parked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define ABI_VERSION 1
#define REGION_MAGIC 0x74736672696e6731ULL /* "tsfring1" */
#define HEADER_BYTES 4096
#define ENGINE_BYTES 64
#define WORKER_BYTES 128
#define SLOT_HEADER_BYTES 128
#define MAX_DEPTH 32

/* Slot states (slot_a.state). */
enum { SLOT_IDLE = 0, SLOT_LIVE = 1, SLOT_DONE = 2 };

/* Finish codes (slot_a.finish). 1..4 come from the engine, 16.. are local terminal reasons. */
enum {
    FIN_NONE = 0,
    FIN_STOP = 1,
    FIN_LENGTH = 2,
    FIN_ABORT = 3,
    FIN_OTHER = 4,
};

typedef struct {
    uint64_t magic;
    uint32_t abi;
    uint32_t num_workers;
    uint32_t slots_per_worker;
    uint32_t ring_capacity;
    uint32_t max_engines;
    uint32_t pad0;
    uint64_t total_bytes;
} region_header_t;

/* Line written by the I/O process. */
typedef struct {
    _Atomic uint64_t generation; /* ticket of the request bound to this slot */
    _Atomic uint64_t write_seq;  /* tokens published since the slot was bound */
    _Atomic uint32_t state;
    _Atomic uint32_t finish;
    _Atomic uint32_t prompt_tokens;
    _Atomic uint32_t completion_tokens;
    _Atomic uint32_t cached_tokens;
    _Atomic int32_t engine_index;
    _Atomic uint32_t flags; /* bit 0: the request carries logprobs */
    _Atomic uint32_t notified; /* 1 while the slot sits on its worker's notify ring */
    _Atomic uint64_t spilled;  /* tokens that went through the spill path (a counter) */
} slot_a_t;

/* Line written by the worker. */
typedef struct {
    _Atomic uint64_t read_seq;
} slot_b_t;

typedef struct {
    _Atomic uint64_t head;  /* I/O: next notify entry to write */
    _Atomic uint64_t wakes; /* I/O: eventfd writes made to this worker */
    uint8_t pad[48];
    _Atomic uint64_t tail;   /* worker: next notify entry to read */
    _Atomic uint32_t parked; /* worker sets 1 before waiting on its eventfd; I/O clears */
    uint8_t pad2[52];
} worker_ctl_t;

typedef struct {
    uint64_t total_bytes;
    uint64_t engines_off;
    uint64_t workers_off;
    uint64_t notify_off;
    uint64_t slots_off;
    uint64_t slot_bytes;
    uint64_t tokens_off; /* within a slot */
    uint64_t lpv_off;
    uint64_t lpi_off;
    uint32_t num_workers, slots_per_worker, ring_capacity, max_engines;
} layout_t;

static PyObject *WireDecodeError = NULL;

static uint64_t align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

static int compute_layout(layout_t *l, uint32_t workers, uint32_t spw, uint32_t cap, uint32_t engines) {
    if (workers == 0 || spw == 0 || cap == 0 || engines == 0 || workers > 4096 || spw > (1u << 20) ||
        cap > (1u << 20) || engines > 65536) {
        PyErr_SetString(PyExc_ValueError, "layout parameters out of range");
        return -1;
    }
    l->num_workers = workers;
    l->slots_per_worker = spw;
    l->ring_capacity = cap;
    l->max_engines = engines;
    l->engines_off = HEADER_BYTES;
    l->workers_off = align64(l->engines_off + (uint64_t)engines * ENGINE_BYTES);
    l->notify_off = align64(l->workers_off + (uint64_t)workers * WORKER_BYTES);
    l->slots_off = align64(l->notify_off + (uint64_t)workers * spw * 4);
    l->tokens_off = SLOT_HEADER_BYTES;
    l->lpv_off = l->tokens_off + (uint64_t)cap * 4;
    l->lpi_off = l->lpv_off + (uint64_t)cap * 4;
    l->slot_bytes = align64(l->lpi_off + (uint64_t)cap * 4);
    l->total_bytes = l->slots_off + (uint64_t)workers * spw * l->slot_bytes;
    return 0;
}

static PyObject *layout_dict(const layout_t *l) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsIsIsIsI}", "total_bytes", l->total_bytes, "engines_off",
                         l->engines_off, "workers_off", l->workers_off, "notify_off", l->notify_off,
                         "slots_off", l->slots_off, "slot_bytes", l->slot_bytes, "tokens_off",
                         l->tokens_off, "lpv_off", l->lpv_off, "lpi_off", l->lpi_off, "num_workers",
                         l->num_workers, "slots_per_worker", l->slots_per_worker, "ring_capacity",
                         l->ring_capacity, "max_engines", l->max_engines);
}

static PyObject *py_layout(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_workers", "slots_per_worker", "ring_capacity", "max_engines", NULL};
    unsigned int w, s, c, e;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIII", kwlist, &w, &s, &c, &e)) return NULL;
    layout_t l;
    if (compute_layout(&l, w, s, c, e) < 0) return NULL;
    return layout_dict(&l);
}

/* ------------------------------------------------------------------------------------------ */
/* The mapped region, shared by Writer and Reader objects.                                     */

typedef struct {
    Py_buffer view;
    uint8_t *base;
    layout_t l;
} region_t;

static int region_open(region_t *r, PyObject *buffer, uint32_t w, uint32_t s, uint32_t c,
                       uint32_t e, int init) {
    if (compute_layout(&r->l, w, s, c, e) < 0) return -1;
    if (PyObject_GetBuffer(buffer, &r->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if ((uint64_t)r->view.len < r->l.total_bytes) {
        PyBuffer_Release(&r->view);
        PyErr_Format(PyExc_ValueError, "shared memory is %zd bytes; the layout needs %llu",
                     r->view.len, (unsigned long long)r->l.total_bytes);
        return -1;
    }
    r->base = (uint8_t *)r->view.buf;
    if (((uintptr_t)r->base & 63) != 0) {
        PyBuffer_Release(&r->view);
        PyErr_SetString(PyExc_ValueError, "shared memory must be 64-byte aligned");
        return -1;
    }
    region_header_t *h = (region_header_t *)r->base;
    if (init) {
        memset(r->base, 0, HEADER_BYTES);
        h->abi = ABI_VERSION;
        h->num_workers = w;
        h->slots_per_worker = s;
        h->ring_capacity = c;
        h->max_engines = e;
        h->total_bytes = r->l.total_bytes;
        atomic_thread_fence(memory_order_release);
        h->magic = REGION_MAGIC;
    } else {
        atomic_thread_fence(memory_order_acquire);
        if (h->magic != REGION_MAGIC || h->abi != ABI_VERSION || h->num_workers != w ||
            h->slots_per_worker != s || h->ring_capacity != c || h->max_engines != e) {
            PyBuffer_Release(&r->view);
            PyErr_SetString(PyExc_ValueError,
                            "shared memory does not hold a tsfront region of this layout "
                            "(I/O process and worker from different tsfront versions?)");
            return -1;
        }
    }
    return 0;
}

static inline worker_ctl_t *worker_ctl(region_t *r, uint32_t w) {
    return (worker_ctl_t *)(r->base + r->l.workers_off + (uint64_t)w * WORKER_BYTES);
}
static inline uint32_t *notify_ring(region_t *r, uint32_t w) {
    return (uint32_t *)(r->base + r->l.notify_off + (uint64_t)w * r->l.slots_per_worker * 4);
}
static inline uint8_t *slot_ptr(region_t *r, uint32_t slot) {
    return r->base + r->l.slots_off + (uint64_t)slot * r->l.slot_bytes;
}
static inline slot_a_t *slot_a(region_t *r, uint32_t slot) { return (slot_a_t *)slot_ptr(r, slot); }
static inline slot_b_t *slot_b(region_t *r, uint32_t slot) {
    return (slot_b_t *)(slot_ptr(r, slot) + 64);
}
static inline int32_t *slot_tokens(region_t *r, uint32_t slot) {
    return (int32_t *)(slot_ptr(r, slot) + r->l.tokens_off);
}
static inline float *slot_lpv(region_t *r, uint32_t slot) {
    return (float *)(slot_ptr(r, slot) + r->l.lpv_off);
}
static inline int32_t *slot_lpi(region_t *r, uint32_t slot) {
    return (int32_t *)(slot_ptr(r, slot) + r->l.lpi_off);
}

/* ------------------------------------------------------------------------------------------ */
/* A bounds-checked msgpack reader: just what BatchTokenIDOutSlim needs, plus a generic skip.  */

typedef struct {
    const uint8_t *p, *end;
    const char *err;
} cur_t;

static inline int need(cur_t *c, size_t n) {
    if ((size_t)(c->end - c->p) < n) {
        c->err = "frame is truncated";
        return -1;
    }
    return 0;
}
static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static int rd_array(cur_t *c, uint32_t *n) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if ((b & 0xf0) == 0x90) {
        *n = b & 0x0f;
        c->p += 1;
        return 0;
    }
    if (b == 0xdc) {
        if (need(c, 3)) return -1;
        *n = be16(c->p + 1);
        c->p += 3;
        return 0;
    }
    if (b == 0xdd) {
        if (need(c, 5)) return -1;
        *n = be32(c->p + 1);
        c->p += 5;
        return 0;
    }
    c->err = "expected an array";
    return -1;
}

static int rd_str(cur_t *c, const uint8_t **s, uint32_t *n) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    size_t hdr;
    uint32_t len;
    if ((b & 0xe0) == 0xa0) {
        len = b & 0x1f;
        hdr = 1;
    } else if (b == 0xd9) {
        if (need(c, 2)) return -1;
        len = c->p[1];
        hdr = 2;
    } else if (b == 0xda) {
        if (need(c, 3)) return -1;
        len = be16(c->p + 1);
        hdr = 3;
    } else if (b == 0xdb) {
        if (need(c, 5)) return -1;
        len = be32(c->p + 1);
        hdr = 5;
    } else {
        c->err = "expected a str";
        return -1;
    }
    if (need(c, hdr + (size_t)len)) return -1;
    *s = c->p + hdr;
    *n = len;
    c->p += hdr + len;
    return 0;
}

static int rd_int(cur_t *c, int64_t *v) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if (b <= 0x7f) {
        *v = b;
        c->p += 1;
        return 0;
    }
    if (b >= 0xe0) {
        *v = (int8_t)b;
        c->p += 1;
        return 0;
    }
    switch (b) {
    case 0xcc:
        if (need(c, 2)) return -1;
        *v = c->p[1];
        c->p += 2;
        return 0;
    case 0xcd:
        if (need(c, 3)) return -1;
        *v = be16(c->p + 1);
        c->p += 3;
        return 0;
    case 0xce:
        if (need(c, 5)) return -1;
        *v = be32(c->p + 1);
        c->p += 5;
        return 0;
    case 0xcf: {
        if (need(c, 9)) return -1;
        uint64_t u = be64(c->p + 1);
        if (u > (uint64_t)INT64_MAX) {
            c->err = "integer out of range";
            return -1;
        }
        *v = (int64_t)u;
        c->p += 9;
        return 0;
    }
    case 0xd0:
        if (need(c, 2)) return -1;
        *v = (int8_t)c->p[1];
        c->p += 2;
        return 0;
    case 0xd1:
        if (need(c, 3)) return -1;
        *v = (int16_t)be16(c->p + 1);
        c->p += 3;
        return 0;
    case 0xd2:
        if (need(c, 5)) return -1;
        *v = (int32_t)be32(c->p + 1);
        c->p += 5;
        return 0;
    case 0xd3:
        if (need(c, 9)) return -1;
        *v = (int64_t)be64(c->p + 1);
        c->p += 9;
        return 0;
    default:
        c->err = "expected an int";
        return -1;
    }
}

/* A number where a float is declared: float32, float64 or any int (msgspec accepts ints). */
static int rd_num(cur_t *c, double *v) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if (b == 0xcb) {
        if (need(c, 9)) return -1;
        uint64_t u = be64(c->p + 1);
        memcpy(v, &u, 8);
        c->p += 9;
        return 0;
    }
    if (b == 0xca) {
        if (need(c, 5)) return -1;
        uint32_t u = be32(c->p + 1);
        float f;
        memcpy(&f, &u, 4);
        *v = f;
        c->p += 5;
        return 0;
    }
    int64_t i;
    if (rd_int(c, &i) < 0) {
        c->err = "expected a float";
        return -1;
    }
    *v = (double)i;
    return 0;
}

static int skip(cur_t *c, int depth) {
    if (depth > MAX_DEPTH) {
        c->err = "nesting too deep";
        return -1;
    }
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    uint64_t n = 0, items = 0;
    size_t hdr = 1;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        c->p += 1;
        return 0;
    }
    if ((b & 0xf0) == 0x90) {
        items = b & 0x0f;
    } else if ((b & 0xf0) == 0x80) {
        items = 2ull * (b & 0x0f);
    } else if ((b & 0xe0) == 0xa0) {
        n = b & 0x1f;
    } else {
        switch (b) {
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: case 0xca: n = 4; break;
        case 0xcf: case 0xd3: case 0xcb: n = 8; break;
        case 0xd9: case 0xc4: if (need(c, 2)) return -1; n = c->p[1]; hdr = 2; break;
        case 0xda: case 0xc5: if (need(c, 3)) return -1; n = be16(c->p + 1); hdr = 3; break;
        case 0xdb: case 0xc6: if (need(c, 5)) return -1; n = be32(c->p + 1); hdr = 5; break;
        case 0xd4: n = 2; break;
        case 0xd5: n = 3; break;
        case 0xd6: n = 5; break;
        case 0xd7: n = 9; break;
        case 0xd8: n = 17; break;
        case 0xc7: if (need(c, 2)) return -1; n = 1ull + c->p[1]; hdr = 2; break;
        case 0xc8: if (need(c, 3)) return -1; n = 1ull + be16(c->p + 1); hdr = 3; break;
        case 0xc9: if (need(c, 5)) return -1; n = 1ull + be32(c->p + 1); hdr = 5; break;
        case 0xdc: if (need(c, 3)) return -1; items = be16(c->p + 1); hdr = 3; break;
        case 0xdd: if (need(c, 5)) return -1; items = be32(c->p + 1); hdr = 5; break;
        case 0xde: if (need(c, 3)) return -1; items = 2ull * be16(c->p + 1); hdr = 3; break;
        case 0xdf: if (need(c, 5)) return -1; items = 2ull * be32(c->p + 1); hdr = 5; break;
        default: c->err = "invalid msgpack byte"; return -1;
        }
    }
    if (need(c, hdr + n)) return -1;
    c->p += hdr + n;
    for (uint64_t i = 0; i < items; i++)
        if (skip(c, depth + 1) < 0) return -1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* rid -> slot: open addressing, linear probing, tombstones. Keys live per slot.               */

#define MAP_EMPTY 0u
#define MAP_TOMB 0xffffffffu

typedef struct {
    uint32_t slot1; /* slot + 1, or MAP_EMPTY / MAP_TOMB */
    uint32_t hash;
} map_entry_t;

static inline uint64_t rid_hash(const uint8_t *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ (k * 0xc2b2ae3d27d4eb4fULL)) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ (k * 0xc2b2ae3d27d4eb4fULL)) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 32;
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* Writer: the I/O process's side.                                                             */

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

typedef struct {
    const uint8_t *rid;
    uint32_t rid_len;
    const uint8_t *out;
    uint32_t out_n;
    uint32_t finish;
    int64_t prompt, completion, cached;
    const uint8_t *lpv;
    uint32_t lpv_n;
    const uint8_t *lpi;
    uint32_t lpi_n;
} row_t;

typedef struct {
    PyObject_HEAD region_t r;
    uint32_t total_slots;
    /* rid table */
    map_entry_t *map;
    uint32_t map_mask, map_used, map_tombs;
    uint8_t **keys;
    uint32_t *key_len;
    /* per-slot spill, list of slots that have one */
    spill_t *spill;
    uint32_t *spill_list;
    uint32_t spill_count;
    /* per-frame scratch */
    row_t *rows;
    uint32_t rows_cap;
    uint32_t *touched;
    uint32_t touched_n;
    /* workers */
    int *wake_fd;
    uint8_t *worker_touched;
    uint32_t *touched_workers;
    uint32_t touched_workers_n;
    uint64_t *pending_head; /* local copy of each worker's head */
    /* counters */
    uint64_t frames, rows_total, unknown_rows, spilled_tokens, wakes, tokens;
} Writer;

static void publish_stats(Writer *self);

static void writer_dealloc(Writer *self) {
    if (self->keys) {
        for (uint32_t i = 0; i < self->total_slots; i++) free(self->keys[i]);
    }
    if (self->spill) {
        for (uint32_t i = 0; i < self->total_slots; i++) {
            free(self->spill[i].tok);
            free(self->spill[i].lpv);
            free(self->spill[i].lpi);
        }
    }
    free(self->map);
    free(self->keys);
    free(self->key_len);
    free(self->spill);
    free(self->spill_list);
    free(self->rows);
    free(self->touched);
    free(self->wake_fd);
    free(self->worker_touched);
    free(self->touched_workers);
    free(self->pending_head);
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int writer_init(Writer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "num_workers", "slots_per_worker", "ring_capacity",
                             "max_engines", NULL};
    PyObject *buf;
    unsigned int w, s, c, e;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIII", kwlist, &buf, &w, &s, &c, &e)) return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Writer already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, 1) < 0) return -1;
    uint64_t total = (uint64_t)w * s;
    if (total > (1u << 24)) {
        PyErr_SetString(PyExc_ValueError, "too many slots (at most 16M)");
        return -1;
    }
    self->total_slots = (uint32_t)total;
    uint32_t mcap = 16;
    while (mcap < self->total_slots * 2u) mcap <<= 1;
    self->map = calloc(mcap, sizeof(map_entry_t));
    self->map_mask = mcap - 1;
    self->keys = calloc(total, sizeof(uint8_t *));
    self->key_len = calloc(total, sizeof(uint32_t));
    self->spill = calloc(total, sizeof(spill_t));
    self->spill_list = calloc(total, sizeof(uint32_t));
    self->touched = calloc(total, sizeof(uint32_t));
    self->wake_fd = malloc(w * sizeof(int));
    self->worker_touched = calloc(w, 1);
    self->touched_workers = calloc(w, sizeof(uint32_t));
    self->pending_head = calloc(w, sizeof(uint64_t));
    if (!self->map || !self->keys || !self->key_len || !self->spill || !self->spill_list ||
        !self->touched || !self->wake_fd || !self->worker_touched || !self->touched_workers ||
        !self->pending_head) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < w; i++) self->wake_fd[i] = -1;
    memset(self->r.base + HEADER_BYTES, 0, self->r.l.slots_off - HEADER_BYTES);
    return 0;
}

static int64_t map_find(Writer *self, const uint8_t *key, uint32_t len, uint32_t h32) {
    uint32_t i = h32 & self->map_mask;
    for (;;) {
        map_entry_t *e = &self->map[i];
        if (e->slot1 == MAP_EMPTY) return -1;
        if (e->slot1 != MAP_TOMB && e->hash == h32) {
            uint32_t slot = e->slot1 - 1;
            if (self->key_len[slot] == len && memcmp(self->keys[slot], key, len) == 0) return i;
        }
        i = (i + 1) & self->map_mask;
    }
}

static void map_rebuild(Writer *self) {
    uint32_t cap = self->map_mask + 1;
    map_entry_t *old = self->map;
    map_entry_t *fresh = calloc(cap, sizeof(map_entry_t));
    if (!fresh) return; /* keep the old table; it is still correct, only slower */
    for (uint32_t i = 0; i < cap; i++) {
        if (old[i].slot1 == MAP_EMPTY || old[i].slot1 == MAP_TOMB) continue;
        uint32_t j = old[i].hash & self->map_mask;
        while (fresh[j].slot1 != MAP_EMPTY) j = (j + 1) & self->map_mask;
        fresh[j] = old[i];
    }
    free(old);
    self->map = fresh;
    self->map_tombs = 0;
}

static void map_remove_slot(Writer *self, uint32_t slot) {
    if (!self->keys[slot]) return;
    uint32_t h32 = (uint32_t)rid_hash(self->keys[slot], self->key_len[slot]);
    int64_t i = map_find(self, self->keys[slot], self->key_len[slot], h32);
    if (i >= 0) {
        self->map[i].slot1 = MAP_TOMB;
        self->map_used--;
        self->map_tombs++;
        if (self->map_tombs > (self->map_mask + 1) / 4) map_rebuild(self);
    }
    free(self->keys[slot]);
    self->keys[slot] = NULL;
    self->key_len[slot] = 0;
}

static void spill_drop(Writer *self, uint32_t slot) {
    spill_t *sp = &self->spill[slot];
    sp->n = 0;
    sp->finish = FIN_NONE;
}

static void notify_slot(Writer *self, uint32_t slot) { self->touched[self->touched_n++] = slot; }

/* Publish queued notifications: one fence, then each touched slot goes on its worker's notify
 * ring at most once (the `notified` flag), then each worker's head is released. */
static void publish_notifications(Writer *self) {
    if (self->touched_n == 0) return;
    region_t *r = &self->r;
    /* Pairs with the reader's fence between clearing `notified` and loading write_seq: if our
     * exchange below still sees the flag set, the reader is guaranteed to see our writes. */
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t spw = r->l.slots_per_worker;
    for (uint32_t i = 0; i < self->touched_n; i++) {
        uint32_t slot = self->touched[i];
        slot_a_t *a = slot_a(r, slot);
        if (atomic_exchange_explicit(&a->notified, 1, memory_order_relaxed) != 0) continue;
        uint32_t w = slot / spw;
        uint64_t head = self->pending_head[w];
        notify_ring(r, w)[head % spw] = slot % spw;
        self->pending_head[w] = head + 1;
        if (!self->worker_touched[w]) {
            self->worker_touched[w] = 1;
            self->touched_workers[self->touched_workers_n++] = w;
        }
    }
    for (uint32_t i = 0; i < self->touched_workers_n; i++) {
        uint32_t w = self->touched_workers[i];
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

static PyObject *writer_bind(Writer *self, PyObject *args) {
    const char *rid;
    Py_ssize_t rid_len;
    long long slot;
    unsigned long long ticket;
    int with_logprobs;
    unsigned int dup_code;
    if (!PyArg_ParseTuple(args, "y#LKpI", &rid, &rid_len, &slot, &ticket, &with_logprobs, &dup_code))
        return NULL;
    if (!slot_in_range(self, slot)) return NULL;
    if (ticket == 0) {
        PyErr_SetString(PyExc_ValueError, "ticket 0 is reserved");
        return NULL;
    }
    region_t *r = &self->r;
    uint32_t s = (uint32_t)slot;
    /* The worker gave this slot up; drop anything still tied to its previous request. */
    map_remove_slot(self, s);
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

    uint32_t h32 = (uint32_t)rid_hash((const uint8_t *)rid, (size_t)rid_len);
    if (map_find(self, (const uint8_t *)rid, (uint32_t)rid_len, h32) >= 0) {
        publish_done(self, s, dup_code);
        publish_notifications(self);
        Py_RETURN_FALSE;
    }
    uint8_t *key = malloc(rid_len ? (size_t)rid_len : 1);
    if (!key) return PyErr_NoMemory();
    memcpy(key, rid, (size_t)rid_len);
    self->keys[s] = key;
    self->key_len[s] = (uint32_t)rid_len;
    uint32_t i = h32 & self->map_mask;
    while (self->map[i].slot1 != MAP_EMPTY && self->map[i].slot1 != MAP_TOMB)
        i = (i + 1) & self->map_mask;
    if (self->map[i].slot1 == MAP_TOMB) self->map_tombs--;
    self->map[i].slot1 = s + 1;
    self->map[i].hash = h32;
    self->map_used++;
    Py_RETURN_TRUE;
}

static PyObject *writer_unbind(Writer *self, PyObject *arg) {
    long long slot = PyLong_AsLongLong(arg);
    if (slot == -1 && PyErr_Occurred()) return NULL;
    if (!slot_in_range(self, slot)) return NULL;
    int was = self->keys[slot] != NULL;
    map_remove_slot(self, (uint32_t)slot);
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
    int was = self->keys[s] != NULL;
    map_remove_slot(self, s);
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
        uint32_t ncap = sp->cap ? sp->cap * 2 : 64;
        int32_t *t = realloc(sp->tok, ncap * sizeof(int32_t));
        if (!t) return -1;
        sp->tok = t;
        float *v = realloc(sp->lpv, ncap * sizeof(float));
        if (!v) return -1;
        sp->lpv = v;
        int32_t *ix = realloc(sp->lpi, ncap * sizeof(int32_t));
        if (!ix) return -1;
        sp->lpi = ix;
        sp->cap = ncap;
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

static uint32_t finish_code(const uint8_t *s, uint32_t n) {
    if (n == 0) return FIN_NONE;
    if (n == 4 && memcmp(s, "stop", 4) == 0) return FIN_STOP;
    if (n == 6 && memcmp(s, "length", 6) == 0) return FIN_LENGTH;
    if (n == 5 && memcmp(s, "abort", 5) == 0) return FIN_ABORT;
    return FIN_OTHER;
}

static int ensure_rows(Writer *self, uint32_t n) {
    if (n <= self->rows_cap) return 0;
    uint32_t cap = self->rows_cap ? self->rows_cap : 256;
    while (cap < n) cap *= 2;
    row_t *rows = realloc(self->rows, cap * sizeof(row_t));
    if (!rows) return -1;
    self->rows = rows;
    self->rows_cap = cap;
    return 0;
}

static const char *COLUMN_NAMES[] = {"rids",
                                     "output_ids",
                                     "finished_reasons",
                                     "prompt_tokens",
                                     "completion_tokens",
                                     "cached_tokens",
                                     "output_token_logprobs_val",
                                     "output_token_logprobs_idx"};

/* Pass 1: walk and validate the whole frame, recording each row's pieces. */
static int parse_frame(Writer *self, cur_t *c, uint32_t *nrows_out, int64_t tail[5],
                       int64_t default_index) {
    uint32_t n;
    if (rd_array(c, &n) < 0) return -1;
    if (n < 9) {
        c->err = "BatchTokenIDOutSlim needs at least 9 elements";
        return -1;
    }
    const uint8_t *tag;
    uint32_t tag_len;
    if (rd_str(c, &tag, &tag_len) < 0) return -1;
    if (tag_len != 19 || memcmp(tag, "BatchTokenIDOutSlim", 19) != 0) {
        c->err = "tag is not BatchTokenIDOutSlim";
        return -1;
    }
    uint32_t nrows;
    if (rd_array(c, &nrows) < 0) return -1;
    if ((size_t)(c->end - c->p) < nrows) {
        c->err = "frame is truncated";
        return -1;
    }
    if (ensure_rows(self, nrows) < 0) {
        c->err = "out of memory";
        return -1;
    }
    row_t *rows = self->rows;
    for (uint32_t i = 0; i < nrows; i++)
        if (rd_str(c, &rows[i].rid, &rows[i].rid_len) < 0) return -1;
    for (int col = 1; col < 8; col++) {
        uint32_t m;
        if (rd_array(c, &m) < 0) return -1;
        if (m != nrows) {
            static char msg[128];
            snprintf(msg, sizeof msg, "ragged column %s: %u rows for %u rids", COLUMN_NAMES[col], m,
                     nrows);
            c->err = msg;
            return -1;
        }
        for (uint32_t i = 0; i < nrows; i++) {
            row_t *row = &rows[i];
            switch (col) {
            case 1: { /* output_ids */
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->out = c->p;
                row->out_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    int64_t v;
                    if (rd_int(c, &v) < 0) return -1;
                    if (v < INT32_MIN || v > INT32_MAX) {
                        c->err = "token id out of int32 range";
                        return -1;
                    }
                }
                break;
            }
            case 2: {
                const uint8_t *s;
                uint32_t k;
                if (rd_str(c, &s, &k) < 0) return -1;
                row->finish = finish_code(s, k);
                break;
            }
            case 3:
            case 4:
            case 5: {
                int64_t v;
                if (rd_int(c, &v) < 0) return -1;
                if (v < 0 || v > UINT32_MAX) {
                    c->err = "token count out of range";
                    return -1;
                }
                if (col == 3) row->prompt = v;
                else if (col == 4) row->completion = v;
                else row->cached = v;
                break;
            }
            case 6: {
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->lpv = c->p;
                row->lpv_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    double d;
                    if (rd_num(c, &d) < 0) return -1;
                }
                break;
            }
            case 7: {
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->lpi = c->p;
                row->lpi_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    int64_t v;
                    if (rd_int(c, &v) < 0) return -1;
                    if (v < INT32_MIN || v > INT32_MAX) {
                        c->err = "logprob token id out of int32 range";
                        return -1;
                    }
                }
                if ((row->lpv_n && row->lpv_n != row->out_n) || row->lpi_n != row->lpv_n) {
                    c->err = "ragged logprobs: a row's logprob lists must be empty or as long as "
                             "its output_ids";
                    return -1;
                }
                break;
            }
            }
        }
    }
    /* engine_index and the load tail; absent in older engines (default 0). */
    for (int k = 0; k < 5; k++) tail[k] = 0;
    tail[0] = default_index; /* 9-element (Aug3) frames carry no engine_index */
    for (uint32_t k = 9; k < n; k++) {
        if (k < 14) {
            if (rd_int(c, &tail[k - 9]) < 0) return -1;
        } else if (skip(c, 0) < 0) {
            return -1; /* a future engine's extra trailing element: ignored */
        }
    }
    if (c->p != c->end) {
        c->err = "trailing bytes after the frame";
        return -1;
    }
    *nrows_out = nrows;
    return 0;
}

static PyObject *writer_ingest(Writer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "ingest(frame, engine_index=0)");
        return NULL;
    }
    PyObject *arg = args[0];
    long long default_index = 0;
    if (nargs == 2) {
        default_index = PyLong_AsLongLong(args[1]);
        if (default_index == -1 && PyErr_Occurred()) return NULL;
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
    int64_t tail[5];
    if (parse_frame(self, &c, &nrows, tail, default_index) < 0) {
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
    for (uint32_t i = 0; i < nrows; i++) {
        row_t *row = &self->rows[i];
        uint32_t h32 = (uint32_t)rid_hash(row->rid, row->rid_len);
        int64_t at = map_find(self, row->rid, row->rid_len, h32);
        if (at < 0) {
            unknown++; /* aborted locally, or not ours: the engine may still be flushing it */
            continue;
        }
        uint32_t slot = self->map[at].slot1 - 1;
        slot_a_t *a = slot_a(r, slot);
        spill_t *sp = &self->spill[slot];
        uint64_t ws = atomic_load_explicit(&a->write_seq, memory_order_relaxed);
        uint64_t rs = atomic_load_explicit(&slot_b(r, slot)->read_seq, memory_order_acquire);
        uint64_t room = sp->n ? 0 : cap - (ws - rs);
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
                lpv[pos] = (float)dv;
                lpi[pos] = (int32_t)iv;
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
        if (sp->n) {
            /* Counts go out with the last spilled token, so they never run ahead of it. */
            sp->prompt = (uint32_t)row->prompt;
            sp->completion = (uint32_t)row->completion;
            sp->cached = (uint32_t)row->cached;
            sp->engine_index = (int32_t)tail[0];
        } else {
            atomic_store_explicit(&a->prompt_tokens, (uint32_t)row->prompt, memory_order_relaxed);
            atomic_store_explicit(&a->completion_tokens, (uint32_t)row->completion,
                                  memory_order_relaxed);
            atomic_store_explicit(&a->cached_tokens, (uint32_t)row->cached, memory_order_relaxed);
            atomic_store_explicit(&a->engine_index, (int32_t)tail[0], memory_order_relaxed);
        }
        /* Tokens and counts happen-before a reader's acquire load of write_seq. */
        atomic_store_explicit(&a->write_seq, ws + written, memory_order_release);
        if (row->finish != FIN_NONE) {
            map_remove_slot(self, slot);
            if (sp->n) {
                sp->finish = row->finish; /* published after the spilled tokens */
            } else {
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
    self->frames++;
    self->rows_total += nrows;
    self->unknown_rows += unknown;
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLLLLIIN)", (long long)tail[0], (long long)tail[1], (long long)tail[2],
                         (long long)tail[3], (long long)tail[4], nrows, unknown, finished);
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
static PyObject *writer_wake(Writer *self, PyObject *unused) {
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
    return PyLong_FromUnsignedLong(writes);
}

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
        map_remove_slot(self, slot);
        spill_drop(self, slot);
        slot_a_t *a = slot_a(r, slot);
        atomic_store_explicit(&a->generation, 0, memory_order_relaxed);
        atomic_store_explicit(&a->state, SLOT_IDLE, memory_order_relaxed);
        atomic_store_explicit(&a->notified, 0, memory_order_relaxed);
        atomic_store_explicit(&slot_b(r, slot)->read_seq, 0, memory_order_relaxed);
    }
    /* Touched lists may still name this worker's slots; drop them. */
    uint32_t keep = 0;
    for (uint32_t i = 0; i < self->touched_n; i++)
        if (self->touched[i] / spw != (uint32_t)w) self->touched[keep++] = self->touched[i];
    self->touched_n = keep;
    worker_ctl_t *ctl = worker_ctl(r, (uint32_t)w);
    atomic_store_explicit(&ctl->head, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->tail, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->parked, 0, memory_order_relaxed);
    atomic_store_explicit(&ctl->wakes, 0, memory_order_relaxed);
    self->pending_head[w] = 0;
    self->wake_fd[w] = -1;
    atomic_thread_fence(memory_order_release);
    Py_RETURN_NONE;
}

/* Counters the workers can read (header + 64: u64 words, see tsfront/region.py METRICS). */
#define METRICS_OFF 64
static void publish_stats(Writer *self) {
    _Atomic uint64_t *m = (_Atomic uint64_t *)(self->r.base + METRICS_OFF);
    atomic_store_explicit(&m[0], self->frames, memory_order_relaxed);
    atomic_store_explicit(&m[1], self->rows_total, memory_order_relaxed);
    atomic_store_explicit(&m[2], self->tokens, memory_order_relaxed);
    atomic_store_explicit(&m[3], self->unknown_rows, memory_order_relaxed);
    atomic_store_explicit(&m[4], self->spilled_tokens, memory_order_relaxed);
    atomic_store_explicit(&m[5], self->wakes, memory_order_relaxed);
    atomic_store_explicit(&m[6], self->map_used, memory_order_relaxed);
    atomic_store_explicit(&m[7], self->spill_count, memory_order_relaxed);
}

static PyObject *writer_spilling(Writer *self, PyObject *unused) {
    return PyLong_FromUnsignedLong(self->spill_count);
}

static PyObject *writer_stats(Writer *self, PyObject *unused) {
    return Py_BuildValue("{sKsKsKsKsKsKsIsI}", "frames", self->frames, "rows", self->rows_total,
                         "unknown_rows", self->unknown_rows, "tokens", self->tokens,
                         "spilled_tokens", self->spilled_tokens, "wakes", self->wakes,
                         "bound", self->map_used, "spilling_slots", self->spill_count);
}

static PyMethodDef writer_methods[] = {
    {"bind", (PyCFunction)writer_bind, METH_VARARGS,
     "bind(rid: bytes, slot, ticket, with_logprobs, dup_code) -> bool\n\nActivate a slot for a "
     "request. False (and the slot finished with dup_code) if the rid is already bound."},
    {"unbind", (PyCFunction)writer_unbind, METH_O,
     "unbind(slot) -> bool: forget the slot's request (its worker aborted it)."},
    {"finish", (PyCFunction)writer_finish, METH_VARARGS,
     "finish(slot, code, engine_index) -> bool: end a live slot with a local terminal code."},
    {"ingest", (PyCFunction)(void (*)(void))writer_ingest, METH_FASTCALL,
     "ingest(frame, engine_index=0) -> (engine_index, running, waiting, kv_active, kv_total, "
     "rows, unknown, finished_slots) | None\n\nApply one output frame; None for "
     "ENGINE_CORE_DEAD. engine_index is the engine whose socket it came from, used when the "
     "frame does not say (the 9-element form)."},
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

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The I/O process's side of the slot region: binds requests, ingests output frames.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)writer_init,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_methods = writer_methods,
};

/* ------------------------------------------------------------------------------------------ */
/* Reader: one worker's side.                                                                  */

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
    if (self->r.base) PyBuffer_Release(&self->r.view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int reader_init(Reader *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer",        "worker",      "num_workers", "slots_per_worker",
                             "ring_capacity", "max_engines", NULL};
    PyObject *buf;
    unsigned int worker, w, s, c, e;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OIIIII", kwlist, &buf, &worker, &w, &s, &c, &e))
        return -1;
    if (self->r.base) {
        PyErr_SetString(PyExc_RuntimeError, "Reader already initialised");
        return -1;
    }
    if (region_open(&self->r, buf, w, s, c, e, 0) < 0) return -1;
    if (worker >= w) {
        PyErr_SetString(PyExc_ValueError, "worker out of range");
        return -1;
    }
    self->worker = worker;
    self->tickets = calloc(s, sizeof(uint64_t));
    self->ints = calloc((size_t)s * IC_N, sizeof(struct int_cache));
    if (!self->tickets || !self->ints) {
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

static PyObject *reader_poll(Reader *self, PyObject *unused) {
    region_t *r = &self->r;
    worker_ctl_t *ctl = worker_ctl(r, self->worker);
    uint32_t spw = r->l.slots_per_worker;
    const uint32_t *ring = notify_ring(r, self->worker);
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_acquire);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    if (head - tail > spw) tail = head - spw; /* cannot happen with a sane writer */
    /* Clear every entry's `notified` first, then one fence for all of them (pairs with the
     * writer's fence before its exchange on `notified`), then read the slots. */
    for (uint64_t t = tail; t != head; t++) {
        uint32_t local = ring[t % spw];
        if (local < spw)
            atomic_store_explicit(&slot_a(r, self->worker * spw + local)->notified, 0,
                                  memory_order_relaxed);
    }
    atomic_thread_fence(memory_order_seq_cst);
    while (tail != head) {
        uint32_t local = ring[tail % spw];
        tail++;
        if (local >= spw) continue;
        PyObject *item = read_slot(self, local);
        if (!item) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                return NULL;
            }
            continue;
        }
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    atomic_store_explicit(&ctl->tail, tail, memory_order_release);
    return out;
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

/* Publish that this worker is about to wait on its eventfd. False if notifications are already
 * pending (then it stays unparked and should poll again). */
static PyObject *reader_park(Reader *self, PyObject *unused) {
    worker_ctl_t *ctl = worker_ctl(&self->r, self->worker);
    atomic_store_explicit(&ctl->parked, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t head = atomic_load_explicit(&ctl->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&ctl->tail, memory_order_relaxed);
    if (head != tail) {
        atomic_store_explicit(&ctl->parked, 0, memory_order_relaxed);
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
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
    {"wakes", (PyCFunction)reader_wakes, METH_NOARGS,
     "wakes() -> int: eventfd writes the I/O process has made to this worker."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One worker's side of the slot region: reads its slots' rings.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

/* ------------------------------------------------------------------------------------------ */

static PyObject *abi_version(PyObject *self, PyObject *args) { return PyLong_FromLong(ABI_VERSION); }

static PyObject *set_parent_death_signal(PyObject *self, PyObject *arg) {
    int sig = (int)PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred()) return NULL;
    if (prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* Index of the first element of a list that is not an exact int in [0, 2**31), or -1. The
 * prompt check of every request: msgspec.convert of 1,024 ids costs ~11 us, this ~1 us. */
static PyObject *first_bad_token(PyObject *self, PyObject *arg) {
    if (!PyList_CheckExact(arg)) return PyLong_FromLong(0);
    Py_ssize_t n = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(arg, i);
        if (!PyLong_CheckExact(o)) return PyLong_FromSsize_t(i);
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(o, &overflow);
        if (overflow || v < 0 || v > INT32_MAX) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"abi_version", abi_version, METH_NOARGS, "Version of the shared-memory layout."},
    {"first_bad_token", first_bad_token, METH_O,
     "first_bad_token(ids) -> int: index of the first entry that is not a token id, or -1."},
    {"layout", (PyCFunction)(void (*)(void))py_layout, METH_VARARGS | METH_KEYWORDS,
     "layout(num_workers, slots_per_worker, ring_capacity, max_engines) -> dict of offsets."},
    {"set_parent_death_signal", set_parent_death_signal, METH_O,
     "Ask the kernel to send this signal to the calling process when its parent exits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tsfront._native",
                                    "Shared-memory slot rings and the output hot path.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *errors = PyImport_ImportModule("tsfront.errors");
    if (!errors) return NULL;
    WireDecodeError = PyObject_GetAttrString(errors, "WireDecodeError");
    Py_DECREF(errors);
    if (!WireDecodeError) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&WriterType);
    Py_INCREF(&ReaderType);
    PyModule_AddObject(m, "Writer", (PyObject *)&WriterType);
    PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType);
    PyModule_AddIntConstant(m, "SLOT_IDLE", SLOT_IDLE);
    PyModule_AddIntConstant(m, "SLOT_LIVE", SLOT_LIVE);
    PyModule_AddIntConstant(m, "SLOT_DONE", SLOT_DONE);
    PyModule_AddIntConstant(m, "FIN_NONE", FIN_NONE);
    PyModule_AddIntConstant(m, "FIN_STOP", FIN_STOP);
    PyModule_AddIntConstant(m, "FIN_LENGTH", FIN_LENGTH);
    PyModule_AddIntConstant(m, "FIN_ABORT", FIN_ABORT);
    PyModule_AddIntConstant(m, "FIN_OTHER", FIN_OTHER);
    return m;
}
