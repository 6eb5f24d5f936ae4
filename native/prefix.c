/*
 * prefix.c: block hashes of an ADD payload's input_ids (see prefix.h).
 *
 * Block i's hash names the whole prefix input_ids[0 : (i + 1) * granularity]: it is a mix of
 * block i - 1's hash and block i's tokens, so equal hashes at depth i mean (up to 64-bit
 * collisions) equal prefixes, and a lookup never re-reads earlier blocks. Only full blocks
 * are hashed: an engine caches whole pages.
 */
#include "prefix.h"

#include <stdint.h>

#include "msgpack.h"

/* The ADD payload is [tag, rid, http_worker_ipc, input_text, input_ids, ...]. */
#define INPUT_IDS_POSITION 4

static inline uint64_t mix64(uint64_t z) {
    /* splitmix64's finalizer: every input bit reaches every output bit. */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Reads one token id at *pp: the encodings msgspec emits for ids in 0..2^31 inline, anything
 * else through rd_int. A local cursor (not cur_t's) keeps it in a register: a uint8_t store
 * may alias anything, so the compiler would otherwise reload cur_t.p for every token. */
static inline int rd_token(const uint8_t **pp, const uint8_t *end, uint32_t *t) {
    const uint8_t *p = *pp;
    if (p < end) {
        uint8_t b = *p;
        if (b <= 0x7f) {
            *t = b;
            *pp = p + 1;
            return 0;
        }
        if (b == 0xcd && end - p >= 3) {
            *t = be16(p + 1);
            *pp = p + 3;
            return 0;
        }
        if (b == 0xce && end - p >= 5) {
            *t = be32(p + 1);
            *pp = p + 5;
            return 0;
        }
    }
    cur_t c = {p, end, NULL};
    int64_t v;
    if (rd_int(&c, &v) < 0) return -1;
    *t = (uint32_t)v; /* the worker validated ids as int32; anything else only hashes oddly */
    *pp = c.p;
    return 0;
}

/* Four independent lanes (in registers) keep the multiplies out of one dependency chain;
 * granularity need not be a multiple of 4: the tail goes to lane a. */
#define LANES_INIT(chain)                                                                      \
    uint64_t a = (chain), b1 = (chain) ^ 0x632be59bd9b4e019ULL, b2 = (chain) + 0x85ebca6bULL, \
             b3 = ~(chain)
#define FNV 0x100000001b3ULL
#define LANES_END(chain, b) mix64(a ^ mix64(b1 ^ mix64(b2 ^ mix64(b3 + (uint64_t)(b)))))
#define CHAIN_SEED 0x9e3779b97f4a7c15ULL

PyObject *py_block_hashes(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t granularity, limit;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &granularity, &limit)) return NULL;
    PyObject *out = NULL;
    if (granularity < 1 || limit < 0) {
        PyErr_SetString(PyExc_ValueError, "granularity must be >= 1 and limit >= 0");
        goto done;
    }
    cur_t c = {(const uint8_t *)buf.buf, (const uint8_t *)buf.buf + buf.len, NULL};
    uint32_t fields, n = 0;
    /* A payload this cannot read hashes to no blocks: it routes like a fresh prompt, and
     * the engine (not the router) says what was wrong with it. */
    if (rd_array(&c, &fields) < 0 || fields <= INPUT_IDS_POSITION) goto empty;
    for (int i = 0; i < INPUT_IDS_POSITION; i++)
        if (mp_skip(&c, 0) < 0) goto empty;
    if (c.p >= c.end || *c.p == 0xc0 || rd_array(&c, &n) < 0) goto empty;
    Py_ssize_t blocks = (Py_ssize_t)n / granularity;
    if (blocks > limit) blocks = limit;
    out = PyList_New(blocks);
    if (!out) goto done;
    uint64_t chain = CHAIN_SEED;
    const uint8_t *p = c.p, *end = c.end;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        LANES_INIT(chain);
        uint32_t t0, t1, t2, t3;
        Py_ssize_t i = 0;
        for (; i + 4 <= granularity; i += 4) {
            if (rd_token(&p, end, &t0) < 0 || rd_token(&p, end, &t1) < 0 || rd_token(&p, end, &t2) < 0 ||
                rd_token(&p, end, &t3) < 0)
                goto bad;
            a = (a ^ t0) * FNV;
            b1 = (b1 ^ t1) * FNV;
            b2 = (b2 ^ t2) * FNV;
            b3 = (b3 ^ t3) * FNV;
        }
        for (; i < granularity; i++) {
            if (rd_token(&p, end, &t0) < 0) goto bad;
            a = (a ^ t0) * FNV;
        }
        chain = LANES_END(chain, b);
        /* 62 bits: a small Python int, and never hashes to -1. */
        PyObject *h = PyLong_FromUnsignedLongLong(chain >> 2);
        if (!h) {
            Py_DECREF(out);
            out = NULL;
            goto done;
        }
        PyList_SET_ITEM(out, b, h);
    }
    goto done;
bad:
    Py_DECREF(out);
empty:
    out = PyList_New(0);
done:
    PyBuffer_Release(&buf);
    return out;
}

/* Token i of a list of ints as the hash reads it (an int outside u32 only hashes oddly: the
 * request is refused by validation before it is hashed). */
static inline uint32_t list_token(PyObject *list, Py_ssize_t i) {
    return (uint32_t)PyLong_AsUnsignedLongMask(PyList_GET_ITEM(list, i));
}

PyObject *py_packed_block_hashes(PyObject *self, PyObject *args) {
    PyObject *ids;
    Py_ssize_t granularity, limit;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &ids, &granularity, &limit)) return NULL;
    if (granularity < 1 || granularity > UINT32_MAX || limit < 0) {
        PyErr_SetString(PyExc_ValueError, "granularity must be in 1..2^32-1 and limit >= 0");
        return NULL;
    }
    Py_ssize_t blocks = PyList_GET_SIZE(ids) / granularity;
    if (blocks > limit) blocks = limit;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 + 8 * blocks);
    if (!out) return NULL;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out);
    uint64_t head = (uint64_t)granularity;
    memcpy(w, &head, 8);
    uint64_t chain = CHAIN_SEED;
    Py_ssize_t k = 0;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        LANES_INIT(chain);
        Py_ssize_t i = 0;
        for (; i + 4 <= granularity; i += 4, k += 4) {
            a = (a ^ list_token(ids, k)) * FNV;
            b1 = (b1 ^ list_token(ids, k + 1)) * FNV;
            b2 = (b2 ^ list_token(ids, k + 2)) * FNV;
            b3 = (b3 ^ list_token(ids, k + 3)) * FNV;
        }
        for (; i < granularity; i++, k++) a = (a ^ list_token(ids, k)) * FNV;
        chain = LANES_END(chain, b);
        uint64_t h = chain >> 2;
        memcpy(w + 8 + 8 * b, &h, 8);
    }
    if (PyErr_Occurred()) PyErr_Clear(); /* a non-int only hashes oddly, as above */
    return out;
}
