/*
 * ridmap.h: rid -> slot, for the Writer alone (private memory, one thread).
 *
 * Open addressing with linear probing and tombstones; the table has at least twice as many
 * entries as there are slots, so a probe always ends. Each bound slot owns a private copy of
 * its rid (the key); an entry holds the slot and the key's hash.
 */
#ifndef TSFRONT_RIDMAP_H
#define TSFRONT_RIDMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAP_EMPTY 0u
#define MAP_TOMB 0xffffffffu

typedef struct {
    uint32_t slot1; /* slot + 1, or MAP_EMPTY / MAP_TOMB */
    uint32_t hash;
} map_entry_t;

typedef struct {
    map_entry_t *map;
    uint32_t mask, used, tombs;
    uint32_t nslots;
    uint8_t **keys;    /* per slot: its rid, NULL when unbound */
    uint32_t *key_len; /* per slot */
} ridmap_t;

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

/* Index of the table entry holding `key`, or -1. Inline: called once per row on the hot path. */
static inline int64_t ridmap_find(const ridmap_t *m, const uint8_t *key, uint32_t len, uint32_t h32) {
    uint32_t i = h32 & m->mask;
    for (;;) {
        const map_entry_t *e = &m->map[i];
        if (e->slot1 == MAP_EMPTY) return -1;
        if (e->slot1 != MAP_TOMB && e->hash == h32) {
            uint32_t slot = e->slot1 - 1;
            if (m->key_len[slot] == len && memcmp(m->keys[slot], key, len) == 0) return i;
        }
        i = (i + 1) & m->mask;
    }
}

/* The slot bound to `key`, or -1. */
static inline int64_t ridmap_lookup(const ridmap_t *m, const uint8_t *key, uint32_t len) {
    int64_t at = ridmap_find(m, key, len, (uint32_t)rid_hash(key, len));
    return at < 0 ? -1 : (int64_t)m->map[at].slot1 - 1;
}

static inline int ridmap_bound(const ridmap_t *m, uint32_t slot) { return m->keys[slot] != NULL; }

/* Whether `key` is the rid bound to `slot` (a guess checked: same answer as a lookup, since a
 * rid is bound to at most one slot). */
static inline int ridmap_holds(const ridmap_t *m, uint32_t slot, const uint8_t *key, uint32_t len) {
    return slot < m->nslots && m->keys[slot] != NULL && m->key_len[slot] == len &&
           memcmp(m->keys[slot], key, len) == 0;
}

/* 0, or -1 when out of memory. */
int ridmap_init(ridmap_t *m, uint32_t nslots);
void ridmap_free(ridmap_t *m);
/* Bind `key` to `slot` (which must be unbound, and `key` not bound). 0, or -1 out of memory. */
int ridmap_insert(ridmap_t *m, const uint8_t *key, uint32_t len, uint32_t slot);
/* Forget the rid bound to `slot`, if any. */
void ridmap_remove_slot(ridmap_t *m, uint32_t slot);

#endif
