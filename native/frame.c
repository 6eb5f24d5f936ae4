/* frame.c: the BatchTokenIDOutSlim decoder (see frame.h). */
#include "frame.h"

#include <stdio.h>
#include <stdlib.h>

static uint32_t finish_code(const uint8_t *s, uint32_t n) {
    if (n == 0) return FIN_NONE;
    if (n == 4 && memcmp(s, "stop", 4) == 0) return FIN_STOP;
    if (n == 6 && memcmp(s, "length", 6) == 0) return FIN_LENGTH;
    if (n == 5 && memcmp(s, "abort", 5) == 0) return FIN_ABORT;
    return FIN_OTHER;
}

/* Room for n rows. n <= FRAME_MAX_ROWS (checked by the caller), so the doubling below stays far
 * from size_t overflow. */
static int ensure_rows(frame_rows_t *fr, uint32_t n) {
    if (n <= fr->cap) return 0;
    size_t cap = fr->cap ? fr->cap : 256;
    while (cap < n) cap *= 2;
    row_t *rows = realloc(fr->rows, cap * sizeof(row_t));
    if (!rows) return -1;
    fr->rows = rows;
    fr->cap = cap;
    return 0;
}

static const char *COLUMN_NAMES[] = {"rids",
                                     "output_ids",
                                     "finished_reasons",
                                     "prompt_tokens",
                                     "completion_tokens",
                                     "cached_tokens",
                                     "output_token_logprobs_val",
                                     "output_token_logprobs_idx"};

/* Pass 1: walk and validate the whole frame, recording each row's pieces. */
int frame_parse(frame_rows_t *fr, cur_t *c, uint32_t *nrows_out, frame_tail_t *ft,
                int64_t default_index) {
    uint32_t n;
    if (rd_array(c, &n) < 0) return -1;
    if (n < 9) {
        c->err = "BatchTokenIDOutSlim needs at least 9 elements";
        return -1;
    }
    const uint8_t *tag;
    uint32_t tag_len;
    if (rd_str(c, &tag, &tag_len) < 0) return -1;
    if (tag_len != 19 || memcmp(tag, "BatchTokenIDOutSlim", 19) != 0) {
        c->err = "tag is not BatchTokenIDOutSlim";
        return -1;
    }
    uint32_t nrows;
    if (rd_array(c, &nrows) < 0) return -1;
    if (nrows > FRAME_MAX_ROWS) {
        c->err = "more rows than a frame may carry (at most 1,048,576)";
        return -1;
    }
    if ((size_t)(c->end - c->p) < nrows) {
        c->err = "frame is truncated";
        return -1;
    }
    if (ensure_rows(fr, nrows) < 0) {
        c->err = "out of memory";
        return -1;
    }
    row_t *rows = fr->rows;
    for (uint32_t i = 0; i < nrows; i++)
        if (rd_str(c, &rows[i].rid, &rows[i].rid_len) < 0) return -1;
    for (int col = 1; col < 8; col++) {
        uint32_t m;
        if (rd_array(c, &m) < 0) return -1;
        if (m != nrows) {
            static char msg[128];
            snprintf(msg, sizeof msg, "ragged column %s: %u rows for %u rids", COLUMN_NAMES[col], m,
                     nrows);
            c->err = msg;
            return -1;
        }
        for (uint32_t i = 0; i < nrows; i++) {
            row_t *row = &rows[i];
            switch (col) {
            case 1: { /* output_ids */
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->out = c->p;
                row->out_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    int64_t v;
                    if (rd_int(c, &v) < 0) return -1;
                    if (v < INT32_MIN || v > INT32_MAX) {
                        c->err = "token id out of int32 range";
                        return -1;
                    }
                }
                break;
            }
            case 2: {
                const uint8_t *s;
                uint32_t k;
                if (rd_str(c, &s, &k) < 0) return -1;
                row->finish = finish_code(s, k);
                break;
            }
            case 3:
            case 4:
            case 5: {
                int64_t v;
                if (rd_int(c, &v) < 0) return -1;
                if (v < 0 || v > UINT32_MAX) {
                    c->err = "token count out of range";
                    return -1;
                }
                if (col == 3) row->prompt = v;
                else if (col == 4) row->completion = v;
                else row->cached = v;
                break;
            }
            case 6: {
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->lpv = c->p;
                row->lpv_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    double d;
                    if (rd_num(c, &d) < 0) return -1;
                }
                break;
            }
            case 7: {
                uint32_t k;
                if (rd_array(c, &k) < 0) return -1;
                row->lpi = c->p;
                row->lpi_n = k;
                for (uint32_t j = 0; j < k; j++) {
                    int64_t v;
                    if (rd_int(c, &v) < 0) return -1;
                    if (v < INT32_MIN || v > INT32_MAX) {
                        c->err = "logprob token id out of int32 range";
                        return -1;
                    }
                }
                if ((row->lpv_n && row->lpv_n != row->out_n) || row->lpi_n != row->lpv_n) {
                    c->err = "ragged logprobs: a row's logprob lists must be empty or as long as "
                             "its output_ids";
                    return -1;
                }
                break;
            }
            }
        }
    }
    /* engine_index and the load tail; absent in older engines (default 0). */
    int64_t tail[5] = {0, 0, 0, 0, 0};
    tail[0] = default_index; /* 9-element (Aug3) frames carry no engine_index */
    for (uint32_t k = 9; k < n; k++) {
        if (k < 14) {
            if (rd_int(c, &tail[k - 9]) < 0) return -1;
        } else if (mp_skip(c, 0) < 0) {
            return -1; /* a future engine's extra trailing element: ignored */
        }
    }
    if (c->p != c->end) {
        c->err = "trailing bytes after the frame";
        return -1;
    }
    /* Range checks: nothing out of its type's range leaves the decoder. The whole frame is
     * refused (WireDecodeError), not just its tail: an engine that sends such numbers is
     * broken, and its rows cannot be trusted either. */
    if (tail[0] < 0 || tail[0] > FRAME_MAX_ENGINE_INDEX) {
        static char msg[96];
        snprintf(msg, sizeof msg, "engine_index %lld out of range [0, 65535]", (long long)tail[0]);
        c->err = msg;
        return -1;
    }
    static const char *TAIL_NAMES[] = {"engine_index", "num_running", "num_waiting",
                                       "kv_active_pages", "kv_total_pages"};
    for (int k = 1; k < 5; k++) {
        if (tail[k] < 0 || tail[k] > (int64_t)UINT32_MAX) {
            static char msg[96];
            snprintf(msg, sizeof msg, "load tail %s %lld out of u32 range", TAIL_NAMES[k],
                     (long long)tail[k]);
            c->err = msg;
            return -1;
        }
    }
    ft->engine_index = tail[0];
    ft->running = tail[1];
    ft->waiting = tail[2];
    ft->kv_active = tail[3];
    ft->kv_total = tail[4];
    *nrows_out = nrows;
    return 0;
}
