/*
 * module.c: tsfront._native, the shared-memory slot rings and the I/O process's output hot
 * path. The jobs live in their own files: msgpack.c (bounds-checked msgpack reading), frame.c
 * (the output-frame decoder), region.c (layout and mapping), ridmap.c (rid -> slot), prefix.c
 * (prompt block hashes for routing), writer.c (the I/O process's side), reader.c (a worker's
 * side), subring.c (the workers' submission rings), sse.c (a streamed token's event bytes),
 * push.c (the drain's dispatch of pushed tokens), title.c (the process title ps shows),
 * encodecache.c (prompt-prefix token ids shared by the workers), lanes.c (each engine input
 * connection's outgoing stream), record.c (a request in flight in the I/O core), turn.c (the
 * I/O process's wait and its turns that need no Python).
 * This file holds the module table and the small helpers that belong to none of them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>

#include "encodecache.h"
#include "frame.h"
#include "lanes.h"
#include "prefix.h"
#include "push.h"
#include "reader.h"
#include "record.h"
#include "region.h"
#include "subring.h"
#include "sse.h"
#include "title.h"
#include "turn.h"
#include "writer.h"

PyObject *WireDecodeError = NULL;

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
    {"block_hashes", py_block_hashes, METH_VARARGS,
     "block_hashes(payload, granularity, limit) -> list[int]: the chained hash of each full\n"
     "granularity-token block of an ADD payload's input_ids (at most limit of them); [] for a\n"
     "payload without readable input_ids."},
    {"packed_block_hashes", py_packed_block_hashes, METH_VARARGS,
     "packed_block_hashes(ids, granularity, limit) -> bytes: block_hashes of a list of ids,\n"
     "packed as u64 granularity then one native-endian u64 per block."},
    {"layout", (PyCFunction)(void (*)(void))py_layout, METH_VARARGS | METH_KEYWORDS,
     "layout(num_workers, slots_per_worker, ring_capacity, max_engines) -> dict of offsets."},
    {"token_event", (PyCFunction)(void (*)(void))py_token_event, METH_FASTCALL,
     "token_event(pieces, decoder, tokens, head, tail, errors, framed) -> bytes | None: the\n"
     "table detokenizer's step for tokens (pieces: the table's bytes per id; decoder: the\n"
     "stream's incremental UTF-8 decoder, whose buffer holds an incomplete character and is\n"
     "updated; errors: its error handler), then head + the text as a JSON string + tail, as\n"
     "one HTTP/1.1 chunk when framed; None when the tokens complete no character."},
    {"push_batch", (PyCFunction)(void (*)(void))py_push_batch, METH_FASTCALL,
     "push_batch(updates, refs) -> list: write the events of the updates of a Reader.poll\n"
     "batch whose stream's sink is a parked native Pusher (refs: the streams' weak references\n"
     "by local slot), exactly as RequestStream.deliver and Pusher.__call__ would; the updates\n"
     "it did not take, in order, for RequestStream.deliver (see native/push.c)."},
    {"set_parent_death_signal", set_parent_death_signal, METH_O,
     "Ask the kernel to send this signal to the calling process when its parent exits."},
    {"set_process_title", py_set_process_title, METH_VARARGS,
     "set_process_title(title, name) -> int: the process's name (/proc/PID/comm: its first\n"
     "15 bytes) and its command line (/proc/PID/cmdline, what ps -o args shows), rewritten in\n"
     "its argv area and cut to it (see native/title.c); the bytes of the title it shows."},
    {"anchor_ends", py_anchor_ends, METH_VARARGS,
     "anchor_ends(data, anchors) -> (ends, which): the end offset of every occurrence in data of\n"
     "each of the tuple of bytes anchors (which must not overlap one another), ascending, and\n"
     "the index of the anchor that ends there."},
    {"encode_cache_format", py_encode_cache_format, METH_VARARGS,
     "encode_cache_format(buffer, seed): lay out an empty EncodeCache in a zeroed writable\n"
     "buffer of at least 64 KiB (see native/encodecache.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tsfront._native",
                                    "Shared-memory slot rings and the output hot path.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&ReaderType) < 0 ||
        PyType_Ready(&SubmitterType) < 0 || PyType_Ready(&IntakeType) < 0 ||
        PyType_Ready(&PusherBaseType) < 0 || PyType_Ready(&ConnectionBaseType) < 0 ||
        PyType_Ready(&EncodeCacheType) < 0 || PyType_Ready(&InputLanesType) < 0 ||
        PyType_Ready(&RecordType) < 0 || PyType_Ready(&TurnType) < 0 || turn_module_init() < 0)
        return NULL;
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
    Py_INCREF(&SubmitterType);
    Py_INCREF(&IntakeType);
    PyModule_AddObject(m, "Submitter", (PyObject *)&SubmitterType);
    PyModule_AddObject(m, "Intake", (PyObject *)&IntakeType);
    Py_INCREF(&PusherBaseType);
    PyModule_AddObject(m, "PusherBase", (PyObject *)&PusherBaseType);
    Py_INCREF(&ConnectionBaseType);
    PyModule_AddObject(m, "ConnectionBase", (PyObject *)&ConnectionBaseType);
    Py_INCREF(&EncodeCacheType);
    PyModule_AddObject(m, "EncodeCache", (PyObject *)&EncodeCacheType);
    Py_INCREF(&InputLanesType);
    PyModule_AddObject(m, "InputLanes", (PyObject *)&InputLanesType);
    Py_INCREF(&RecordType);
    PyModule_AddObject(m, "Record", (PyObject *)&RecordType);
    Py_INCREF(&TurnType);
    PyModule_AddObject(m, "Turn", (PyObject *)&TurnType);
    PyModule_AddIntConstant(m, "LANE_SENT", LANE_SENT);
    PyModule_AddIntConstant(m, "LANE_FULL", LANE_FULL);
    PyModule_AddIntConstant(m, "LANE_UNREACHABLE", LANE_UNREACHABLE);
    PyModule_AddIntConstant(m, "SUB_OK", SUB_OK);
    PyModule_AddIntConstant(m, "SUB_FULL", SUB_FULL);
    PyModule_AddIntConstant(m, "SUB_TOO_BIG", SUB_TOO_BIG);
    PyModule_AddIntConstant(m, "SUB_ZMQ_PENDING", SUB_ZMQ_PENDING);
    PyModule_AddIntConstant(m, "SUB_ADD", SUB_ADD);
    PyModule_AddIntConstant(m, "SUB_ABORT", SUB_ABORT);
    PyModule_AddIntConstant(m, "SLOT_IDLE", SLOT_IDLE);
    PyModule_AddIntConstant(m, "SLOT_LIVE", SLOT_LIVE);
    PyModule_AddIntConstant(m, "SLOT_DONE", SLOT_DONE);
    PyModule_AddIntConstant(m, "FIN_NONE", FIN_NONE);
    PyModule_AddIntConstant(m, "FIN_STOP", FIN_STOP);
    PyModule_AddIntConstant(m, "FIN_LENGTH", FIN_LENGTH);
    PyModule_AddIntConstant(m, "FIN_ABORT", FIN_ABORT);
    PyModule_AddIntConstant(m, "FIN_OTHER", FIN_OTHER);
    PyModule_AddIntConstant(m, "FIN_LOCAL_FIRST", FIN_LOCAL_FIRST);
    PyModule_AddIntConstant(m, "FIN_ENGINE_DEAD", FIN_ENGINE_DEAD);
    PyModule_AddIntConstant(m, "FIN_SEND_TIMEOUT", FIN_SEND_TIMEOUT);
    PyModule_AddIntConstant(m, "FIN_DUPLICATE", FIN_DUPLICATE);
    PyModule_AddIntConstant(m, "FIN_NO_ENGINE", FIN_NO_ENGINE);
    PyModule_AddIntConstant(m, "FIN_IO_STOPPING", FIN_IO_STOPPING);
    PyModule_AddIntConstant(m, "FIN_RID_ABORTED", FIN_RID_ABORTED);
    PyModule_AddIntConstant(m, "FIN_DEADLINE", FIN_DEADLINE);
    PyModule_AddIntConstant(m, "FIN_PREFILL_DEAD", FIN_PREFILL_DEAD);
    PyModule_AddIntConstant(m, "FIN_PREFILL_SEND_TIMEOUT", FIN_PREFILL_SEND_TIMEOUT);
    PyModule_AddIntConstant(m, "FIN_PREFILL_ABORTED", FIN_PREFILL_ABORTED);
    PyModule_AddIntConstant(m, "FIN_ENGINE_STALLED", FIN_ENGINE_STALLED);
    PyModule_AddIntConstant(m, "ENGINE_BYTES", ENGINE_BYTES);
    PyModule_AddIntConstant(m, "ENGINE_WORDS", ENGINE_WORDS);
    PyModule_AddIntConstant(m, "HEADER_BYTES", HEADER_BYTES);
    PyModule_AddIntConstant(m, "E_STATE", E_STATE);
    PyModule_AddIntConstant(m, "E_INDEX", E_INDEX);
    PyModule_AddIntConstant(m, "E_IN_FLIGHT", E_IN_FLIGHT);
    PyModule_AddIntConstant(m, "E_RUNNING", E_RUNNING);
    PyModule_AddIntConstant(m, "E_WAITING", E_WAITING);
    PyModule_AddIntConstant(m, "E_KV_ACTIVE", E_KV_ACTIVE);
    PyModule_AddIntConstant(m, "E_KV_TOTAL", E_KV_TOTAL);
    PyModule_AddIntConstant(m, "E_LOAD_MS_LO", E_LOAD_MS_LO);
    PyModule_AddIntConstant(m, "E_LOAD_MS_HI", E_LOAD_MS_HI);
    PyModule_AddIntConstant(m, "E_REQUESTS_LO", E_REQUESTS_LO);
    PyModule_AddIntConstant(m, "E_REQUESTS_HI", E_REQUESTS_HI);
    PyModule_AddIntConstant(m, "ENGINE_ABSENT", ENGINE_ABSENT);
    PyModule_AddIntConstant(m, "ENGINE_HANDSHAKING", ENGINE_HANDSHAKING);
    PyModule_AddIntConstant(m, "ENGINE_LIVE", ENGINE_LIVE);
    PyModule_AddIntConstant(m, "ENGINE_DEAD", ENGINE_DEAD);
    PyModule_AddIntConstant(m, "ENGINE_STALLED", ENGINE_STALLED);
    return m;
}
