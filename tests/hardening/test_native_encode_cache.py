"""The shared encode cache (native/encodecache.c) under two processes and a hostile region.

Pins: two processes hammering one small store (records overwritten all the time, the ring
wrapping, hot records refreshed) never get ids that are not the prefix's; a slot left odd by
a writer that died mid-write, a torn or overwritten record, and random bytes over the whole
region are misses, never wrong ids or reads out of bounds (this file runs under ASan/UBSan in
scripts/sanitize); the region refuses a buffer that is not one. ~10 s.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tsfront import _native
from tsfront.text.encode_cache import COUNTERS, new_cache

HAMMER = Path(__file__).parents[1] / "support" / "encode_cache_hammer.py"
ANCHOR = b"<|a|>"
HEADER, SLOT = 256, 32


def shared(size: int) -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("tsfront-encode-cache-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size, mmap.MAP_SHARED)


def split(data: bytes) -> list[int]:
    return _native.anchor_ends(data, (ANCHOR,))[0]


def fill(cache, data: bytes) -> None:
    ends = split(data)
    cache.store(
        data, ends, 0, [list(data[ends[j - 1] if j else 0 : ends[j]]) for j in range(len(ends))]
    )


def counters(cache) -> dict[str, int]:
    return dict(zip(COUNTERS, cache.counters(), strict=False))


@pytest.mark.parametrize("size", [1 << 16, 1 << 20])
def test_two_processes_hammering_one_store_never_read_wrong_ids(size: int) -> None:
    fd, region = shared(size)
    cache = new_cache(region)
    sides = [
        subprocess.Popen(
            [sys.executable, str(HAMMER), str(fd), str(size), str(seed), "4000"],
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    results = []
    for side in sides:
        out, _ = side.communicate(timeout=120)
        assert side.returncode == 0
        results.append(json.loads(out))
    assert all(r["wrong"] == 0 for r in results), results
    assert all(r["hits"] > 500 for r in results), results  # the store was used by both
    c = counters(cache)
    if size == 1 << 16:  # the small ring wrapped: records were overwritten and refreshed
        assert cache.counters()[-1] > 4 * cache.arena_bytes
        assert c["refreshed"] > 0
    os.close(fd)


def test_a_slot_left_mid_write_is_a_miss_and_only_that(tmp_path: Path) -> None:
    region = bytearray(1 << 16)
    cache = new_cache(region, seed=5)
    data = ANCHOR + b"hello" + ANCHOR + b"world" + ANCHOR
    fill(cache, data)
    ends = split(data)
    assert cache.lookup(data, ends) == (3, list(data))
    slots = struct.unpack_from("<Q", region, 16)[0]
    odd = 0
    for i in range(slots):  # every written slot held by a dead writer: seq left odd
        at = HEADER + i * SLOT
        seq = struct.unpack_from("<Q", region, at)[0]
        if seq:
            struct.pack_into("<Q", region, at, seq + 1)
            odd += 1
    assert odd == 3
    assert cache.lookup(data, ends) == (0, [])
    fill(cache, data)  # the held slots are skipped, counted, and nothing else breaks
    assert counters(cache)["store_busy"] >= 3


def test_a_torn_record_is_a_miss() -> None:
    region = bytearray(1 << 16)
    cache = new_cache(region, seed=6)
    data = ANCHOR + b"abc" + ANCHOR + b"defgh" + ANCHOR
    fill(cache, data)
    ends = split(data)
    arena = struct.unpack_from("<Q", region, 48)[0]
    # The second record's text, changed in place: its bytes no longer match the prompt's.
    second = region.find(b"abc" + ANCHOR, arena)
    region[second] = ord("X")
    covered, ids = cache.lookup(data, ends)
    assert covered == 1 and ids == list(ANCHOR)
    # Its id count made to lie: the record's size no longer adds up.
    struct.pack_into("<I", region, second - 8, 1 << 30)
    assert cache.lookup(data, ends)[0] <= 1


def test_random_bytes_over_the_region_never_read_out_of_bounds() -> None:
    rng = random.Random(9)
    data = b"".join(
        ANCHOR + bytes(rng.randrange(97, 123) for _ in range(rng.randint(1, 40))) for _ in range(20)
    )
    ends = split(data)
    for trial in range(200):
        region = bytearray(1 << 16)
        cache = new_cache(region, seed=trial)
        fill(cache, data)
        for _ in range(rng.randint(1, 64)):  # bytes anywhere after the header
            at = rng.randrange(HEADER, len(region) - 8)
            region[at : at + 8] = rng.randbytes(8)
        covered, ids = cache.lookup(data, ends)
        assert ids == list(data[: ends[covered - 1]]) if covered else ids == []


def test_a_buffer_that_is_no_store_is_refused() -> None:
    with pytest.raises(ValueError, match="not an encode cache"):
        _native.EncodeCache(bytearray(1 << 16))
    with pytest.raises(ValueError, match="64 KiB"):
        _native.encode_cache_format(bytearray(1024), 1)
    cache = new_cache(bytearray(1 << 16))
    with pytest.raises(ValueError, match="ascend"):
        cache.lookup(b"abcdef", [3, 2])
    with pytest.raises(ValueError, match="ascend"):
        cache.lookup(b"abc", [9])


def test_a_record_over_a_quarter_of_the_ring_is_not_stored() -> None:
    cache = new_cache(bytearray(1 << 16))
    data = ANCHOR + b"x" * 20000 + ANCHOR
    fill(cache, data)
    assert counters(cache)["too_big"] == 1
    assert cache.lookup(data, split(data))[0] == 1  # the first, small, segment is there
