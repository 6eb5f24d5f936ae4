/*
 * subring.h: the per-worker submission rings (a worker's ADDs and ABORTs to the I/O process).
 *
 * One single-producer (the worker) single-consumer (the I/O process) ring of variable-size
 * records per worker place, in the region after the slots (region.c: compute_layout). The
 * protocol and its invariant are in docs/DESIGN.md ("The submission rings"); each ordering
 * rule is commented at the code in subring.c that relies on it.
 *
 *   submit_off       shared block (SUBMIT_SHARED_BYTES): parked (u32), set by the I/O process
 *                    before it blocks, cleared by whoever wakes it (exchange)
 *   then per worker  control block (SUBMIT_CTL_BYTES)
 *                      line 0 (I/O writes): head (u64, bytes consumed), applied (u64, ZMQ
 *                                           submissions of this worker handled)
 *                      line 1 (worker writes): tail (u64, bytes published)
 *                    ring: submit_ring_bytes bytes of records
 *
 * A record starts at a multiple of SUBMIT_ALIGN and never crosses the ring's end: a record
 * that does not fit before the end is preceded by a WRAP record that fills the rest. Every
 * record is a sub_rec_t head then its bytes, padded to SUBMIT_ALIGN:
 *   ADD    a = submit header + rid, b = payload, c = block hashes (flags bit 0: present)
 *   ABORT  a = abort entries (tsfront.ipc.submit.ABORT_ENTRY each)
 *   WRAP   size = the bytes left to the ring's end
 */
#ifndef TSFRONT_SUBRING_H
#define TSFRONT_SUBRING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <stdint.h>

#include "region.h"

enum { SUB_ADD = 'A', SUB_ABORT = 'X', SUB_WRAP = 'W' };
/* What Submitter.add / abort return. */
enum { SUB_OK = 0, SUB_FULL = 1, SUB_TOO_BIG = 2, SUB_ZMQ_PENDING = 3 };
#define SUB_HAS_HASHES 1u

typedef struct {
    uint32_t size; /* bytes of the record, head included, a multiple of SUBMIT_ALIGN */
    uint32_t kind;
    uint32_t a_len, b_len, c_len;
    uint32_t flags;
} sub_rec_t;

typedef struct {
    _Atomic uint32_t parked;
    uint8_t pad[SUBMIT_SHARED_BYTES - 4];
} sub_shared_t;

typedef struct {
    /* Written by the I/O process (first line). */
    _Atomic uint64_t head;    /* bytes consumed: the producer may reuse the room before it */
    _Atomic uint64_t applied; /* this worker's ZMQ submissions the I/O process has handled */
    uint8_t pad[48];
    /* Written by the worker (second line). */
    _Atomic uint64_t tail; /* bytes published: records in [head, tail) are readable */
    uint8_t pad2[56];
} sub_ctl_t;

_Static_assert(sizeof(sub_shared_t) == SUBMIT_SHARED_BYTES, "shared block size");
_Static_assert(sizeof(sub_ctl_t) == SUBMIT_CTL_BYTES, "submission control block size");
_Static_assert(sizeof(sub_rec_t) <= SUBMIT_ALIGN, "a record head fits one alignment unit");

static inline sub_shared_t *sub_shared(region_t *r) {
    return (sub_shared_t *)(r->base + r->l.submit_off);
}
static inline sub_ctl_t *sub_ctl(region_t *r, uint32_t w) {
    return (sub_ctl_t *)(r->base + r->l.submit_off + SUBMIT_SHARED_BYTES + w * r->l.submit_stride);
}
static inline uint8_t *sub_ring(region_t *r, uint32_t w) { return (uint8_t *)sub_ctl(r, w) + SUBMIT_CTL_BYTES; }
/* The largest record a ring takes: half of it, so a record always fits an empty ring, even
 * behind a wrap. */
static inline uint64_t sub_max_record(region_t *r) { return r->l.submit_ring_bytes / 2; }

extern PyTypeObject SubmitterType;
extern PyTypeObject IntakeType;

/* The I/O process's side (subring.c: `Intake`); the native turn (turn.c) uses it directly. */
typedef struct {
    PyObject_HEAD region_t r;
    uint64_t *head;     /* per worker: bytes consumed (private: a peer cannot move it) */
    uint64_t *applied;  /* per worker: ZMQ submissions handled */
    uint64_t *bad_tail; /* per worker: the out-of-range tail last counted (count it once) */
    uint8_t *active;    /* per worker: attached (its ring is read) */
    uint64_t records, bad, parks, refused; /* refused: parks that found a record waiting */
} Intake;

/* One record as `intake_each` offers it: pointers into the ring, which its worker may rewrite
 * meanwhile (a peer may lie): whatever is used is copied out first, never read twice. */
typedef struct {
    uint32_t worker, kind;
    const uint8_t *a, *b, *c;
    uint32_t a_len, b_len, c_len;
    int has_c; /* an ADD's block hashes are present */
} sub_view_t;
/* 1: consumed; 0: declined (it and the worker's later records stay for Intake.take); -1: a
 * Python error (the record stays, the pass stops). */
typedef int (*sub_fn)(void *ctx, const sub_view_t *rec);

/* Intake.park without the call: 1 parked, 0 a record waits (not parked). */
int intake_park_c(Intake *self);
/* Offer every attached worker's published records, in order, to `fn` until it declines one of
 * a worker (or one fails take's checks: left for take to report); clears parked like take.
 * The records consumed, or -1 if `fn` raised. */
Py_ssize_t intake_each(Intake *self, sub_fn fn, void *ctx);

#endif
