/* msgpack.c: the generic skip (see msgpack.h). */
#include "msgpack.h"

int mp_skip(cur_t *c, int depth) {
    if (depth > MAX_DEPTH) {
        c->err = "nesting too deep";
        return -1;
    }
    if (need(c, 1)) return -1;
    uint8_t b = *c->p;
    uint64_t n = 0, items = 0;
    size_t hdr = 1;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        c->p += 1;
        return 0;
    }
    if ((b & 0xf0) == 0x90) {
        items = b & 0x0f;
    } else if ((b & 0xf0) == 0x80) {
        items = 2ull * (b & 0x0f);
    } else if ((b & 0xe0) == 0xa0) {
        n = b & 0x1f;
    } else {
        switch (b) {
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: case 0xca: n = 4; break;
        case 0xcf: case 0xd3: case 0xcb: n = 8; break;
        case 0xd9: case 0xc4: if (need(c, 2)) return -1; n = c->p[1]; hdr = 2; break;
        case 0xda: case 0xc5: if (need(c, 3)) return -1; n = be16(c->p + 1); hdr = 3; break;
        case 0xdb: case 0xc6: if (need(c, 5)) return -1; n = be32(c->p + 1); hdr = 5; break;
        case 0xd4: n = 2; break;
        case 0xd5: n = 3; break;
        case 0xd6: n = 5; break;
        case 0xd7: n = 9; break;
        case 0xd8: n = 17; break;
        case 0xc7: if (need(c, 2)) return -1; n = 1ull + c->p[1]; hdr = 2; break;
        case 0xc8: if (need(c, 3)) return -1; n = 1ull + be16(c->p + 1); hdr = 3; break;
        case 0xc9: if (need(c, 5)) return -1; n = 1ull + be32(c->p + 1); hdr = 5; break;
        case 0xdc: if (need(c, 3)) return -1; items = be16(c->p + 1); hdr = 3; break;
        case 0xdd: if (need(c, 5)) return -1; items = be32(c->p + 1); hdr = 5; break;
        case 0xde: if (need(c, 3)) return -1; items = 2ull * be16(c->p + 1); hdr = 3; break;
        case 0xdf: if (need(c, 5)) return -1; items = 2ull * be32(c->p + 1); hdr = 5; break;
        default: c->err = "invalid msgpack byte"; return -1;
        }
    }
    if (need(c, hdr + n)) return -1;
    c->p += hdr + n;
    for (uint64_t i = 0; i < items; i++)
        if (mp_skip(c, depth + 1) < 0) return -1;
    return 0;
}
