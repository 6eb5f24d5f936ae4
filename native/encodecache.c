/*
 * encodecache.c: the shared store of prompt-prefix token ids (see encodecache.h and
 * tsfront/text/encode_cache.py, which proves when a cut is exact and does the encoding).
 *
 * A prompt's UTF-8 bytes are cut right after each anchor occurrence: ends[0] < ends[1] < ...
 * Boundary j's key is a seeded chained hash of the bytes up to ends[j]; its record holds the
 * bytes and the token ids of one segment, data[start : ends[j]], where start is the previous
 * boundary's end (0 for the first), and the key of that previous boundary (its parent). The ids
 * of a prefix are its records' ids from the first boundary on: a lookup walks the parents down
 * from the longest boundary found, comparing every record's bytes with the prompt's, so a hit
 * is exact whatever the hashes do (a collision is only a miss).
 *
 * Layout of the region (all offsets from its start, u64 words native-endian):
 *
 *   0    header: magic, version, slots, arena bytes, seed, slots offset, arena offset
 *   64   reserved: the arena's write position (bytes ever reserved; atomic)
 *   128  counters (atomic, relaxed): see EC_COUNTERS
 *   256  slots: `slots` x {seq, key, pos, size} (32 bytes each, all atomic)
 *   ...  arena: records written in a ring, each at an 8-byte aligned absolute position
 *
 * Memory ordering (the rules of docs/DESIGN.md's "Memory ordering" section):
 *
 * - A slot is a seqlock. A writer takes it by CAS of an even seq to seq + 1 (acquire; a writer
 *   that loses the CAS skips the slot: this is a cache), stores key, pos and size (relaxed) and
 *   publishes with a release store of seq + 2. A reader loads seq (acquire), the three fields
 *   (relaxed), fences (acquire) and loads seq again: an odd or changed seq is a miss. A writer
 *   that dies holding a slot leaves it odd: that one slot is lost, no reader is misled.
 * - The arena is a ring over `reserved`: a writer reserves [pos, pos + size) by CAS of
 *   `reserved` (never wrapping a record around the end: the rest of the ring is skipped), then
 *   fences (release), writes the record, then publishes the slot. Bytes at ring offset
 *   pos % arena are overwritten only by a writer whose reservation passed pos + arena.
 *   A reader reads a record (plain loads: it may be overwritten meanwhile, and nothing read is
 *   used before the check), fences (acquire) and loads `reserved`: the record was intact iff
 *   reserved <= pos + arena. Fields read from a record are bounds-checked before use, so a
 *   torn record costs a miss, never a read outside the region.
 * - A record whose bytes are in the oldest quarter of the ring when a lookup uses it is written
 *   again at the head (its slot re-pointed), so a prefix in use is not overwritten.
 */
#define _GNU_SOURCE /* memmem */
#include "encodecache.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EC_MAGIC 0x31454843414345ULL /* "ECACHE1" */
#define EC_VERSION 1
#define EC_HEADER 256
#define EC_SLOT_BYTES 32
#define EC_PROBES 8
#define EC_RECORD_HEAD 40
#define EC_MAX_WALK 65536

/* Counters at offset 128, in this order (tsfront.text.encode_cache.COUNTERS). */
enum {
    C_LOOKUPS,      /* lookups with at least one boundary */
    C_HITS,         /* of which found a prefix */
    C_HIT_BYTES,    /* prompt bytes whose ids came from the store */
    C_STORED,       /* records written (new and refreshed) */
    C_STORE_BUSY,   /* records not stored: their slots were being written */
    C_STALE,        /* records found overwritten (or torn) when read */
    C_REFRESHED,    /* records written again at the head (in use, about to be overwritten) */
    C_TOO_BIG,      /* records not stored: over a quarter of the arena */
    EC_COUNTERS
};

typedef struct {
    uint64_t magic, version, slots, arena, seed, slots_off, arena_off, pad0;
    _Atomic uint64_t reserved;
    uint64_t pad1[7];
    _Atomic uint64_t counters[16];
} ec_header;

typedef struct {
    _Atomic uint64_t seq, key, pos, size;
} ec_slot;

/* A record: key, parent key, start (byte offset of the segment in its prompt), text length,
 * id count, a check of the ids (their hash seeded by the key), then the text (padded to 8) and
 * the ids (u32, padded to 8). The text is compared with the prompt's and the ids with their
 * check on every read, so no byte of a record can change a prompt's ids unnoticed. */
typedef struct {
    uint64_t key, parent, start;
    uint32_t text_len, n_ids;
    uint64_t check;
} ec_record;

_Static_assert(sizeof(ec_header) == EC_HEADER, "header size");
_Static_assert(sizeof(ec_slot) == EC_SLOT_BYTES, "slot size");
_Static_assert(sizeof(ec_record) == EC_RECORD_HEAD, "record head size");

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A seeded hash of n bytes chained on h: two lanes of 8-byte words. Collisions only cost a
 * miss (every hit is compared byte for byte), so speed is what matters. */
static uint64_t hash_bytes(const uint8_t *p, size_t n, uint64_t h) {
    uint64_t a = h ^ (n * 0x9e3779b97f4a7c15ULL), b = ~h + 0x632be59bd9b4e019ULL;
    while (n >= 16) {
        uint64_t x, y;
        memcpy(&x, p, 8);
        memcpy(&y, p + 8, 8);
        a = (a ^ x) * 0x9fb21c651e98df25ULL;
        a ^= a >> 29;
        b = (b ^ y) * 0xc2b2ae3d27d4eb4fULL;
        b ^= b >> 32;
        p += 16;
        n -= 16;
    }
    uint64_t t = 0;
    if (n >= 8) {
        memcpy(&t, p, 8);
        a = (a ^ t) * 0x9fb21c651e98df25ULL;
        p += 8;
        n -= 8;
        t = 0;
    }
    memcpy(&t, p, n);
    b = (b ^ t ^ ((uint64_t)n << 56)) * 0xc2b2ae3d27d4eb4fULL;
    uint64_t k = mix64(a ^ mix64(b));
    return k ? k : 1; /* key 0 marks an empty slot */
}

static inline size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

typedef struct {
    PyObject_HEAD Py_buffer view;
    uint8_t *base;
    ec_header *h;
    ec_slot *slots;
    uint8_t *arena;
    uint64_t mask, arena_bytes;
} EncodeCache;

static inline void count(EncodeCache *c, int which, uint64_t n) {
    atomic_fetch_add_explicit(&c->h->counters[which], n, memory_order_relaxed);
}

/* ------------------------------------------------------------------ format and attach */

PyObject *py_encode_cache_format(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "w*K", &b, &seed)) return NULL;
    PyObject *out = NULL;
    size_t len = (size_t)b.len;
    if (len < (1u << 16)) {
        PyErr_SetString(PyExc_ValueError, "an encode cache needs at least 64 KiB");
        goto done;
    }
    /* One slot per 512 arena bytes (a power of two), the rest for the arena. */
    uint64_t slots = 1;
    while (slots * 2 * (512 + EC_SLOT_BYTES) <= len - EC_HEADER) slots *= 2;
    ec_header *h = (ec_header *)b.buf;
    memset(b.buf, 0, EC_HEADER + slots * EC_SLOT_BYTES);
    h->slots = slots;
    h->slots_off = EC_HEADER;
    h->arena_off = EC_HEADER + slots * EC_SLOT_BYTES;
    h->arena = (len - h->arena_off) & ~(uint64_t)7;
    h->seed = seed;
    h->version = EC_VERSION;
    atomic_store_explicit(&h->reserved, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    h->magic = EC_MAGIC;
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&b);
    return out;
}

static int ec_init(EncodeCache *self, PyObject *args, PyObject *kw) {
    PyObject *buffer;
    if (!PyArg_ParseTuple(args, "O", &buffer)) return -1;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
    ec_header *h = (ec_header *)self->view.buf;
    size_t len = (size_t)self->view.len;
    if (len < EC_HEADER || h->magic != EC_MAGIC || h->version != EC_VERSION ||
        h->slots == 0 || (h->slots & (h->slots - 1)) != 0 ||
        h->arena_off != EC_HEADER + h->slots * EC_SLOT_BYTES || h->arena_off + h->arena > len) {
        PyErr_SetString(PyExc_ValueError, "not an encode cache region (encode_cache_format it)");
        PyBuffer_Release(&self->view);
        self->view.buf = NULL;
        return -1;
    }
    self->base = (uint8_t *)self->view.buf;
    self->h = h;
    self->slots = (ec_slot *)(self->base + h->slots_off);
    self->arena = self->base + h->arena_off;
    self->mask = h->slots - 1;
    self->arena_bytes = h->arena;
    return 0;
}

static void ec_dealloc(EncodeCache *self) {
    if (self->view.buf) PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------ slots */

/* The record position and size published under `key`, or 0 (no such slot readable now). */
static int slot_find(EncodeCache *c, uint64_t key, uint64_t *pos, uint64_t *size) {
    for (int j = 0; j < EC_PROBES; j++) {
        ec_slot *s = &c->slots[(key + (uint64_t)j) & c->mask];
        uint64_t s1 = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (s1 & 1) continue;
        uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
        uint64_t p = atomic_load_explicit(&s->pos, memory_order_relaxed);
        uint64_t z = atomic_load_explicit(&s->size, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->seq, memory_order_relaxed) != s1) continue;
        if (k == key && z) {
            *pos = p;
            *size = z;
            return 1;
        }
    }
    return 0;
}

/* Point a slot of `key` at a record: the key's own slot, else an empty one, else the one of
 * the oldest record among the probes. 0 if every candidate was being written. */
static int slot_publish(EncodeCache *c, uint64_t key, uint64_t pos, uint64_t size) {
    ec_slot *pick = NULL;
    uint64_t oldest = UINT64_MAX;
    for (int j = 0; j < EC_PROBES; j++) {
        ec_slot *s = &c->slots[(key + (uint64_t)j) & c->mask];
        uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
        if (k == key) {
            pick = s;
            break;
        }
        uint64_t p = k ? atomic_load_explicit(&s->pos, memory_order_relaxed) : 0;
        if (!pick || p < oldest) { /* an empty slot (key 0) counts as the oldest */
            pick = s;
            oldest = p;
        }
    }
    uint64_t seq = atomic_load_explicit(&pick->seq, memory_order_relaxed);
    if ((seq & 1) || !atomic_compare_exchange_strong_explicit(&pick->seq, &seq, seq + 1,
                                                              memory_order_acquire,
                                                              memory_order_relaxed))
        return 0;
    atomic_store_explicit(&pick->key, key, memory_order_relaxed);
    atomic_store_explicit(&pick->pos, pos, memory_order_relaxed);
    atomic_store_explicit(&pick->size, size, memory_order_relaxed);
    atomic_store_explicit(&pick->seq, seq + 2, memory_order_release);
    return 1;
}

/* ------------------------------------------------------------------ records */

/* Reserve `size` bytes of the ring; the absolute position, or UINT64_MAX if too big. */
static uint64_t reserve(EncodeCache *c, uint64_t size) {
    uint64_t a = c->arena_bytes;
    if (size > a / 4) return UINT64_MAX;
    uint64_t r = atomic_load_explicit(&c->h->reserved, memory_order_relaxed);
    for (;;) {
        uint64_t at = r, room = a - r % a;
        if (room < size) at = r + room; /* a record never wraps: skip the ring's tail */
        if (atomic_compare_exchange_weak_explicit(&c->h->reserved, &r, at + size,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            atomic_thread_fence(memory_order_release);
            return at;
        }
    }
}

static int write_record(EncodeCache *c, uint64_t key, uint64_t parent, uint64_t start,
                        const uint8_t *text, uint32_t text_len, const uint32_t *ids,
                        uint32_t n_ids) {
    uint64_t size = EC_RECORD_HEAD + pad8(text_len) + pad8((size_t)n_ids * 4);
    uint64_t pos = reserve(c, size);
    if (pos == UINT64_MAX) {
        count(c, C_TOO_BIG, 1);
        return 0;
    }
    uint8_t *at = c->arena + pos % c->arena_bytes;
    ec_record head = {key, parent, start, text_len, n_ids,
                      hash_bytes((const uint8_t *)ids, (size_t)n_ids * 4, key)};
    memcpy(at, &head, EC_RECORD_HEAD);
    memcpy(at + EC_RECORD_HEAD, text, text_len);
    memcpy(at + EC_RECORD_HEAD + pad8(text_len), ids, (size_t)n_ids * 4);
    if (!slot_publish(c, key, pos, size)) {
        count(c, C_STORE_BUSY, 1);
        return 0;
    }
    count(c, C_STORED, 1);
    return 1;
}

/* ------------------------------------------------------------------ lookup */

typedef struct {
    uint64_t pos, size, start, check;
    const uint8_t *ids;
    uint32_t n_ids;
    Py_ssize_t boundary;
} ec_link;

/* Index of `start` in ends[0..below), or -1. */
static Py_ssize_t find_end(const uint64_t *ends, Py_ssize_t below, uint64_t start) {
    Py_ssize_t lo = 0, hi = below;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (ends[mid] < start) lo = mid + 1;
        else hi = mid;
    }
    return lo < below && ends[lo] == start ? lo : -1;
}

/* Walk the chain down from boundary j. Fills links[0..*n) (leaf first) and returns 1, or
 * returns 0 with *broken the boundary whose record was missing or wrong. */
static int walk(EncodeCache *c, const uint8_t *data, const uint64_t *ends, const uint64_t *keys,
                Py_ssize_t j, ec_link *links, Py_ssize_t *n, Py_ssize_t *broken) {
    *n = 0;
    for (;;) {
        uint64_t pos, size;
        if (!slot_find(c, keys[j], &pos, &size) || size < EC_RECORD_HEAD ||
            size > c->arena_bytes / 4 || pos % 8) {
            *broken = j;
            return 0;
        }
        const uint8_t *at = c->arena + pos % c->arena_bytes;
        if (pos % c->arena_bytes + size > c->arena_bytes) {
            *broken = j;
            return 0;
        }
        ec_record head;
        memcpy(&head, at, EC_RECORD_HEAD);
        uint64_t end = ends[j];
        uint64_t need = EC_RECORD_HEAD + pad8(head.text_len) + pad8((size_t)head.n_ids * 4);
        Py_ssize_t parent = -1;
        if (head.key != keys[j] || need != size || head.start >= end ||
            end - head.start != head.text_len ||
            (head.start && (parent = find_end(ends, j, head.start)) < 0) ||
            head.parent != (parent >= 0 ? keys[parent] : 0) ||
            memcmp(at + EC_RECORD_HEAD, data + head.start, head.text_len) != 0) {
            *broken = j;
            return 0;
        }
        links[*n] = (ec_link){pos, size, head.start, head.check,
                              at + EC_RECORD_HEAD + pad8(head.text_len), head.n_ids, j};
        (*n)++;
        if (parent < 0) return 1;
        j = parent;
    }
}

static PyObject *ids_arg(PyObject *seq, uint32_t **out, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(seq, "ids must be a sequence of ints");
    if (!fast) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    *out = PyMem_Malloc(((size_t)*n + 1) * 4);
    if (!*out) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < *n; i++) {
        unsigned long v = PyLong_AsUnsignedLong(items[i]);
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "token id over 2**32 - 1");
            PyMem_Free(*out);
            Py_DECREF(fast);
            return NULL;
        }
        (*out)[i] = (uint32_t)v;
    }
    return fast;
}

/* The boundary ends (u64, ascending, within the data) and their chained keys. */
static int boundaries(EncodeCache *c, const Py_buffer *data, PyObject *ends_obj, uint64_t **ends,
                      uint64_t **keys, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(ends_obj, "ends must be a sequence of ints");
    if (!fast) return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    *ends = PyMem_Malloc(((size_t)*n + 1) * 8);
    *keys = PyMem_Malloc(((size_t)*n + 1) * 8);
    if (!*ends || !*keys) {
        PyMem_Free(*ends);
        PyMem_Free(*keys);
        *ends = *keys = NULL;
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    uint64_t prev = 0, h = c->h->seed;
    for (Py_ssize_t i = 0; i < *n; i++) {
        Py_ssize_t e = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (e == -1 && PyErr_Occurred()) goto bad;
        if (e <= (Py_ssize_t)prev || e > data->len) {
            PyErr_SetString(PyExc_ValueError, "ends must ascend within the data, from above 0");
            goto bad;
        }
        h = hash_bytes((const uint8_t *)data->buf + prev, (size_t)e - prev, h);
        (*ends)[i] = (uint64_t)e;
        (*keys)[i] = h;
        prev = (uint64_t)e;
    }
    Py_DECREF(fast);
    return 0;
bad:
    PyMem_Free(*ends);
    PyMem_Free(*keys);
    *ends = *keys = NULL; /* the caller frees them too */
    Py_DECREF(fast);
    return -1;
}

static PyObject *ec_lookup(EncodeCache *self, PyObject *args) {
    Py_buffer data;
    PyObject *ends_obj;
    if (!PyArg_ParseTuple(args, "y*O", &data, &ends_obj)) return NULL;
    uint64_t *ends = NULL, *keys = NULL;
    ec_link *links = NULL;
    uint32_t *ids = NULL;
    PyObject *out = NULL;
    Py_ssize_t n;
    if (boundaries(self, &data, ends_obj, &ends, &keys, &n) < 0) goto done;
    Py_ssize_t covered = 0, total = 0;
    if (n) count(self, C_LOOKUPS, 1);
    links = PyMem_Malloc(((size_t)n + 1) * sizeof(ec_link));
    if (!links) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t below = n, nlinks = 0, work = 0;
    while (below > 0 && work < EC_MAX_WALK) {
        Py_ssize_t j = below - 1, broken = -1;
        uint64_t pos, size;
        work++;
        if (!slot_find(self, keys[j], &pos, &size)) {
            below = j;
            continue;
        }
        if (!walk(self, (const uint8_t *)data.buf, ends, keys, j, links, &nlinks, &broken)) {
            work += nlinks;
            below = broken; /* every longer chain passes through the broken boundary */
            continue;
        }
        total = 0;
        for (Py_ssize_t i = 0; i < nlinks; i++) total += links[i].n_ids;
        ids = PyMem_Malloc(((size_t)total + 1) * 4);
        if (!ids) {
            PyErr_NoMemory();
            goto done;
        }
        Py_ssize_t at = 0;
        for (Py_ssize_t i = nlinks - 1; i >= 0; i--) {
            memcpy(ids + at, links[i].ids, (size_t)links[i].n_ids * 4);
            at += links[i].n_ids;
        }
        /* Intact iff no writer reserved past any link's position + arena since. */
        atomic_thread_fence(memory_order_acquire);
        uint64_t r = atomic_load_explicit(&self->h->reserved, memory_order_relaxed);
        Py_ssize_t stale = -1;
        for (Py_ssize_t i = 0; i < nlinks; i++)
            if (r > links[i].pos + self->arena_bytes) stale = links[i].boundary;
        if (stale < 0) { /* the ids as copied, against each record's check */
            at = 0;
            for (Py_ssize_t i = nlinks - 1; i >= 0; i--) {
                if (hash_bytes((const uint8_t *)(ids + at), (size_t)links[i].n_ids * 4,
                               keys[links[i].boundary]) != links[i].check)
                    stale = links[i].boundary;
                at += links[i].n_ids;
            }
        }
        if (stale >= 0) {
            count(self, C_STALE, 1);
            PyMem_Free(ids);
            ids = NULL;
            below = stale;
            continue;
        }
        covered = j + 1;
        /* Records in the oldest quarter of the ring are written again at the head. */
        for (Py_ssize_t i = nlinks - 1; i >= 0; i--) {
            if (links[i].pos + self->arena_bytes - self->arena_bytes / 4 >= r) continue;
            Py_ssize_t b = links[i].boundary;
            Py_ssize_t p = links[i].start ? find_end(ends, b, links[i].start) : -1;
            Py_ssize_t before = 0;
            for (Py_ssize_t k = nlinks - 1; k > i; k--) before += links[k].n_ids;
            if (write_record(self, keys[b], p >= 0 ? keys[p] : 0, links[i].start,
                             (const uint8_t *)data.buf + links[i].start,
                             (uint32_t)(ends[b] - links[i].start), ids + before, links[i].n_ids))
                count(self, C_REFRESHED, 1);
        }
        break;
    }
    PyObject *list = PyList_New(covered ? total : 0);
    if (!list) goto done;
    if (covered) {
        for (Py_ssize_t i = 0; i < total; i++) {
            PyObject *v = PyLong_FromUnsignedLong(ids[i]);
            if (!v) {
                Py_DECREF(list);
                goto done;
            }
            PyList_SET_ITEM(list, i, v);
        }
        count(self, C_HITS, 1);
        count(self, C_HIT_BYTES, ends[covered - 1]);
    }
    out = Py_BuildValue("nN", covered, list);
done:
    PyMem_Free(ends);
    PyMem_Free(keys);
    PyMem_Free(links);
    PyMem_Free(ids);
    PyBuffer_Release(&data);
    return out;
}

static PyObject *ec_store(EncodeCache *self, PyObject *args) {
    Py_buffer data;
    PyObject *ends_obj, *segments;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "y*OnO", &data, &ends_obj, &first, &segments)) return NULL;
    uint64_t *ends = NULL, *keys = NULL;
    PyObject *out = NULL, *segs = NULL;
    Py_ssize_t n, stored = 0;
    if (boundaries(self, &data, ends_obj, &ends, &keys, &n) < 0) goto done;
    segs = PySequence_Fast(segments, "segments must be a sequence of id lists");
    if (!segs) goto done;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(segs);
    if (first < 0 || first + m > n) {
        PyErr_SetString(PyExc_ValueError, "segments must cover boundaries first..len(ends)");
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t j = first + k, len;
        uint32_t *ids;
        PyObject *fast = ids_arg(PySequence_Fast_GET_ITEM(segs, k), &ids, &len);
        if (!fast) goto done;
        uint64_t start = j ? ends[j - 1] : 0;
        stored += write_record(self, keys[j], j ? keys[j - 1] : 0, start,
                               (const uint8_t *)data.buf + start, (uint32_t)(ends[j] - start),
                               ids, (uint32_t)len);
        PyMem_Free(ids);
        Py_DECREF(fast);
    }
    out = PyLong_FromSsize_t(stored);
done:
    Py_XDECREF(segs);
    PyMem_Free(ends);
    PyMem_Free(keys);
    PyBuffer_Release(&data);
    return out;
}

static PyObject *ec_counters(EncodeCache *self, PyObject *unused) {
    PyObject *t = PyTuple_New(EC_COUNTERS + 1);
    if (!t) return NULL;
    for (int i = 0; i < EC_COUNTERS; i++)
        PyTuple_SET_ITEM(t, i,
                         PyLong_FromUnsignedLongLong(atomic_load_explicit(
                             &self->h->counters[i], memory_order_relaxed)));
    PyTuple_SET_ITEM(t, EC_COUNTERS,
                     PyLong_FromUnsignedLongLong(
                         atomic_load_explicit(&self->h->reserved, memory_order_relaxed)));
    return t;
}

static PyObject *ec_arena_bytes(EncodeCache *self, void *unused) {
    return PyLong_FromUnsignedLongLong(self->arena_bytes);
}

static PyMethodDef ec_methods[] = {
    {"lookup", (PyCFunction)ec_lookup, METH_VARARGS,
     "lookup(data, ends) -> (covered, ids): the ids of data[:ends[covered - 1]] from the store, "
     "for the largest such covered (0 and [] when none)."},
    {"store", (PyCFunction)ec_store, METH_VARARGS,
     "store(data, ends, first, segments) -> stored: segment k holds the ids of "
     "data[ends[first + k - 1] (or 0) : ends[first + k]]."},
    {"counters", (PyCFunction)ec_counters, METH_NOARGS,
     "The store's counters (tsfront.text.encode_cache.COUNTERS) and the arena's bytes reserved."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ec_getset[] = {
    {"arena_bytes", (getter)ec_arena_bytes, NULL, "The ring's size in bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject EncodeCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tsfront._native.EncodeCache",
    .tp_basicsize = sizeof(EncodeCache),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "EncodeCache(buffer): the prompt-prefix token ids store in a formatted region.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ec_init,
    .tp_dealloc = (destructor)ec_dealloc,
    .tp_methods = ec_methods,
    .tp_getset = ec_getset,
};

/* ------------------------------------------------------------------ anchors */

typedef struct {
    Py_ssize_t end;
    Py_ssize_t which;
} ec_hit;

static int hit_order(const void *a, const void *b) {
    Py_ssize_t x = ((const ec_hit *)a)->end, y = ((const ec_hit *)b)->end;
    return (x > y) - (x < y);
}

PyObject *py_anchor_ends(PyObject *self, PyObject *args) {
    Py_buffer data;
    PyObject *anchors;
    if (!PyArg_ParseTuple(args, "y*O!", &data, &PyTuple_Type, &anchors)) return NULL;
    PyObject *out = NULL;
    ec_hit *hits = NULL;
    Py_ssize_t n = 0, cap = 64;
    hits = PyMem_Malloc(cap * sizeof(ec_hit));
    if (!hits) {
        PyErr_NoMemory();
        goto done;
    }
    const char *buf = data.buf;
    for (Py_ssize_t a = 0; a < PyTuple_GET_SIZE(anchors); a++) {
        PyObject *anchor = PyTuple_GET_ITEM(anchors, a);
        if (!PyBytes_Check(anchor) || PyBytes_GET_SIZE(anchor) == 0) {
            PyErr_SetString(PyExc_TypeError, "anchors must be non-empty bytes");
            goto done;
        }
        const char *needle = PyBytes_AS_STRING(anchor);
        Py_ssize_t len = PyBytes_GET_SIZE(anchor), at = 0;
        while (at + len <= data.len) {
            const char *p = memmem(buf + at, (size_t)(data.len - at), needle, (size_t)len);
            if (!p) break;
            if (n == cap) {
                ec_hit *more = PyMem_Realloc(hits, 2 * cap * sizeof(ec_hit));
                if (!more) {
                    PyErr_NoMemory();
                    goto done;
                }
                hits = more;
                cap *= 2;
            }
            at = (p - buf) + len;
            hits[n++] = (ec_hit){at, a};
        }
    }
    qsort(hits, (size_t)n, sizeof(ec_hit), hit_order);
    PyObject *ends = PyList_New(n), *which = PyList_New(n);
    if (!ends || !which) {
        Py_XDECREF(ends);
        Py_XDECREF(which);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyLong_FromSsize_t(hits[i].end), *w = PyLong_FromSsize_t(hits[i].which);
        if (!e || !w) {
            Py_XDECREF(e);
            Py_XDECREF(w);
            Py_DECREF(ends);
            Py_DECREF(which);
            goto done;
        }
        PyList_SET_ITEM(ends, i, e);
        PyList_SET_ITEM(which, i, w);
    }
    out = Py_BuildValue("NN", ends, which);
done:
    PyMem_Free(hits);
    PyBuffer_Release(&data);
    return out;
}
