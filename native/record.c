/*
 * record.c: tsfront._native.Record, a request in flight in the I/O core (tsfront/io/core.py):
 * its rid, the engine holding it, its worker's ticket, whether its ADD left for the engine
 * (one still in the backlog needs no ABORT: it is just dropped); under disaggregated serving
 * the prefill half's engine, whether its ADD left, and the request's bootstrap room. The core
 * reads and sets these fields as it did those of its Python class; the native turn (turn.c)
 * makes records for the ADDs it places, without a Python frame.
 */
#include "record.h"

#include <structmember.h>

static void record_dealloc(RequestRecord *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->rid);
    Py_CLEAR(self->engine);
    Py_CLEAR(self->prefill);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int record_traverse(RequestRecord *self, visitproc visit, void *arg) {
    Py_VISIT(self->rid);
    Py_VISIT(self->engine);
    Py_VISIT(self->prefill);
    return 0;
}

static int record_clear(RequestRecord *self) {
    Py_CLEAR(self->rid);
    Py_CLEAR(self->engine);
    Py_CLEAR(self->prefill);
    return 0;
}

static int record_init(RequestRecord *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"rid", "engine", "ticket", "sent", NULL};
    PyObject *rid, *engine;
    unsigned long long ticket;
    int sent = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "SOK|p", kwlist, &rid, &engine, &ticket, &sent))
        return -1;
    Py_XSETREF(self->rid, Py_NewRef(rid));
    Py_XSETREF(self->engine, Py_NewRef(engine));
    Py_XSETREF(self->prefill, Py_NewRef(Py_None));
    self->ticket = ticket;
    self->room = 0;
    self->sent = (char)sent;
    self->prefill_sent = 0;
    return 0;
}

PyObject *record_new(PyObject *rid, PyObject *engine, uint64_t ticket) {
    RequestRecord *r = PyObject_GC_New(RequestRecord, &RecordType);
    if (!r) return NULL;
    r->rid = Py_NewRef(rid);
    r->engine = Py_NewRef(engine);
    r->prefill = Py_NewRef(Py_None);
    r->ticket = ticket;
    r->room = 0;
    r->sent = 0;
    r->prefill_sent = 0;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PyObject *record_repr(RequestRecord *self) {
    return PyUnicode_FromFormat("Record(rid=%R, engine=%R, ticket=%llu, sent=%s)", self->rid,
                                self->engine, self->ticket, self->sent ? "True" : "False");
}

static PyMemberDef record_members[] = {
    {"rid", T_OBJECT_EX, offsetof(RequestRecord, rid), 0, "The request's rid (bytes)."},
    {"engine", T_OBJECT_EX, offsetof(RequestRecord, engine), 0,
     "The engine holding it (under disaggregated serving: the decode engine)."},
    {"ticket", T_ULONGLONG, offsetof(RequestRecord, ticket), 0, "Its worker's ticket."},
    {"sent", T_BOOL, offsetof(RequestRecord, sent), 0, "Whether its ADD left for the engine."},
    {"prefill", T_OBJECT, offsetof(RequestRecord, prefill), 0,
     "The prefill half's engine (disaggregated serving), or None."},
    {"prefill_sent", T_BOOL, offsetof(RequestRecord, prefill_sent), 0,
     "Whether the prefill half's ADD left."},
    {"room", T_ULONGLONG, offsetof(RequestRecord, room), 0, "Its bootstrap room (0: none)."},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.Record",
    .tp_basicsize = sizeof(RequestRecord),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Record(rid, engine, ticket, sent=True): a request in flight in the I/O core.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)record_init,
    .tp_dealloc = (destructor)record_dealloc,
    .tp_traverse = (traverseproc)record_traverse,
    .tp_clear = (inquiry)record_clear,
    .tp_repr = (reprfunc)record_repr,
    .tp_members = record_members,
};
