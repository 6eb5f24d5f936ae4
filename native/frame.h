/*
 * frame.h: pass 1 of the Writer's ingest, the BatchTokenIDOutSlim decoder.
 *
 * `frame_parse()` walks and validates a whole output frame straight from the ZMQ buffer and
 * records where each row's pieces are; it writes nothing shared. Only a frame that passes is
 * applied (writer.c), so a bad frame changes nothing. The frame layout is the engine wire
 * contract's (shared/wire/CONTRACT.md, BatchTokenIDOutSlim).
 */
#ifndef TSFRONT_FRAME_H
#define TSFRONT_FRAME_H

#include "msgpack.h"

#include <stdint.h>

/* Limits on what a frame may carry; a frame past one is refused with WireDecodeError.
 * - rows: at most FRAME_MAX_ROWS (an engine batches at most its running requests; the cap keeps
 *   the row scratch bounded and its size arithmetic far from overflow);
 * - engine_index: the u16 of an engine identity (CONTRACT: identity = u16 LE);
 * - load tail (num_running, num_waiting, kv_active_pages, kv_total_pages): u32;
 * - prompt/completion/cached token counts: u32; token ids and logprob ids: int32. */
#define FRAME_MAX_ROWS (1u << 20)
#define FRAME_MAX_ENGINE_INDEX 65535

/* Finish codes (slot_a.finish). 1..4 come from the engine, 16.. are local terminal reasons. */
enum {
    FIN_NONE = 0,
    FIN_STOP = 1,
    FIN_LENGTH = 2,
    FIN_ABORT = 3,
    FIN_OTHER = 4,
};

/* Local terminal codes: ends the I/O process gives a slot itself (Writer.finish, and
 * Writer.bind's dup_code). The C only stores them; tsfront.ipc.codes names them, and checks
 * at import that its numbers are these. */
enum {
    FIN_LOCAL_FIRST = 16,
    FIN_ENGINE_DEAD = 16,
    FIN_SEND_TIMEOUT = 17,
    FIN_DUPLICATE = 18,
    FIN_NO_ENGINE = 19,
    FIN_IO_STOPPING = 20,
    FIN_RID_ABORTED = 21,
    FIN_DEADLINE = 22,
    FIN_PREFILL_DEAD = 23,
    FIN_PREFILL_SEND_TIMEOUT = 24,
    FIN_PREFILL_ABORTED = 25,
    FIN_ENGINE_STALLED = 26,
};

typedef struct {
    const uint8_t *rid;
    uint32_t rid_len;
    const uint8_t *out;
    uint32_t out_n;
    uint32_t finish;
    int64_t prompt, completion, cached;
    const uint8_t *lpv;
    uint32_t lpv_n;
    const uint8_t *lpi;
    uint32_t lpi_n;
} row_t;

/* Per-Writer scratch: one row_t per row of the frame being ingested. */
typedef struct {
    row_t *rows;
    size_t cap;
} frame_rows_t;

/* The load tail and engine_index, as the frame carries them (or their defaults). */
typedef struct {
    int64_t engine_index, running, waiting, kv_active, kv_total;
} frame_tail_t;

/* Validate the frame at `c` and record its rows in `fr`. 0, or -1 with `c->err` set. */
int frame_parse(frame_rows_t *fr, cur_t *c, uint32_t *nrows_out, frame_tail_t *tail,
                int64_t default_index);

#endif
