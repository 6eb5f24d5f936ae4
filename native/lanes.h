/*
 * lanes.h: the outgoing byte stream of each engine's input connection (see lanes.c).
 *
 * One `InputLanes` per engine group's input port, one lane per routed connection (its ZMTP
 * handshake done, reachable by its DEALER's identity): its descriptor and identity, the bytes
 * queued for it that the kernel has not taken, and where each queued message ends in the
 * stream (the queue depth counts the messages not wholly taken). tsfront/io/inputs.py's
 * `InputPort` owns the connections (accept, handshake, reads, ends) and hands each routed
 * engine connection's writing to its lane; the native turn (turn.c) queues ADDs on the same
 * lanes, so the two write one ordered stream.
 */
#ifndef TSFRONT_LANES_H
#define TSFRONT_LANES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* What a send says (tsfront.io.core's SENT, FULL, UNREACHABLE). */
enum { LANE_SENT = 0, LANE_FULL = 1, LANE_UNREACHABLE = 2 };

typedef struct {
    int fd;             /* -1: free (no routed connection) */
    uint8_t ident_len;
    uint8_t ident[255]; /* the connection's identity (an engine's: its index, u16 LE) */
    uint8_t *buf;       /* queued bytes: [off, len) not yet taken by the kernel */
    size_t off, len, cap;
    uint64_t queued;    /* bytes ever queued on this connection (stream position of len) */
    uint64_t taken;     /* bytes the kernel took (stream position of off) */
    uint64_t *ends;     /* ring of message ends (stream positions), oldest first */
    uint32_t ends_head, ends_n;
    int polled;         /* it holds bytes the kernel would not take: wants EPOLLOUT */
    int dirty;          /* holds bytes not offered to the kernel since they were queued */
    int failed;         /* errno of a failed write, not yet reported */
    int changed;        /* polled flipped or failed since the last report */
} lane_t;

typedef struct {
    PyObject_HEAD uint32_t count;
    uint32_t depth; /* messages a lane may hold that the kernel has not wholly taken */
    lane_t *lanes;
    uint32_t *dirty; /* lanes with bytes to offer */
    uint32_t dirty_n;
    uint32_t changes; /* 1: a lane may have `changed` set (flush reports it) */
    uint64_t writes, messages, full;
} InputLanes;

extern PyTypeObject InputLanesType;

/* The open lane routed to `identity`, or -1. */
int lanes_find(InputLanes *self, const uint8_t *identity, size_t len);
/* Whether lane i can take a message now (LANE_SENT), or why not. */
int lanes_room(InputLanes *self, uint32_t i);
/* Queue the two-frame message [kind, payload] on lane i; the caller checked lanes_room. 0, or
 * -1 with MemoryError set (nothing queued). */
int lanes_queue(InputLanes *self, uint32_t i, const uint8_t *kind, size_t kind_len,
                const uint8_t *payload, size_t payload_len);
/* The two halves of lanes_queue: the room for such a message (0, or -1 with MemoryError set),
 * then the message, which cannot fail after its room was reserved. */
int lanes_reserve(InputLanes *self, uint32_t i, size_t kind_len, size_t payload_len);
void lanes_put_message(InputLanes *self, uint32_t i, const uint8_t *kind, size_t kind_len,
                       const uint8_t *payload, size_t payload_len);
/* Offer every dirty lane's bytes to the kernel; the number of lanes that changed (polled
 * flipped, or failed) and wait for `flush` to be reported. */
uint32_t lanes_flush_all(InputLanes *self);

#endif
