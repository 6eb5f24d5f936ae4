/*
 * turn.c: the I/O process's turn in native code (tsfront._native.Turn).
 *
 * A turn of tsfront/io/loop.py cost ~50 us of cold interpreter above the ~18 us a wake-up and
 * its system calls cost (docs/PERFORMANCE.md), and with W workers the I/O process makes up to
 * W times the turns that only place ADDs. `Turn.run` is the loop's wait and every turn that
 * needs no Python: it parks the submission rings (the Dekker handshake of subring.c), waits in
 * the loop's epoll, reads the rings' eventfd, takes each worker's ADD records and places the
 * common ones itself (the ADD fast path below), queues them on the engines' input lanes
 * (lanes.c), and ends the turn: one send per dirty lane, the engine rows and counters it moved,
 * the parked workers' wake (writer.c). It returns to Python, the loop's own turn, as soon as
 * anything else happened: a descriptor that is not the rings' eventfd fired (engine output,
 * the handshake and submit sockets, control connections, listeners), a record was declined
 * (it and its worker's later records stay in the ring for `Intake.take`, in order), a lane's
 * write failed or wants EPOLLOUT, the timeout passed (the loop's timers), or a signal handler
 * raised. So what is rare keeps its Python code and its one error boundary, unchanged.
 *
 * The ADD fast path is `IOCore.on_add` for the common case, on the core's own objects (its
 * records dict, each `Engine`'s attributes, the `Router`'s cursors), through the C API and no
 * Python frame, as push.c does for a worker's drain. A record is placed here only when every
 * check of `on_add` and `send_add` passes without a side effect of its own: its header is
 * whole, its slot and ticket are its worker's, the slot holds no request, no probe is out, its
 * deadline has not passed, its rid is bound nowhere, the engine (its pin, or the policy's
 * choice: ROUND_ROBIN, LEAST_IN_FLIGHT, SHORTEST_QUEUE, MIN_CACHE_USAGE, the same choice as
 * tsfront/io/routing.py, which it mirrors) is placeable, has no backlog, was sent no ABORT of
 * this rid within its abort memory, and its lane takes the message. Anything else (prefix
 * affinity, disaggregated serving, an ABORT record, a refusal, a full or unreachable engine) is
 * declined before anything changed, and `on_add` meets it on the Python path. Everything that
 * can fail for want of memory is made before the first change; then the record is filed, the
 * rid bound (writer.c), the message queued (lanes.c), the engine's counts moved and the
 * router's cursor advanced: the state `on_add` leaves, and the engine row's in-flight and
 * request words written as its end of turn would (docs/DESIGN.md, "The native turn").
 */
#include "turn.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "lanes.h"
#include "record.h"
#include "region.h"
#include "subring.h"
#include "writer.h"

/* tsfront.ipc.submit.SUBMIT_HEADER ("<IQiBdI"), then the rid. */
#define SUBMIT_HEADER_BYTES 29
#define TICKET_SHIFT 40
#define TICKET_SERIAL_MASK ((1ull << 24) - 1)
/* tsfront.ipc.region.IO_METRICS_OFFSET: the I/O loop's counters (u64 words) in the header. */
#define IO_METRICS_OFF 2048
/* Longest rid placed here (every rid tsfront makes is far shorter); longer go the Python way. */
#define FAST_RID_MAX 256
#define MAX_EVENTS 64

/* The core's counts a native turn moves (IOCore.count's names, in `count_words` order). */
enum { C_SUBMISSIONS, C_WAKEUPS, C_TURNS, C_NATIVE_TURNS, C_COUNT };

enum { P_ROUND_ROBIN = 0, P_LEAST_IN_FLIGHT = 1, P_SHORTEST_QUEUE = 2, P_MIN_CACHE_USAGE = 3,
       P_OTHER = 4 };

/* Why a record was left to the Python path (stats()). */
enum {
    D_KIND, D_HEADER, D_SLOT, D_HELD, D_PROBE, D_DEADLINE, D_BOUND, D_PIN, D_POLICY, D_NONE,
    D_BACKLOG, D_ABORTED, D_LANE, D_OFF, D_ERROR, D_COUNT
};
static const char *const DECLINE_NAMES[D_COUNT] = {
    "kind",    "header", "slot", "held",    "probe", "deadline", "bound", "pin",
    "policy", "no_engine", "backlog", "aborted", "lane", "off", "error"};

static PyObject *S_state, *S_stall, *S_in_flight, *S_requests_total, *S_busy_since, *S_backlog,
    *S_aborted, *S_times, *S_window, *S_input_pending, *S_row, *S_index, *S_tail, *S_tail_at,
    *S_in_flight_at_tail, *S_serial, *S_rotation, *S_rr_next, *S_identity;

typedef struct {
    PyObject_HEAD PyObject *writer; /* WriterType */
    PyObject *intake;               /* IntakeType, or None */
    PyObject *lanes;                /* InputLanesType: the serving group's, by rank */
    PyObject *records, *attached, *probes, *counts; /* the core's dicts */
    PyObject *engines;                              /* list: the serving group's engines by row */
    PyObject *router;
    PyObject *live, *stepping; /* EngineState.LIVE, Stall.STEPPING */
    PyObject *add_kind;        /* tsfront.wire.ADD */
    PyObject *count_name[C_COUNT]; /* the core's counts this turn moves, and their words */
    int count_word[C_COUNT];
    int epfd, intake_fd;
    int policy, enabled;
    double load_ttl;
    uint32_t spw;
    region_t *region;
    /* this turn */
    uint8_t *row_touched;
    uint32_t *touched_rows, touched_n, rows;
    /* per row: the engine's identity (it never changes), and the lane it was last found on */
    uint8_t (*ident)[256]; /* [0]: length */
    int *lane_hint;
    int32_t *index;                 /* the engine's identity index (fixed) */
    int64_t *flying, *requests;     /* what the turn set in_flight and requests_total to */
    uint64_t counted[C_COUNT];  /* this turn */
    uint64_t unsynced[C_COUNT]; /* published, not yet in the core's counts dict */
    int left;             /* a record was declined: Python takes it */
    /* counters */
    uint64_t turns, returns, adds, declined[D_COUNT];
} Turn;

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t int_attr(PyObject *o, PyObject *name, int *ok);

static int turn_clear(Turn *self);

static void turn_dealloc(Turn *self) {
    PyObject_GC_UnTrack(self);
    turn_clear(self); /* the core's objects; then the rest */
    Py_CLEAR(self->writer);
    Py_CLEAR(self->intake);
    Py_CLEAR(self->lanes);
    Py_CLEAR(self->live);
    Py_CLEAR(self->stepping);
    Py_CLEAR(self->add_kind);
    for (int i = 0; i < C_COUNT; i++) Py_CLEAR(self->count_name[i]);
    PyMem_Free(self->row_touched);
    PyMem_Free(self->touched_rows);
    PyMem_Free(self->ident);
    PyMem_Free(self->lane_hint);
    PyMem_Free(self->index);
    PyMem_Free(self->flying);
    PyMem_Free(self->requests);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int turn_traverse(Turn *self, visitproc visit, void *arg) {
    Py_VISIT(self->writer);
    Py_VISIT(self->intake);
    Py_VISIT(self->lanes);
    Py_VISIT(self->records);
    Py_VISIT(self->attached);
    Py_VISIT(self->probes);
    Py_VISIT(self->counts);
    Py_VISIT(self->engines);
    Py_VISIT(self->router);
    Py_VISIT(self->live);
    Py_VISIT(self->stepping);
    return 0;
}

static int turn_clear(Turn *self) {
    Py_CLEAR(self->records);
    Py_CLEAR(self->attached);
    Py_CLEAR(self->probes);
    Py_CLEAR(self->counts);
    Py_CLEAR(self->engines);
    Py_CLEAR(self->router);
    return 0;
}

static int turn_init(Turn *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"writer",  "intake",   "lanes",     "epoll_fd",  "intake_fd",
                             "records", "attached", "probes",    "counts",    "count_words",
                             "engines", "router",   "policy",    "load_ttl",  "live",
                             "stepping", "add_kind", "slots_per_worker", "enabled", NULL};
    PyObject *writer, *intake, *lanes, *records, *attached, *probes, *counts, *words, *engines,
        *router, *live, *stepping, *add_kind;
    int epfd, intake_fd, policy, enabled;
    double ttl;
    unsigned int spw;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!OO!iiO!O!O!O!OO!OidOOSIp", kwlist, &WriterType, &writer, &intake,
            &InputLanesType, &lanes, &epfd, &intake_fd, &PyDict_Type, &records, &PyDict_Type,
            &attached, &PyDict_Type, &probes, &PyDict_Type, &counts, &words, &PyList_Type,
            &engines, &router, &policy, &ttl, &live, &stepping, &add_kind, &spw, &enabled))
        return -1;
    if (self->writer) {
        PyErr_SetString(PyExc_RuntimeError, "Turn already initialised");
        return -1;
    }
    if (intake != Py_None && !PyObject_TypeCheck(intake, &IntakeType)) {
        PyErr_SetString(PyExc_TypeError, "intake must be an Intake or None");
        return -1;
    }
    PyObject *names[C_COUNT];
    int cw[C_COUNT];
    if (!PyArg_ParseTuple(words, "(Ui)(Ui)(Ui)(Ui)", &names[0], &cw[0], &names[1], &cw[1],
                          &names[2], &cw[2], &names[3], &cw[3]))
        return -1;
    int words_ok = 1;
    for (int i = 0; i < C_COUNT; i++)
        if (cw[i] < 0 || IO_METRICS_OFF + 8 * (cw[i] + 1) > HEADER_BYTES) words_ok = 0;
    Py_ssize_t n = PyList_GET_SIZE(engines);
    region_t *r = writer_c_region(writer);
    if (n == 0 || (uint64_t)n > r->l.max_engines || spw != r->l.slots_per_worker || !words_ok ||
        policy < 0 || policy > P_OTHER) {
        PyErr_SetString(PyExc_ValueError, "Turn: inconsistent engines, lanes, geometry or words");
        return -1;
    }
    self->writer = Py_NewRef(writer);
    self->intake = Py_NewRef(intake);
    self->lanes = Py_NewRef(lanes);
    self->records = Py_NewRef(records);
    self->attached = Py_NewRef(attached);
    self->probes = Py_NewRef(probes);
    self->counts = Py_NewRef(counts);
    self->engines = Py_NewRef(engines);
    self->router = Py_NewRef(router);
    self->live = Py_NewRef(live);
    self->stepping = Py_NewRef(stepping);
    self->add_kind = Py_NewRef(add_kind);
    for (int i = 0; i < C_COUNT; i++) {
        self->count_name[i] = Py_NewRef(names[i]);
        self->count_word[i] = cw[i];
    }
    self->epfd = epfd;
    self->intake_fd = intake_fd;
    self->policy = policy;
    self->enabled = enabled;
    self->load_ttl = ttl;
    self->spw = spw;
    self->region = r;
    self->rows = (uint32_t)n;
    self->row_touched = PyMem_Calloc((size_t)n, 1);
    self->touched_rows = PyMem_Calloc((size_t)n, sizeof(uint32_t));
    self->ident = PyMem_Calloc((size_t)n, sizeof *self->ident);
    self->lane_hint = PyMem_Calloc((size_t)n, sizeof(int));
    self->index = PyMem_Calloc((size_t)n, sizeof(int32_t));
    self->flying = PyMem_Calloc((size_t)n, sizeof(int64_t));
    self->requests = PyMem_Calloc((size_t)n, sizeof(int64_t));
    if (!self->row_touched || !self->touched_rows || !self->ident || !self->lane_hint ||
        !self->index || !self->flying || !self->requests) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(engines, i);
        PyObject *id = PyObject_GetAttr(e, S_identity);
        int ok = 1;
        int64_t row = int_attr(e, S_row, &ok);
        int64_t index = ok ? int_attr(e, S_index, &ok) : -1;
        if (!id || !ok || !PyBytes_Check(id) || PyBytes_GET_SIZE(id) > 255 || row != i ||
            index < 0 || index > 65535) {
            Py_XDECREF(id);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Turn: an engine's identity or row is not its own");
            return -1;
        }
        self->ident[i][0] = (uint8_t)PyBytes_GET_SIZE(id);
        memcpy(&self->ident[i][1], PyBytes_AS_STRING(id), (size_t)PyBytes_GET_SIZE(id));
        Py_DECREF(id);
        self->lane_hint[i] = -1;
        self->index[i] = (int32_t)index;
    }
    return 0;
}

/* ------------------------------------------------------------------ reading the core's objects */

/* An int attribute as int64; -1 with an exception (and *ok = 0). */
static int64_t int_attr(PyObject *o, PyObject *name, int *ok) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) {
        *ok = 0;
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *ok = 0;
    return x;
}

static double float_attr(PyObject *o, PyObject *name, int *ok) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) {
        *ok = 0;
        return 0.0;
    }
    double x = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (x == -1.0 && PyErr_Occurred()) *ok = 0;
    return x;
}

/* Engine.placeable: live and stepping. -1 on an error. */
static int placeable(Turn *t, PyObject *e) {
    PyObject *state = PyObject_GetAttr(e, S_state);
    if (!state) return -1;
    int live = state == t->live;
    Py_DECREF(state);
    if (!live) return 0;
    PyObject *stall = PyObject_GetAttr(e, S_stall);
    if (!stall) return -1;
    int stepping = stall == t->stepping;
    Py_DECREF(stall);
    return stepping;
}

/* The routing key of tsfront/io/routing.py's Router._key, as (primary, secondary): compared
 * as its tuples are (LEAST_IN_FLIGHT and SHORTEST_QUEUE have no secondary). */
typedef struct {
    double k0;
    int64_t k1;
} route_key_t;

static int key_of(Turn *t, PyObject *e, double now, route_key_t *key) {
    int ok = 1;
    int64_t in_flight = int_attr(e, S_in_flight, &ok);
    if (!ok) return -1;
    if (t->policy == P_LEAST_IN_FLIGHT) {
        key->k0 = (double)in_flight;
        key->k1 = 0;
        return 0;
    }
    /* Engine.tail_fresh: a tail with kv_total, read at tail_at, within load_ttl. */
    PyObject *tail = PyObject_GetAttr(e, S_tail);
    if (!tail) return -1;
    int64_t f[4] = {0, 0, 0, 0};
    if (!PyTuple_Check(tail) || PyTuple_GET_SIZE(tail) != 4) {
        Py_DECREF(tail);
        PyErr_SetString(PyExc_TypeError, "Engine.tail is not a 4-tuple");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        f[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tail, i));
        if (f[i] == -1 && PyErr_Occurred()) ok = 0;
    }
    Py_DECREF(tail);
    if (!ok) return -1;
    double tail_at = float_attr(e, S_tail_at, &ok);
    if (!ok) return -1;
    int fresh = !(f[3] == 0 || tail_at == 0.0) && (now - tail_at) <= t->load_ttl;
    if (t->policy == P_SHORTEST_QUEUE) {
        if (!fresh) {
            key->k0 = (double)in_flight;
        } else {
            int64_t at_tail = int_attr(e, S_in_flight_at_tail, &ok);
            if (!ok) return -1;
            int64_t since = in_flight - at_tail;
            key->k0 = (double)(f[0] + f[1] + (since > 0 ? since : 0));
        }
        key->k1 = 0;
        return 0;
    }
    /* MIN_CACHE_USAGE */
    key->k0 = fresh ? (double)f[2] / (double)f[3] : 1.0;
    key->k1 = in_flight;
    return 0;
}

/* Router.choose for the policies mirrored here: the engine's position (or -1: none placeable;
 * -2: an error), and the router's cursors after it (committed only if the record is placed). */
static Py_ssize_t choose(Turn *t, double now, int64_t *rotation, int64_t *rr_next) {
    Py_ssize_t n = PyList_GET_SIZE(t->engines);
    int ok = 1;
    int64_t turn = int_attr(t->router, S_rotation, &ok);
    if (!ok) return -2;
    *rotation = turn + 1;
    if (t->policy == P_ROUND_ROBIN) {
        int64_t next = int_attr(t->router, S_rr_next, &ok);
        if (!ok) return -2;
        for (Py_ssize_t k = 0; k < n; k++) {
            Py_ssize_t i = (Py_ssize_t)(((next + k) % n + n) % n);
            int p = placeable(t, PyList_GET_ITEM(t->engines, i));
            if (p < 0) return -2;
            if (p) {
                *rr_next = i + 1;
                return i;
            }
        }
        return -1;
    }
    Py_ssize_t start = (Py_ssize_t)((turn % n + n) % n);
    Py_ssize_t best = -1;
    route_key_t best_key = {0, 0};
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = (start + k) % n;
        PyObject *e = PyList_GET_ITEM(t->engines, i);
        int p = placeable(t, e);
        if (p < 0) return -2;
        if (!p) continue;
        route_key_t key;
        if (key_of(t, e, now, &key) < 0) return -2;
        if (best < 0 || key.k0 < best_key.k0 || (key.k0 == best_key.k0 && key.k1 < best_key.k1)) {
            best = i;
            best_key = key;
        }
    }
    return best;
}

/* Whether the engine was sent an ABORT of this rid within its abort memory
 * (`RecentAborts.age(rid) is not None`): 1, 0, or -1 on an error. */
static int aborted_lately(PyObject *e, const uint8_t *rid, uint32_t len, double now,
                          PyObject **rid_obj) {
    PyObject *aborted = PyObject_GetAttr(e, S_aborted);
    if (!aborted) return -1;
    /* Its `times` (rid -> when), not len(aborted): __len__ is a Python method. */
    PyObject *times = PyObject_GetAttr(aborted, S_times);
    if (!times) {
        Py_DECREF(aborted);
        return -1;
    }
    if (PyDict_Check(times) && PyDict_GET_SIZE(times) == 0) {
        Py_DECREF(times);
        Py_DECREF(aborted);
        return 0;
    }
    int ok = 1;
    double window = float_attr(aborted, S_window, &ok);
    Py_DECREF(aborted);
    if (!ok) {
        Py_DECREF(times);
        return -1;
    }
    if (!*rid_obj) *rid_obj = PyBytes_FromStringAndSize((const char *)rid, len);
    if (!*rid_obj) {
        Py_DECREF(times);
        return -1;
    }
    PyObject *at = PyObject_GetItem(times, *rid_obj);
    Py_DECREF(times);
    if (!at) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_Clear();
        return 0;
    }
    double when = PyFloat_AsDouble(at);
    Py_DECREF(at);
    if (when == -1.0 && PyErr_Occurred()) return -1;
    return now - when < window;
}

/* The lane of the engine's connection (by its identity; the lane it was found on last is
 * checked first), or -1: none is routed to it. */
static int engine_lane(Turn *t, uint32_t row) {
    InputLanes *lanes = (InputLanes *)t->lanes;
    const uint8_t *id = &t->ident[row][1];
    size_t len = t->ident[row][0];
    int hint = t->lane_hint[row];
    if (hint >= 0) {
        lane_t *l = &lanes->lanes[hint];
        if (l->fd >= 0 && l->ident_len == len && memcmp(l->ident, id, len) == 0) return hint;
    }
    return t->lane_hint[row] = lanes_find(lanes, id, len);
}

static void touch_row(Turn *t, uint32_t row) {
    if (row < t->rows && !t->row_touched[row]) {
        t->row_touched[row] = 1;
        t->touched_rows[t->touched_n++] = row;
    }
}

/* ------------------------------------------------------------------ the ADD fast path */

/* 1 placed, 0 declined (nothing changed), -1 a Python error (nothing changed, unless the
 * error came after the first change: then what `on_add` would have done so far is done,
 * as an exception half-way through `on_add` leaves it). `why` says why it was declined. */
static int fast_add(Turn *t, const sub_view_t *rec, int *why) {
    if (rec->a_len < SUBMIT_HEADER_BYTES || rec->a_len - SUBMIT_HEADER_BYTES > FAST_RID_MAX) {
        *why = D_HEADER;
        return 0;
    }
    /* One copy of what is checked: the worker may rewrite the ring meanwhile. */
    uint8_t head[SUBMIT_HEADER_BYTES], rid[FAST_RID_MAX];
    memcpy(head, rec->a, SUBMIT_HEADER_BYTES);
    uint32_t rid_len = rec->a_len - SUBMIT_HEADER_BYTES;
    memcpy(rid, rec->a + SUBMIT_HEADER_BYTES, rid_len);
    uint32_t local;
    uint64_t ticket;
    int32_t pin;
    uint8_t with_lp;
    double expires;
    memcpy(&local, head, 4);
    memcpy(&ticket, head + 4, 8);
    memcpy(&pin, head + 12, 4);
    with_lp = head[16];
    memcpy(&expires, head + 17, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    *why = D_HEADER; /* the header is little-endian: the Python path reads it */
    return 0;
#endif
    if (local >= t->spw || ticket == 0) {
        *why = D_SLOT;
        return 0;
    }
    PyObject *wkey = PyLong_FromUnsignedLong(rec->worker);
    if (!wkey) return -1;
    PyObject *worker = PyDict_GetItemWithError(t->attached, wkey); /* borrowed */
    Py_DECREF(wkey);
    if (!worker) {
        if (PyErr_Occurred()) return -1;
        *why = D_SLOT;
        return 0;
    }
    int ok = 1;
    int64_t serial = int_attr(worker, S_serial, &ok);
    if (!ok) return -1;
    if ((ticket >> TICKET_SHIFT) != ((uint64_t)serial & TICKET_SERIAL_MASK)) {
        *why = D_SLOT;
        return 0;
    }
    uint32_t slot = rec->worker * t->spw + local;
    PyObject *slot_key = NULL, *rid_obj = NULL, *record = NULL, *in_flight = NULL,
             *requests = NULL, *busy = NULL;
    int rc = 0;
    slot_key = PyLong_FromUnsignedLong(slot);
    if (!slot_key) return -1;
    rc = PyDict_Contains(t->records, slot_key);
    if (rc != 0) {
        /* 1: the slot holds a request (on_add forgets it first, which queues its ABORT). */
        rc = rc < 0 ? -1 : 0;
        *why = D_HELD;
        goto done;
    }
    if (PyDict_GET_SIZE(t->probes)) {
        *why = D_PROBE;
        goto done;
    }
    double now = monotonic_now();
    if (expires != 0.0 && now >= expires) {
        *why = D_DEADLINE;
        goto done;
    }
    if (writer_c_bound(t->writer, rid, rid_len)) {
        *why = D_BOUND;
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(t->engines), at;
    int64_t rotation = 0, rr_next = 0;
    int routed = pin < 0;
    if (!routed) {
        if (pin >= n || t->policy == P_OTHER) { /* a bad pin, or one affinity must note */
            *why = D_PIN;
            goto done;
        }
        at = pin;
        int p = placeable(t, PyList_GET_ITEM(t->engines, at));
        if (p <= 0) {
            rc = p;
            *why = D_PIN;
            goto done;
        }
    } else {
        if (t->policy == P_OTHER) {
            *why = D_POLICY;
            goto done;
        }
        at = choose(t, now, &rotation, &rr_next);
        if (at < 0) {
            rc = at == -2 ? -1 : 0;
            *why = D_NONE;
            goto done;
        }
    }
    /* The serving engines' list is by row (checked at init); rows and indices never change. */
    PyObject *engine = PyList_GET_ITEM(t->engines, at);
    uint32_t row = (uint32_t)at;
    int32_t index = t->index[row];
    PyObject *backlog = PyObject_GetAttr(engine, S_backlog);
    if (!backlog) {
        rc = -1;
        goto done;
    }
    Py_ssize_t waiting = PyObject_Size(backlog);
    Py_DECREF(backlog);
    if (waiting != 0) {
        rc = waiting < 0 ? -1 : 0;
        *why = D_BACKLOG;
        goto done;
    }
    int lately = aborted_lately(engine, rid, rid_len, now, &rid_obj);
    if (lately != 0) {
        rc = lately < 0 ? -1 : 0;
        *why = D_ABORTED;
        goto done;
    }
    InputLanes *lanes = (InputLanes *)t->lanes;
    int lane = engine_lane(t, row);
    if (lane < 0 || lanes_room(lanes, (uint32_t)lane) != LANE_SENT) {
        *why = D_LANE;
        goto done;
    }
    /* Everything that may fail for want of memory, before the first change. */
    int64_t flying = int_attr(engine, S_in_flight, &ok);
    int64_t total = ok ? int_attr(engine, S_requests_total, &ok) : 0;
    if (!ok) {
        rc = -1;
        goto done;
    }
    if (!rid_obj) rid_obj = PyBytes_FromStringAndSize((const char *)rid, rid_len);
    if (!rid_obj || !(record = record_new(rid_obj, engine, ticket)) ||
        !(in_flight = PyLong_FromLongLong(flying + 1)) ||
        !(requests = PyLong_FromLongLong(total + 1)) ||
        (flying + 1 == 1 && !(busy = PyFloat_FromDouble(now)))) {
        rc = -1;
        goto done;
    }
    PyObject *new_rotation = NULL, *new_next = NULL;
    if (routed) {
        new_rotation = PyLong_FromLongLong(rotation);
        if (!new_rotation) {
            rc = -1;
            goto done;
        }
        if (t->policy == P_ROUND_ROBIN && !(new_next = PyLong_FromLongLong(rr_next))) {
            Py_DECREF(new_rotation);
            rc = -1;
            goto done;
        }
    }
    const uint8_t *kind = (const uint8_t *)PyBytes_AS_STRING(t->add_kind);
    size_t kind_len = (size_t)PyBytes_GET_SIZE(t->add_kind);
    /* The lane's room for the message, and the record filed: the last steps that may fail. */
    if (lanes_reserve(lanes, (uint32_t)lane, kind_len, rec->b_len) < 0 ||
        PyDict_SetItem(t->records, slot_key, record) < 0) {
        Py_XDECREF(new_rotation);
        Py_XDECREF(new_next);
        rc = -1;
        goto done;
    }
    int bound = writer_c_bind(t->writer, rid, rid_len, slot, ticket, with_lp != 0,
                              FIN_DUPLICATE, (int32_t)index);
    if (bound <= 0) {
        /* -1: no memory for a long rid's key; 0 cannot be (it was bound nowhere above). */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyDict_DelItem(t->records, slot_key);
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        Py_XDECREF(new_rotation);
        Py_XDECREF(new_next);
        rc = bound < 0 ? -1 : 1;
        goto done;
    }
    /* Room reserved above: the copy cannot fail. The payload is copied once, from the ring
     * into the lane (a worker rewriting it meanwhile changes only its own request). */
    lanes_put_message(lanes, (uint32_t)lane, kind, kind_len, rec->b, rec->b_len);
    ((RequestRecord *)record)->sent = 1;
    /* The engine's accounts, as on_add and send_add move them (instance attributes: the
     * stores of existing keys allocate nothing). */
    PyObject_SetAttr(engine, S_in_flight, in_flight);
    PyObject_SetAttr(engine, S_requests_total, requests);
    if (busy) PyObject_SetAttr(engine, S_busy_since, busy);
    PyObject *pending = PyObject_GetAttr(engine, S_input_pending);
    if (pending) {
        if (pending != Py_False) PyObject_SetAttr(engine, S_input_pending, Py_False);
        Py_DECREF(pending);
    }
    if (routed) {
        PyObject_SetAttr(t->router, S_rotation, new_rotation);
        Py_DECREF(new_rotation);
        if (new_next) {
            PyObject_SetAttr(t->router, S_rr_next, new_next);
            Py_DECREF(new_next);
        }
    }
    if (PyErr_Occurred()) PyErr_Clear(); /* a store into an instance dict: cannot fail */
    t->flying[row] = flying + 1;
    t->requests[row] = total + 1;
    touch_row(t, row);
    t->counted[C_SUBMISSIONS]++;
    t->adds++;
    rc = 1;
done:
    Py_XDECREF(slot_key);
    Py_XDECREF(rid_obj);
    Py_XDECREF(record);
    Py_XDECREF(in_flight);
    Py_XDECREF(requests);
    Py_XDECREF(busy);
    return rc;
}

static int offer(void *ctx, const sub_view_t *rec) {
    Turn *t = ctx;
    int why = D_KIND;
    int rc = 0;
    if (!t->enabled)
        why = D_OFF;
    else if (rec->kind == SUB_ADD)
        rc = fast_add(t, rec, &why);
    if (rc > 0) return 1;
    if (rc < 0) {
        /* The Python path meets the same error inside its boundary, which counts and logs it. */
        PyErr_Clear();
        why = D_ERROR;
    }
    t->declined[why]++;
    t->left = 1;
    return 0;
}

/* ------------------------------------------------------------------ the end of a native turn */

static void store_word(uint8_t *at, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    atomic_store_explicit((_Atomic uint32_t *)at, v, memory_order_relaxed);
}

static uint32_t clamp_u32(int64_t v) { return v < 0 ? 0 : v > 0xFFFFFFFFll ? 0xFFFFFFFFu : (uint32_t)v; }

/* The engine rows the turn moved: their in-flight and request words, the values it set (no
 * Python runs within a native turn), as IOCore.publish_engine writes them (advisory words:
 * DESIGN.md, "Memory-ordering rules"). */
static void publish_rows(Turn *t) {
    region_t *r = t->region;
    for (uint32_t k = 0; k < t->touched_n; k++) {
        uint32_t row = t->touched_rows[k];
        t->row_touched[row] = 0;
        uint64_t requests = (uint64_t)t->requests[row];
        uint8_t *at = r->base + r->l.engines_off + (uint64_t)row * ENGINE_BYTES;
        store_word(at + 4 * E_IN_FLIGHT, clamp_u32(t->flying[row]));
        store_word(at + 4 * E_REQUESTS_LO, (uint32_t)(requests & 0xFFFFFFFFu));
        store_word(at + 4 * E_REQUESTS_HI, (uint32_t)(requests >> 32));
    }
    t->touched_n = 0;
}

/* The core's count `name` (IOCore.count's dict) and its published word, `n` more. The word is
 * published every turn; the dict is brought up to it before Python runs (`sync_counts`), so
 * IOCore.end_of_turn never writes a smaller value back. */
static uint64_t *count_total(Turn *t, int word) {
    return (uint64_t *)(t->region->base + IO_METRICS_OFF + 8 * word);
}

static void sync_count(Turn *t, int i) {
    if (!t->unsynced[i]) return;
    PyObject *old = PyDict_GetItemWithError(t->counts, t->count_name[i]);
    unsigned long long v = old ? PyLong_AsUnsignedLongLong(old) : 0;
    PyObject *nv = PyErr_Occurred() ? NULL : PyLong_FromUnsignedLongLong(v + t->unsynced[i]);
    if (!nv || PyDict_SetItem(t->counts, t->count_name[i], nv) < 0) PyErr_Clear();
    Py_XDECREF(nv);
    t->unsynced[i] = 0;
}

/* Before Python runs: the core's counts dict takes what the native turns counted. */
static void sync_counts(Turn *t) {
    for (int i = 0; i < C_COUNT; i++) sync_count(t, i);
}

/* This turn's counts into their published words. */
static void publish_counts(Turn *t) {
    for (int i = 0; i < C_COUNT; i++) {
        uint64_t n = t->counted[i];
        if (!n) continue;
        _Atomic uint64_t *w = (_Atomic uint64_t *)count_total(t, t->count_word[i]);
        atomic_store_explicit(w, atomic_load_explicit(w, memory_order_relaxed) + n,
                              memory_order_relaxed);
        t->unsynced[i] += n;
        t->counted[i] = 0;
    }
}

/* The end of a native turn; whether a lane needs the Python turn (failed, or wants EPOLLOUT). */
static int end_turn(Turn *t) {
    int lanes_changed = lanes_flush_all((InputLanes *)t->lanes) != 0;
    if (t->touched_n) publish_rows(t);
    writer_c_wake(t->writer);
    return lanes_changed;
}

/* ------------------------------------------------------------------ run */

static PyObject *turn_run(Turn *self, PyObject *arg) {
    long timeout = PyLong_AsLong(arg);
    if (timeout == -1 && PyErr_Occurred()) return NULL;
    double deadline = timeout >= 0 ? monotonic_now() + (double)timeout / 1000.0 : INFINITY;
    Intake *intake = self->intake == Py_None ? NULL : (Intake *)self->intake;
    struct epoll_event evs[MAX_EVENTS];
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (;;) {
        /* A signal's Python handler (SIGTERM's raises) runs here, between turns. */
        if (PyErr_CheckSignals() < 0) {
            sync_counts(self);
            Py_DECREF(out);
            return NULL;
        }
        double now = monotonic_now();
        int wait = 0;
        if (timeout != 0 && now < deadline) {
            double left = (deadline - now) * 1000.0;
            wait = isinf(left) ? -1 : left > 3600000.0 ? 3600000 : (int)ceil(left);
            /* The rings' wake-up (subring.c): parked published and the rings re-checked before
             * blocking; a record found now means no wait. */
            if (intake && !intake_park_c(intake)) wait = 0;
        }
        int n = epoll_wait(self->epfd, evs, MAX_EVENTS, wait);
        if (n < 0) {
            if (errno == EINTR) continue;
            sync_counts(self);
            Py_DECREF(out);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == self->intake_fd && self->intake_fd >= 0) {
                uint64_t v;
                ssize_t got = read(fd, &v, sizeof v); /* EAGAIN: another read took it */
                (void)got;
                self->counted[C_WAKEUPS]++;
                continue;
            }
            PyObject *ev = Py_BuildValue("(iI)", fd, (unsigned int)evs[i].events);
            if (!ev || PyList_Append(out, ev) < 0) {
                Py_XDECREF(ev);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(ev);
        }
        self->left = 0;
        if (intake && intake_each(intake, offer, self) < 0) PyErr_Clear(); /* offer never fails */
        int lanes_changed = end_turn(self);
        if (PyList_GET_SIZE(out) || self->left || lanes_changed || timeout == 0 ||
            monotonic_now() >= deadline) {
            /* The loop's Python turn goes on from here (and counts itself). */
            publish_counts(self);
            sync_counts(self);
            self->returns++;
            return out;
        }
        self->counted[C_TURNS]++;
        self->counted[C_NATIVE_TURNS]++;
        publish_counts(self);
        self->turns++;
    }
}

static PyObject *turn_stats(Turn *self, PyObject *noargs) {
    PyObject *d = Py_BuildValue("{sKsKsK}", "turns", self->turns, "returns", self->returns,
                                "adds", self->adds);
    if (!d) return NULL;
    for (int i = 0; i < D_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(self->declined[i]);
        char key[32];
        snprintf(key, sizeof key, "declined_%s", DECLINE_NAMES[i]);
        if (!v || PyDict_SetItemString(d, key, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static PyObject *turn_get_enabled(Turn *self, void *closure) { return PyBool_FromLong(self->enabled); }

static int turn_set_enabled(Turn *self, PyObject *v, void *closure) {
    int on = v ? PyObject_IsTrue(v) : 0;
    if (on < 0) return -1;
    self->enabled = on;
    return 0;
}

static PyMethodDef turn_methods[] = {
    {"run", (PyCFunction)turn_run, METH_O,
     "run(timeout_ms) -> list of (fd, events): wait in the loop's epoll and make every turn that\n"
     "needs no Python (the rings' eventfd, the ADD fast path, the end of turn), until the\n"
     "timeout passes (0: one pass; -1: none) or a turn needs Python: then the epoll events for\n"
     "it (possibly none: a declined record waits in its ring, a lane changed, the time is up)."},
    {"stats", (PyCFunction)turn_stats, METH_NOARGS,
     "stats() -> dict: native turns, returns to Python, ADDs placed, records declined by reason."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef turn_getset[] = {
    {"enabled", (getter)turn_get_enabled, (setter)turn_set_enabled,
     "Whether the ADD fast path places records (off: every record goes the Python way).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject TurnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Turn",
    .tp_basicsize = sizeof(Turn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The I/O process's wait and its turns that need no Python (see native/turn.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)turn_init,
    .tp_dealloc = (destructor)turn_dealloc,
    .tp_traverse = (traverseproc)turn_traverse,
    .tp_clear = (inquiry)turn_clear,
    .tp_methods = turn_methods,
    .tp_getset = turn_getset,
};

int turn_module_init(void) {
#define INTERN(var, s) \
    if (!(var = PyUnicode_InternFromString(s))) return -1;
    INTERN(S_state, "state");
    INTERN(S_stall, "stall");
    INTERN(S_in_flight, "in_flight");
    INTERN(S_requests_total, "requests_total");
    INTERN(S_busy_since, "busy_since");
    INTERN(S_backlog, "backlog");
    INTERN(S_aborted, "aborted");
    INTERN(S_times, "times");
    INTERN(S_window, "window");
    INTERN(S_input_pending, "input_pending");
    INTERN(S_row, "row");
    INTERN(S_index, "index");
    INTERN(S_tail, "tail");
    INTERN(S_tail_at, "tail_at");
    INTERN(S_in_flight_at_tail, "in_flight_at_tail");
    INTERN(S_serial, "serial");
    INTERN(S_rotation, "rotation");
    INTERN(S_rr_next, "rr_next");
    INTERN(S_identity, "identity");
#undef INTERN
    return 0;
}
