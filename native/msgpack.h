/*
 * msgpack.h: a bounds-checked msgpack reader, just what BatchTokenIDOutSlim needs.
 *
 * Every reader checks the bytes it needs against the end of the buffer before touching them
 * and reports failure through `cur_t.err`; none allocates. The scalar readers are inline: the
 * Writer calls them once per token on its hot path.
 */
#ifndef TSFRONT_MSGPACK_H
#define TSFRONT_MSGPACK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32 /* nesting mp_skip() follows before it refuses the input */

typedef struct {
    const uint8_t *p, *end;
    const char *err;
} cur_t;

static inline int need(cur_t *c, size_t n) {
    if ((size_t)(c->end - c->p) < n) {
        c->err = "frame is truncated";
        return -1;
    }
    return 0;
}
static inline uint16_t be16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static inline int rd_array(cur_t *c, uint32_t *n) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if ((b & 0xf0) == 0x90) {
        *n = b & 0x0f;
        c->p += 1;
        return 0;
    }
    if (b == 0xdc) {
        if (need(c, 3)) return -1;
        *n = be16(c->p + 1);
        c->p += 3;
        return 0;
    }
    if (b == 0xdd) {
        if (need(c, 5)) return -1;
        *n = be32(c->p + 1);
        c->p += 5;
        return 0;
    }
    c->err = "expected an array";
    return -1;
}

static inline int rd_str(cur_t *c, const uint8_t **s, uint32_t *n) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    size_t hdr;
    uint32_t len;
    if ((b & 0xe0) == 0xa0) {
        len = b & 0x1f;
        hdr = 1;
    } else if (b == 0xd9) {
        if (need(c, 2)) return -1;
        len = c->p[1];
        hdr = 2;
    } else if (b == 0xda) {
        if (need(c, 3)) return -1;
        len = be16(c->p + 1);
        hdr = 3;
    } else if (b == 0xdb) {
        if (need(c, 5)) return -1;
        len = be32(c->p + 1);
        hdr = 5;
    } else {
        c->err = "expected a str";
        return -1;
    }
    if (need(c, hdr + (size_t)len)) return -1;
    *s = c->p + hdr;
    *n = len;
    c->p += hdr + len;
    return 0;
}

static inline int rd_int(cur_t *c, int64_t *v) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if (b <= 0x7f) {
        *v = b;
        c->p += 1;
        return 0;
    }
    if (b >= 0xe0) {
        *v = (int8_t)b;
        c->p += 1;
        return 0;
    }
    switch (b) {
    case 0xcc:
        if (need(c, 2)) return -1;
        *v = c->p[1];
        c->p += 2;
        return 0;
    case 0xcd:
        if (need(c, 3)) return -1;
        *v = be16(c->p + 1);
        c->p += 3;
        return 0;
    case 0xce:
        if (need(c, 5)) return -1;
        *v = be32(c->p + 1);
        c->p += 5;
        return 0;
    case 0xcf: {
        if (need(c, 9)) return -1;
        uint64_t u = be64(c->p + 1);
        if (u > (uint64_t)INT64_MAX) {
            c->err = "integer out of range";
            return -1;
        }
        *v = (int64_t)u;
        c->p += 9;
        return 0;
    }
    case 0xd0:
        if (need(c, 2)) return -1;
        *v = (int8_t)c->p[1];
        c->p += 2;
        return 0;
    case 0xd1:
        if (need(c, 3)) return -1;
        *v = (int16_t)be16(c->p + 1);
        c->p += 3;
        return 0;
    case 0xd2:
        if (need(c, 5)) return -1;
        *v = (int32_t)be32(c->p + 1);
        c->p += 5;
        return 0;
    case 0xd3:
        if (need(c, 9)) return -1;
        *v = (int64_t)be64(c->p + 1);
        c->p += 9;
        return 0;
    default:
        c->err = "expected an int";
        return -1;
    }
}

/* A number where a float is declared: float32, float64 or any int (msgspec accepts ints). */
static inline int rd_num(cur_t *c, double *v) {
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    if (b == 0xcb) {
        if (need(c, 9)) return -1;
        uint64_t u = be64(c->p + 1);
        memcpy(v, &u, 8);
        c->p += 9;
        return 0;
    }
    if (b == 0xca) {
        if (need(c, 5)) return -1;
        uint32_t u = be32(c->p + 1);
        float f;
        memcpy(&f, &u, 4);
        *v = f;
        c->p += 5;
        return 0;
    }
    int64_t i;
    if (rd_int(c, &i) < 0) {
        c->err = "expected a float";
        return -1;
    }
    *v = (double)i;
    return 0;
}

/* Step over one value of any type (an unknown trailing element), at most MAX_DEPTH deep. */
int mp_skip(cur_t *c, int depth);

#endif
