"""Fuzzing every decoder a peer can reach, and the worker-side reader against torn memory.

Peer-reachable decoders: output frames through the native `Writer.ingest` (the I/O process's
hot path), handshake frames (`decode_ready_message`, `decode_init`), registrations, and the
ADD/ABORT decoders. Each gets random bytes and structure-aware msgpack; the only outcome
allowed besides a result is `WireDecodeError`. The worker's `Reader` gets random bytes written
over its slots and rings (through a second mapping of the memfd, as a dying or buggy writer
could leave them): `poll` must return well-typed updates within bounds, never crash or hang.
The atheris target (``tests/fuzz/fuzz_output.py``) runs for a bounded time at the end.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront import _native
from tsfront.errors import WireDecodeError
from tsfront.ipc.region import Geometry, Region
from tsfront.wire import (
    BatchTokenIDOutSlim,
    decode_abort,
    decode_add,
    decode_init,
    decode_output,
    decode_ready_message,
    decode_registration,
    encode_output,
)

GEOMETRY = Geometry(num_workers=2, slots_per_worker=4, ring_capacity=16, max_engines=2)
RIDS = ["r0", "r1", "r2", "r3", "r4"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from(RIDS),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=30,
)
# Output-shaped: an array of 8..15 columns, each a list of per-row values (often valid ones).
row_values = st.one_of(
    st.sampled_from(RIDS),
    st.lists(st.integers(-5, 40_000), max_size=40),
    st.sampled_from([None, "stop", "length", "abort", {"type": "stop"}, {"type": "length"}]),
    st.integers(-3, 1 << 33),
    st.lists(st.floats(), max_size=4),
    values,
)
output_shaped = st.integers(1, 6).flatmap(
    lambda n: st.lists(
        st.one_of(st.lists(row_values, min_size=n, max_size=n), values), min_size=8, max_size=15
    )
)
frames = st.one_of(
    st.binary(max_size=400),
    values.map(msgspec.msgpack.encode),
    output_shaped.map(msgspec.msgpack.encode),
    output_shaped.map(msgspec.msgpack.encode).flatmap(
        lambda b: st.integers(0, max(len(b) - 1, 0)).map(lambda k: b[:k])  # truncated
    ),
)

VALID_FRAME = encode_output(
    BatchTokenIDOutSlim(
        rids=RIDS[:4],
        output_ids=[[5, 6, 7]] * 4,
        finished_reasons=[""] * 4,
        prompt_tokens=[3] * 4,
        completion_tokens=[3] * 4,
        cached_tokens=[0] * 4,
        output_token_logprobs_val=[[-0.5] * 3] * 4,
        output_token_logprobs_idx=[[5, 6, 7]] * 4,
        engine_index=0,
        num_running=4,
        num_waiting=0,
        kv_active_pages=1,
        kv_total_pages=10,
    ),
    form=14,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def writer():
    region = Region.create(GEOMETRY)
    w = _native.Writer(region.map, 2, 4, 16, 2)
    yield w, region


@FUZZ
@given(frame=frames)
def test_writer_ingest_takes_any_frame(writer, frame):
    w, _region = writer
    for slot, rid in enumerate(RIDS[:4]):
        w.unbind(slot)
        w.bind(rid.encode(), slot, slot + 1, bool(slot % 2), 18, 0)
    try:
        result = w.ingest(frame)
    except WireDecodeError:
        return
    if result is not None:
        assert isinstance(result, tuple) and len(result) == 8
        assert all(0 <= s < 8 for s in result[-1])
    w.flush_spills()
    w.wake()


@FUZZ
@given(frame=frames)
def test_peer_decoders_raise_only_wire_decode_error(frame):
    for decode in (
        decode_ready_message,
        decode_init,
        decode_registration,
        decode_output,
        decode_add,
        decode_abort,
    ):
        try:
            decode(frame)
        except WireDecodeError:
            pass


@FUZZ
@given(
    garbage=st.lists(
        st.tuples(st.integers(0, 1 << 14), st.binary(min_size=1, max_size=64)), max_size=12
    ),
    tickets=st.lists(st.integers(1, 2**64 - 1), min_size=4, max_size=4),
)
def test_reader_survives_garbage_in_its_slots(garbage, tickets):
    region = Region.create(GEOMETRY)
    layout = GEOMETRY.layout()
    other = mmap.mmap(region.fd, region.size, mmap.MAP_SHARED)
    try:
        writer = _native.Writer(region.map, 2, 4, 16, 2)  # lays out the header
        reader = _native.Reader(region.map, 0, 2, 4, 16, 2)
        for slot, ticket in enumerate(tickets):
            ticket = ticket or 1
            writer.bind(RIDS[slot].encode(), slot, ticket, bool(slot % 2), 18, 0)
            reader.expect(slot, ticket)
        writer.ingest(VALID_FRAME)  # real tokens in every slot, then garbage over them
        writer.wake()
        base = layout["workers_off"]
        span = region.size - base
        for offset, data in garbage:
            at = base + offset % span
            other[at : at + len(data)] = data[: region.size - at]
        for _ in range(3):
            for update in reader.poll():
                local, tokens, lp_val, lp_idx, finish, *_counts, _engine = update
                assert 0 <= local < 4
                assert isinstance(tokens, list) and len(tokens) <= GEOMETRY.ring_capacity
                assert all(isinstance(t, int) for t in tokens)
                assert lp_val is None or len(lp_val) == len(tokens)
                assert lp_idx is None or len(lp_idx) == len(tokens)
                assert isinstance(finish, int)
            reader.park()
            for slot in range(4):
                reader.read(slot)
        del reader, writer
    finally:
        other.close()
        region.close()


def test_atheris_output_decoder_bounded_run(tmp_path):
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris)")
    target = Path(__file__).parent / "fuzz_output.py"
    seconds = os.environ.get("TSFRONT_ATHERIS_SECONDS", "15")
    # libFuzzer's -rss_limit_mb reads the peak RSS (getrusage's ru_maxrss), and a process
    # exec'd straight from this one inherits this one's peak: a pytest worker past 1 GB failed
    # the run as "out-of-memory" before its first input. A shell in between forks the fuzzer
    # from its own small address space, so the limit measures the fuzzer alone.
    proc = subprocess.run(
        [
            "/bin/sh",
            "-c",
            '"$@"; exit $?',  # not the last command: the shell forks for it, never execs
            "sh",
            sys.executable,
            str(target),
            f"-max_total_time={seconds}",
            "-rss_limit_mb=1024",
            f"-artifact_prefix={tmp_path}/",  # a finding's input: never into the checkout
        ],
        capture_output=True,
        text=True,
        timeout=int(seconds) + 60,
    )
    tail = proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert "Done" in tail or "done" in tail, tail
