"""Prefix-affinity placement: send a prompt to the engine most likely to hold its prefix.

Each engine keeps its own prefix cache, so a conversation whose turns land on different ranks
recomputes its shared prefix on every turn. The I/O process sees every prompt it routes, so it
keeps, per engine, an approximate index of what it sent there: the chained hashes of each
prompt's blocks (block ``i``'s hash names the whole prefix up to the end of block ``i``). A
block is a whole number of the engines' ``prefix_granularity``-token pages, at least
`ClientConfig.prefix_block_tokens`. The worker computes the hashes from its ``input_ids``
(`tsfront.ipc.hashes.packed_hashes`) and sends them with the ADD, so the one I/O process only
looks them up; it hashes the ADD payload itself (`tsfront._native.block_hashes`) only when they
are missing or made for another block size. The choice is measured in docs/DESIGN.md, *Prefix
affinity*.

Data structure (`PrefixIndex`):

- per engine, an LRU (`OrderedDict`) of the block hashes sent to it, at most ``capacity``
  entries (the smaller of `ClientConfig.prefix_index_blocks` and the engine's own KV capacity
  in blocks, since the engine cannot cache more than that); a prompt's blocks are touched
  deepest first, so its root block is the most recent and eviction takes leaves before the
  prefixes they hang from, as the engine's radix cache does;
- one dict from block hash to the bit mask of the engines holding it, so a prompt is matched
  against every engine in one walk down its blocks (one dict probe per matched block).

An engine's entries are dropped when it dies or says HELLO again (a new process has an empty
cache). The index is approximate: it does not know what the engine itself evicted, nor the
tokens it generated; a wrong guess costs one prefill, never a wrong answer.

Policy (`AffinityRouter.choose`): the placeable engines (live, not stalled) holding the longest
matched prefix are the candidates (every placeable engine if none matches a block); the least
loaded of them (requests in flight, ties rotated) is chosen, unless it carries more than
``abs_threshold`` requests more than the least loaded placeable engine *and* more than
``rel_threshold`` times as many: then the least loaded engine is chosen (counted in
``fallbacks``). A prefix shared by every conversation (a system prompt) draws new
conversations to the engine holding it until that engine is imbalanced; the engine that takes
the next one then holds it too, and from then on those engines tie on it and load decides
among them.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from tsfront import _native
from tsfront.io.engines import STEPPING, Engine, EngineState
from tsfront.ipc.hashes import (
    DEFAULT_GRANULARITY,
    MAX_BLOCKS,
    group_block_tokens,
    index_block_tokens,
    packed_hashes,
)

if TYPE_CHECKING:
    import zmq
    from typing_extensions import Buffer

LIVE = EngineState.LIVE  # a module global: read per engine on the placement path


class PrefixIndex:
    """Per-engine LRU sets of block hashes, with one hash → engine-mask dict for matching."""

    def __init__(self, num_engines: int, capacity: int) -> None:
        self.capacity = [capacity] * num_engines
        self.lru: list[collections.OrderedDict[int, None]] = [
            collections.OrderedDict() for _ in range(num_engines)
        ]
        self.owners: dict[int, int] = {}
        self.evictions = 0

    def grow(self, num_engines: int) -> None:
        """Make room for engines up to ``num_engines`` (a router built without a config)."""
        while len(self.lru) < num_engines:
            self.capacity.append(self.capacity[0] if self.capacity else 1)
            self.lru.append(collections.OrderedDict())

    def set_capacity(self, row: int, capacity: int) -> None:
        """Bound engine ``row``'s entries (evicting its oldest at once if over)."""
        self.capacity[row] = max(1, capacity)
        self._evict(row)

    def match(self, hashes: Sequence[int], mask: int) -> tuple[int, int]:
        """``(depth, engines)``: the longest run of leading blocks held by any engine in
        ``mask``, and the mask of the engines holding all of it (``mask`` itself at depth 0)."""
        get = self.owners.get
        depth = 0
        for h in hashes:
            m = get(h, 0) & mask
            if not m:
                break
            mask = m
            depth += 1
        return depth, mask

    def record(self, row: int, hashes: Sequence[int], known: int = 0) -> None:
        """Note that engine ``row`` was sent a prompt with these blocks; the first ``known``
        are already in its index (from `match`) and are only touched."""
        lru = self.lru[row]
        owners = self.owners
        bit = 1 << row
        touch = lru.move_to_end
        # Deepest first: the root ends most recent, so eviction takes leaves first.
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            if i < known or h in lru:
                touch(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        if len(lru) > self.capacity[row]:
            self._evict(row)

    def _evict(self, row: int) -> None:
        lru = self.lru[row]
        owners = self.owners
        clear = ~(1 << row)
        while len(lru) > self.capacity[row]:
            h, _ = lru.popitem(last=False)
            m = owners.get(h, 0) & clear
            if m:
                owners[h] = m
            else:
                owners.pop(h, None)
            self.evictions += 1

    def forget(self, row: int) -> None:
        """Drop everything engine ``row`` was sent (it died or restarted)."""
        lru = self.lru[row]
        owners = self.owners
        clear = ~(1 << row)
        for h in lru:
            m = owners.get(h, 0) & clear
            if m:
                owners[h] = m
            else:
                owners.pop(h, None)
        lru.clear()

    def size(self, row: int) -> int:
        """Entries held for engine ``row``."""
        return len(self.lru[row])


class AffinityRouter:
    """`LoadBalance.PREFIX_AFFINITY`: longest matched prefix, unless load is imbalanced."""

    def __init__(
        self,
        num_engines: int,
        *,
        capacity: int,
        min_block_tokens: int,
        abs_threshold: int,
        rel_threshold: float,
    ) -> None:
        self.index = PrefixIndex(num_engines, capacity)
        self.max_capacity = capacity
        self.min_block_tokens = min_block_tokens
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self.block_tokens = index_block_tokens(DEFAULT_GRANULARITY, min_block_tokens)
        self._granularity = [0] * num_engines
        self._turn = 0
        self.fallbacks = 0
        self.matched_blocks = 0
        self.hashed_here = 0  # packed hashes refused (wrong block size), so hashed here

    def registered(self, engine: Engine) -> None:
        """Take the engine's prefix granularity and KV capacity from its registration."""
        reg = engine.registration
        if reg is None:
            return
        # One block size for the whole group (matching across engines needs equal blocks),
        # from the largest granularity registered; workers compute it the same way
        # (`group_block_tokens`) and the packed frame says which size it used.
        self._granularity[engine.row] = reg.prefix_granularity
        self.block_tokens = group_block_tokens(self._granularity, self.min_block_tokens)
        kv_tokens = reg.kv_cache_size_tokens or 0
        if kv_tokens > 0:
            blocks = max(1, kv_tokens // self.block_tokens)
            self.index.set_capacity(engine.row, min(self.max_capacity, blocks))

    def forget(self, engine: Engine) -> None:
        """The engine died or restarted: nothing it was sent is cached any more."""
        self.index.forget(engine.row)

    def hashes(self, payload: object, packed: zmq.Frame | bytes | None = None) -> list[int]:
        """The prompt's block hashes: from the worker's ``packed`` frame
        (`tsfront._native.packed_block_hashes`) when it used our block size, else from the
        ADD payload (bytes or a ``zmq.Frame``)."""
        if packed is not None:
            # A zmq.Frame is a buffer, but pyzmq's stub does not say so.
            view = memoryview(packed)  # type: ignore[arg-type]
            n = len(view)
            if n >= 8 and n % 8 == 0 and n <= 8 * (MAX_BLOCKS + 1):
                words = view.cast("Q")
                if words[0] == self.block_tokens:
                    return words[1:].tolist()
            self.hashed_here += 1  # a block size from another registration, or a bad frame
        # A zmq.Frame or bytes: a buffer, which pyzmq's stub does not say of a Frame.
        return _native.block_hashes(cast("Buffer", payload), self.block_tokens, MAX_BLOCKS)

    def note(
        self, engine: Engine, payload: object, packed: zmq.Frame | bytes | None = None
    ) -> None:
        """Record a prompt sent to ``engine`` without choosing it (a pinned request)."""
        self.index.record(engine.row, self.hashes(payload, packed))

    def choose(
        self, engines: Sequence[Engine], payload: object, packed: zmq.Frame | bytes | None = None
    ) -> Engine | None:
        """The engine for this ADD payload (``packed``: its block hashes from the worker, if
        sent), or None if no engine is placeable; records the prompt in the chosen engine's
        index."""
        n = len(engines)
        if n > len(self.index.lru):
            self.index.grow(n)
            self._granularity += [0] * (n - len(self._granularity))
        start = self._turn % n
        self._turn += 1
        live = 0  # the placeable engines (live and not stalled), as a mask
        least: Engine | None = None
        for k in range(n):
            e = engines[(start + k) % n]
            if e.state is not LIVE or e.stall is not STEPPING:
                continue
            live |= 1 << e.row
            if least is None or e.in_flight < least.in_flight:
                least = e
        if least is None:
            return None  # none is live, or every live one is stalled (see tsfront.io.routing)
        hashes = self.hashes(payload, packed)
        depth, holders = self.index.match(hashes, live)
        chosen = least
        if depth and holders != live:
            best: Engine | None = None
            for k in range(n):
                e = engines[(start + k) % n]
                if holders >> e.row & 1 and (best is None or e.in_flight < best.in_flight):
                    best = e
            assert best is not None
            if (
                best.in_flight - least.in_flight > self.abs_threshold
                and best.in_flight > self.rel_threshold * least.in_flight
            ):
                self.fallbacks += 1
                depth = 0  # nothing of it is on the engine chosen instead
            else:
                chosen = best
        self.matched_blocks += depth
        self.index.record(chosen.row, hashes, depth)
        return chosen


# group_block_tokens, index_block_tokens and packed_hashes are the shared protocol's
# (tsfront.ipc.hashes), re-exported for the routing benchmarks.
__all__ = [
    "AffinityRouter",
    "PrefixIndex",
    "group_block_tokens",
    "index_block_tokens",
    "packed_hashes",
]
