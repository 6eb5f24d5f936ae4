"""The probe of a stalled engine: a one-token request of the I/O process's own.

A stalled engine (`tsfront.io.engines`, `Stall`) takes no client request, so what shows that
it steps again is a request the I/O process makes itself, one at a time per stalled engine
(`tsfront.io.core.IOCore.check_stalls` sends it and supersedes it). It must be one the
engine serves normally, and the I/O process knows little of the engine: its registration
(context length, KV capacity; CONTRACT §1.5), not its tokenizer nor its vocabulary size
(§4.4: out-of-vocabulary ids are never range-checked and fail on the device). So its prompt
is token id 0, an id of every vocabulary, and it asks for one token greedily
(``max_new_tokens=1``: its first row is also its last, ``"length"``; one prompt token and one
new fit any context of four or more, §4.3). ``validate_request`` accepts it
(tests/unit/test_io_stall_core.py checks).

Its rid, ``tsfront-probe-<engine index>-<32 hex digits from secrets>``, is never bound to a
slot: the native writer counts its rows as unknown and writes them nowhere, so nothing of it
reaches a worker, and the I/O core refuses a worker's ADD that reuses the rid of a probe it
has out (`FIN_DUPLICATE`).
"""

from __future__ import annotations

import secrets

from tsfront.wire import SamplingParams, TokenizedGenerateReqInput, encode_add
from tsfront.wire.request import bootstrap_offset

#: How every probe's rid begins (the rest: the engine's index and 128 random bits).
PROBE_PREFIX = "tsfront-probe-"

#: The probe's prompt: token id 0 is in every vocabulary.
PROBE_PROMPT = (0,)


def probe_rid(engine_index: int) -> bytes:
    """A fresh rid for a probe of engine ``engine_index`` (never used twice)."""
    return f"{PROBE_PREFIX}{engine_index}-{secrets.token_hex(16)}".encode()


def probe_request(rid: bytes) -> TokenizedGenerateReqInput:
    """The probe as a request: one prompt token, one new token, greedy."""
    return TokenizedGenerateReqInput(
        rid=rid.decode(),
        input_ids=list(PROBE_PROMPT),
        stream=True,
        sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
    )


def probe_add(rid: bytes) -> tuple[bytes, int]:
    """The probe's ADD payload, and the byte offset of its (nil) bootstrap fields, which a
    disaggregated probe fills in (`tsfront.io.disagg.fill_bootstrap`)."""
    req = probe_request(rid)
    payload = encode_add(req)
    return payload, bootstrap_offset(req, payload)
