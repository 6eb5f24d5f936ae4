"""The block hashes a worker sends with an ADD (its fifth frame), for prefix-affinity routing.

The frame is one u64 (the block size in tokens) then one native-endian u64 per full block of
the prompt, each the chained hash of the prefix up to that block's end
(`tsfront._native.packed_block_hashes`). The block size is a whole number of the engines'
``prefix_granularity``-token pages, at least ``prefix_block_tokens`` (`group_block_tokens`),
so the worker and the I/O process agree on it from the same registrations; the I/O process
re-hashes the payload itself when a frame says another size (`tsfront.io.affinity`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from tsfront import _native

#: Granularity assumed for an engine whose registration carries none (prefix_granularity 0).
DEFAULT_GRANULARITY: Final = 64

#: Blocks hashed per prompt at most (a 128k-token prompt at 256 tokens a block is 512).
MAX_BLOCKS: Final = 1 << 16


def index_block_tokens(granularity: int, min_tokens: int) -> int:
    """Tokens per index block: a whole number of the engine's ``granularity``-token blocks, at
    least ``min_tokens``, so that index blocks end on the engine's own cache boundaries."""
    g = granularity if granularity > 0 else DEFAULT_GRANULARITY
    return g * max(1, -(-min_tokens // g))


def group_block_tokens(granularities: Sequence[int], min_tokens: int) -> int:
    """The index block size of a group whose engines registered these granularities (0 for
    one not registered yet): from the largest, so it is a multiple of each usual power of 2."""
    return index_block_tokens(max(granularities, default=0), min_tokens)


def packed_hashes(input_ids: list[int], block_tokens: int) -> bytes:
    """What a worker sends along with an ADD: the prompt's block hashes, packed."""
    return _native.packed_block_hashes(input_ids, block_tokens, MAX_BLOCKS)


__all__ = [
    "DEFAULT_GRANULARITY",
    "MAX_BLOCKS",
    "group_block_tokens",
    "index_block_tokens",
    "packed_hashes",
]
