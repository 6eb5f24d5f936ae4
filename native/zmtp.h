/* ZMTP 3 framing of the traffic phase, the one case the I/O process's hot path reads natively:
 * a whole one-frame message (tsfront/wire/zmtp.py, `Session._whole_messages`, has the same rule
 * in Python and is what every other case falls back to: commands, frames with MORE, reserved
 * flags, a cut header or body, a size past the limit). */
#ifndef TSFRONT_ZMTP_H
#define TSFRONT_ZMTP_H

#include <stddef.h>
#include <stdint.h>

#define ZMTP_LONG 0x02u

/* If `avail` bytes at `p` start with a whole one-frame data message of at most `limit` bytes,
 * set *body to its offset from `p` and *size to its length and return 1; else 0. */
static inline int zmtp_whole_message(const uint8_t *p, size_t avail, uint64_t limit,
                                     size_t *body, uint64_t *size) {
    if (avail < 2) return 0;
    size_t header;
    uint64_t n;
    if (p[0] == 0) {
        header = 2;
        n = p[1];
    } else if (p[0] == ZMTP_LONG && avail >= 9) {
        header = 9;
        n = 0;
        for (int i = 1; i < 9; i++) n = (n << 8) | p[i];
    } else {
        return 0;
    }
    if (n > limit || n > avail - header) return 0;
    *body = header;
    *size = n;
    return 1;
}

#endif
