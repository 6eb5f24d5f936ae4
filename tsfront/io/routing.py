"""Placement of unpinned requests: the `LoadBalance` policies, pure functions of engine state.

Ties are broken by rotating the scan start, so no policy favours rank 0. Every policy places
only on a `placeable` engine (live and not stalled: see `tsfront.io.engines`): a client's
request is never what tests a stalled engine (the I/O process probes it with its own), so
when every live engine is stalled there is no choice, and the I/O core ends the request at
once with `EngineStalled` (retryable) rather than leave it on a rank that may never answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tsfront.config import ClientConfig, LoadBalance
from tsfront.io.affinity import AffinityRouter
from tsfront.io.engines import STEPPING, Engine, EngineState

if TYPE_CHECKING:
    import zmq

LIVE = EngineState.LIVE  # a module global: read per engine on the placement path


class Router:
    """Chooses an engine for each unpinned request under one policy."""

    def __init__(
        self, policy: LoadBalance, load_ttl: float, config: ClientConfig | None = None
    ) -> None:
        self.policy = policy
        self.load_ttl = load_ttl
        # The scan start, moved by one a request (ties rotate), and ROUND_ROBIN's own cursor.
        # Public: the native turn (native/turn.c) places requests under the same policies and
        # moves them as `choose` does.
        self.rotation = 0
        self.rr_next = 0
        self.affinity: AffinityRouter | None = None
        if policy is LoadBalance.PREFIX_AFFINITY:
            c = config or ClientConfig()
            self.affinity = AffinityRouter(
                c.num_engines,
                capacity=c.prefix_index_blocks,
                min_block_tokens=c.prefix_block_tokens,
                abs_threshold=c.affinity_abs_threshold,
                rel_threshold=c.affinity_rel_threshold,
            )

    def choose(
        self,
        engines: Sequence[Engine],
        payload: object = b"",
        hashes: zmq.Frame | bytes | None = None,
    ) -> Engine | None:
        """The engine for the next request (its ADD ``payload``, and the prompt's packed block
        hashes if the worker sent them), or None if no engine is placeable (none is live, or
        every live one is stalled)."""
        if self.affinity is not None:
            return self.affinity.choose(engines, payload, hashes)
        n = len(engines)
        start = self.rotation % n
        self.rotation += 1
        if self.policy is LoadBalance.ROUND_ROBIN:
            # Its own cursor, resumed after the engine chosen: advancing by one per request
            # would hand a dead engine's turns to the live engine after it.
            for k in range(n):
                i = (self.rr_next + k) % n
                if engines[i].placeable:
                    self.rr_next = i + 1
                    return engines[i]
            return None
        now = time.monotonic()
        best: Engine | None = None
        best_key: tuple = ()
        for k in range(n):
            e = engines[(start + k) % n]
            # Inline `not e.placeable`: a stalled engine is skipped.
            if e.state is not LIVE or e.stall is not STEPPING:
                continue
            key = self._key(e, now)
            if best is None or key < best_key:
                best, best_key = e, key
        return best

    def _key(self, e: Engine, now: float) -> tuple:
        if self.policy is LoadBalance.LEAST_IN_FLIGHT:
            return (e.in_flight,)
        fresh = e.tail_fresh(self.load_ttl, now)
        if self.policy is LoadBalance.SHORTEST_QUEUE:
            if not fresh:
                return (e.in_flight,)
            running, waiting, _, _ = e.tail
            sent_since = max(e.in_flight - e.in_flight_at_tail, 0)
            return (running + waiting + sent_since,)
        # MIN_CACHE_USAGE
        if not fresh:
            return (1.0, e.in_flight)
        _, _, active, total = e.tail
        return (active / total, e.in_flight)
