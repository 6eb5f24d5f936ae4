/*
 * region.h: the shared slot region's layout, header and accessors.
 *
 * One region of shared memory (a memfd mapped by the I/O process and by every worker) holds a
 * header, the engine table, one control block and one notify ring per worker, and one slot per
 * request a worker can have in flight. A slot's line A is written only by the I/O process (its
 * Writer) and its line B only by the worker that owns it (its Reader); nothing is locked,
 * ordering comes from C11 atomics. `compute_layout()` is the single source of truth for
 * offsets; docs/DESIGN.md describes the layout. Each ordering rule is stated next to the code
 * that relies on it (writer.c, reader.c), not here.
 */
#ifndef TSFRONT_REGION_H
#define TSFRONT_REGION_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>

#define ABI_VERSION 5 /* 2: worker_ctl_t.rescan; 3: Writer.bind takes the engine index;
                       * 4: the submission rings (subring.h) after the slots;
                       * 5: Writer.ingest writes a frame's load tail into the engine table */
#define REGION_MAGIC 0x74736672696e6731ULL /* "tsfring1" */
#define HEADER_BYTES 4096
#define ENGINE_BYTES 64
#define WORKER_BYTES 128
#define SLOT_HEADER_BYTES 128
#define SUBMIT_SHARED_BYTES 64 /* the submission rings' shared block: the I/O process's parked */
#define SUBMIT_CTL_BYTES 128   /* one worker's submission ring control block */
#define SUBMIT_ALIGN 64        /* records start on (and their sizes are) multiples of this */

/* Slot states (slot_a.state). */
enum { SLOT_IDLE = 0, SLOT_LIVE = 1, SLOT_DONE = 2 };

/* The engine table (ENGINE_BYTES a row: ENGINE_WORDS little-endian u32 words), written by the
 * I/O process (its Python side, and Writer.ingest the load words E_RUNNING .. E_LOAD_MS_HI of
 * each frame) and read by workers. Word indices of a row, and the published engine states
 * (word E_STATE). */
#define ENGINE_WORDS (ENGINE_BYTES / 4)
enum {
    E_STATE = 0,
    E_INDEX = 1,
    E_IN_FLIGHT = 2,
    E_RUNNING = 3,
    E_WAITING = 4,
    E_KV_ACTIVE = 5,
    E_KV_TOTAL = 6,
    E_LOAD_MS_LO = 7,
    E_LOAD_MS_HI = 8,
    E_REQUESTS_LO = 9,
    E_REQUESTS_HI = 10,
};
enum {
    ENGINE_ABSENT = 0,
    ENGINE_HANDSHAKING = 1,
    ENGINE_LIVE = 2,
    ENGINE_DEAD = 3,
    ENGINE_STALLED = 4,
};


typedef struct {
    uint64_t magic;
    uint32_t abi;
    uint32_t num_workers;
    uint32_t slots_per_worker;
    uint32_t ring_capacity;
    uint32_t max_engines;
    uint32_t submit_ring_bytes; /* bytes of each worker's submission ring (0: none) */
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
    _Atomic uint32_t notified; /* 1 from the push of its notify entry until that is consumed */
    _Atomic uint64_t spilled;  /* tokens that went through the spill path (a counter) */
} slot_a_t;

/* Line written by the worker. */
typedef struct {
    _Atomic uint64_t read_seq;
} slot_b_t;

typedef struct {
    /* Written by the I/O process (first line). */
    _Atomic uint64_t head;   /* next notify entry to write */
    _Atomic uint64_t wakes;  /* eventfd writes made to this worker */
    _Atomic uint32_t rescan; /* 1: the ring overflowed, the reader must read every slot */
    uint8_t pad[44];
    /* Written by the worker (second line). */
    _Atomic uint64_t tail;   /* next notify entry to read */
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
    uint64_t submit_off;    /* the submission rings' shared block (subring.h), then one
                             * SUBMIT_CTL_BYTES control block + ring per worker */
    uint64_t submit_stride; /* bytes per worker from submit_off + SUBMIT_SHARED_BYTES */
    uint32_t num_workers, slots_per_worker, ring_capacity, max_engines, submit_ring_bytes;
} layout_t;


typedef struct {
    Py_buffer view;
    uint8_t *base;
    layout_t l;
} region_t;

int compute_layout(layout_t *l, uint32_t workers, uint32_t spw, uint32_t cap, uint32_t engines,
                   uint32_t submit_bytes);
PyObject *py_layout(PyObject *self, PyObject *args, PyObject *kw);
/* Map `buffer` with this layout; init=1 (the Writer) writes a fresh header, init=0 (a Reader)
 * checks that the header matches. */
int region_open(region_t *r, PyObject *buffer, uint32_t w, uint32_t s, uint32_t c, uint32_t e,
                uint32_t sub, int init);

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

_Static_assert(sizeof(worker_ctl_t) == WORKER_BYTES, "worker control block is 128 bytes");
_Static_assert(sizeof(slot_a_t) <= 64, "a slot's line A fits one cache line");

#endif
