/* ridmap.c: rid -> slot table (see ridmap.h). */
#include "ridmap.h"

#include <stdlib.h>

_Static_assert(sizeof(rid_key_t) == 64, "a slot's rid record is one cache line");

int ridmap_init(ridmap_t *m, uint32_t nslots) {
    uint32_t cap = 16;
    while (cap < nslots * 2u) cap <<= 1;
    m->map = calloc(cap, sizeof(map_entry_t));
    m->mask = cap - 1;
    m->used = m->tombs = 0;
    m->nslots = nslots;
    size_t bytes = (size_t)(nslots ? nslots : 1) * sizeof(rid_key_t);
    m->keys = aligned_alloc(64, bytes);
    if (m->keys) memset(m->keys, 0, bytes);
    return (m->map && m->keys) ? 0 : -1;
}

void ridmap_free(ridmap_t *m) {
    if (m->keys) {
        for (uint32_t i = 0; i < m->nslots; i++) free(m->keys[i].heap);
    }
    free(m->map);
    free(m->keys);
    m->map = NULL;
    m->keys = NULL;
}

static void ridmap_rebuild(ridmap_t *m) {
    uint32_t cap = m->mask + 1;
    map_entry_t *old = m->map;
    map_entry_t *fresh = calloc(cap, sizeof(map_entry_t));
    if (!fresh) return; /* keep the old table; it is still correct, only slower */
    for (uint32_t i = 0; i < cap; i++) {
        if (old[i].slot1 == MAP_EMPTY || old[i].slot1 == MAP_TOMB) continue;
        uint32_t j = old[i].hash & m->mask;
        while (fresh[j].slot1 != MAP_EMPTY) j = (j + 1) & m->mask;
        fresh[j] = old[i];
    }
    free(old);
    m->map = fresh;
    m->tombs = 0;
}

int ridmap_insert(ridmap_t *m, const uint8_t *key, uint32_t len, uint32_t slot) {
    rid_key_t *k = &m->keys[slot];
    if (len > RID_INLINE) {
        uint8_t *copy = malloc(len);
        if (!copy) return -1;
        memcpy(copy, key, len);
        k->heap = copy;
    } else {
        memcpy(k->inl, key, len);
    }
    k->len = len;
    k->bound = 1;
    uint32_t h32 = (uint32_t)rid_hash(key, len);
    uint32_t i = h32 & m->mask;
    while (m->map[i].slot1 != MAP_EMPTY && m->map[i].slot1 != MAP_TOMB) i = (i + 1) & m->mask;
    if (m->map[i].slot1 == MAP_TOMB) m->tombs--;
    m->map[i].slot1 = slot + 1;
    m->map[i].hash = h32;
    m->used++;
    return 0;
}

void ridmap_remove_slot(ridmap_t *m, uint32_t slot) {
    rid_key_t *k = &m->keys[slot];
    if (!k->bound) return;
    const uint8_t *bytes = rid_key_bytes(k);
    uint32_t h32 = (uint32_t)rid_hash(bytes, k->len);
    int64_t i = ridmap_find(m, bytes, k->len, h32);
    if (i >= 0) {
        m->map[i].slot1 = MAP_TOMB;
        m->used--;
        m->tombs++;
        if (m->tombs > (m->mask + 1) / 4) ridmap_rebuild(m);
    }
    free(k->heap);
    k->heap = NULL;
    k->bound = 0;
    k->len = 0;
}
