/* region.c: layout computation and mapping of the shared slot region (see region.h). */
#include "region.h"

#include <string.h>

static uint64_t align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

int compute_layout(layout_t *l, uint32_t workers, uint32_t spw, uint32_t cap, uint32_t engines,
                   uint32_t submit_bytes) {
    if (workers == 0 || spw == 0 || cap == 0 || engines == 0 || workers > 4096 || spw > (1u << 20) ||
        cap > (1u << 20) || engines > 65536 || submit_bytes > (1u << 30) ||
        submit_bytes % SUBMIT_ALIGN != 0 || (submit_bytes != 0 && submit_bytes < 4096)) {
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
    l->submit_ring_bytes = submit_bytes;
    l->submit_off = align64(l->slots_off + (uint64_t)workers * spw * l->slot_bytes);
    l->submit_stride = submit_bytes ? SUBMIT_CTL_BYTES + (uint64_t)submit_bytes : 0;
    l->total_bytes = submit_bytes ? l->submit_off + SUBMIT_SHARED_BYTES + workers * l->submit_stride
                                  : l->submit_off;
    return 0;
}

static PyObject *layout_dict(const layout_t *l) {
    return Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsIsIsIsIsI}", "total_bytes", l->total_bytes, "engines_off",
                         l->engines_off, "workers_off", l->workers_off, "notify_off", l->notify_off,
                         "slots_off", l->slots_off, "slot_bytes", l->slot_bytes, "tokens_off",
                         l->tokens_off, "lpv_off", l->lpv_off, "lpi_off", l->lpi_off, "num_workers",
                         l->num_workers, "slots_per_worker", l->slots_per_worker, "ring_capacity",
                         l->ring_capacity, "max_engines", l->max_engines, "submit_off",
                         l->submit_off, "submit_stride", l->submit_stride, "submit_ring_bytes",
                         l->submit_ring_bytes);
}

PyObject *py_layout(PyObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"num_workers", "slots_per_worker", "ring_capacity", "max_engines",
                             "submit_ring_bytes", NULL};
    unsigned int w, s, c, e, sub = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "IIII|I", kwlist, &w, &s, &c, &e, &sub)) return NULL;
    layout_t l;
    if (compute_layout(&l, w, s, c, e, sub) < 0) return NULL;
    return layout_dict(&l);
}

int region_open(region_t *r, PyObject *buffer, uint32_t w, uint32_t s, uint32_t c,
                       uint32_t e, uint32_t sub, int init) {
    if (compute_layout(&r->l, w, s, c, e, sub) < 0) return -1;
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
        h->submit_ring_bytes = sub;
        h->total_bytes = r->l.total_bytes;
        /* The geometry happens-before the magic: a Reader that sees the magic (after its
         * acquire fence below) sees the geometry it checks. */
        atomic_thread_fence(memory_order_release);
        h->magic = REGION_MAGIC;
    } else {
        atomic_thread_fence(memory_order_acquire);
        if (h->magic != REGION_MAGIC || h->abi != ABI_VERSION || h->num_workers != w ||
            h->slots_per_worker != s || h->ring_capacity != c || h->max_engines != e || h->submit_ring_bytes != sub) {
            PyBuffer_Release(&r->view);
            PyErr_SetString(PyExc_ValueError,
                            "shared memory does not hold a tsfront region of this layout "
                            "(I/O process and worker from different tsfront versions?)");
            return -1;
        }
    }
    return 0;
}
