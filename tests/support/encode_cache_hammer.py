"""One side of the encode-cache hammer (tests/hardening/test_native_encode_cache.py).

``python encode_cache_hammer.py FD BYTES SEED ROUNDS`` maps the store in memfd ``FD`` and,
ROUNDS times, takes a prompt of a pool shared by every side (seeded by 0: the same texts
everywhere), looks it up, checks that the ids it got are those of the prefix (a segment's
"ids" are its bytes, so the ids of ``data[:end]`` are ``list(data[:end])``), and stores the
segments it did not get. Prints one JSON line: rounds, hits, wrong (must be 0).
"""

from __future__ import annotations

import json
import mmap
import random
import sys

from tsfront import _native

ANCHOR = b"<|a|>"


def pool(n: int) -> list[bytes]:
    rng = random.Random(0)
    stems = [bytes(rng.randrange(97, 123) for _ in range(rng.randint(1, 300))) for _ in range(40)]
    texts = []
    for _ in range(n):
        parts = [ANCHOR + rng.choice(stems) for _ in range(rng.randint(1, 12))]
        texts.append(b"".join(parts) + ANCHOR + b"tail")
    return texts


def main() -> int:
    fd, size, seed, rounds = (int(a) for a in sys.argv[1:5])
    region = mmap.mmap(fd, size, mmap.MAP_SHARED)
    cache = _native.EncodeCache(region)
    rng = random.Random(seed)
    texts = pool(64)
    hits = wrong = 0
    for _ in range(rounds):
        data = rng.choice(texts)
        ends, _which = _native.anchor_ends(data, (ANCHOR,))
        covered, ids = cache.lookup(data, ends)
        if covered:
            hits += 1
            wrong += ids != list(data[: ends[covered - 1]])
        segments = [
            list(data[ends[j - 1] if j else 0 : ends[j]]) for j in range(covered, len(ends))
        ]
        cache.store(data, ends, covered, segments)
    print(json.dumps({"rounds": rounds, "hits": hits, "wrong": wrong}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
