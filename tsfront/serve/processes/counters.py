"""``tsfront serve``'s own shared words: each worker's heartbeat and HTTP counts, the restarts.

The master makes one small shared array (`multiprocessing`'s ``RawArray``: an unlinked file
mapped by every process it is handed to at spawn, so nothing is left in ``/dev/shm``) and
gives it to every worker it starts, replacements included. It holds one block per worker
place, then one block for the master; every value is a u64 written with one aligned 8-byte
store by the block's one writer, as in the metrics area of the shared region
(`tsfront.metrics.layout`):

* a worker place's block: its heartbeat (the worker's loop stores ``time.monotonic_ns()``
  every `heartbeat_interval`; the master reads it, nothing per request), then its HTTP
  responses counted by route and status, then what its HTTP edge refused or cut
  (`EDGE_EVENTS`, published with each heartbeat, so a worker that dies loses at most its
  last interval's). A replacement continues from the counts its predecessor left (nobody
  zeroes them), so a counter never goes back in a scrape;
* the master's block: the workers it replaced.

Any worker reads every block, so one ``GET /metrics`` shows every worker's counts.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["EDGE_EVENTS", "ROUTES", "STATUSES", "ServeCounters", "heartbeat_interval"]

#: Routes counted (``other``: no such route).
ROUTES = (
    "completions", "chat", "responses", "messages", "count_tokens", "models", "tokenize",
    "detokenize", "health", "metrics", "liveness", "readiness", "other",
)  # fmt: skip
#: What the HTTP edge refused or cut (`tsfront.serve.edge.protocol.EdgeLimits.counts`): connections
#: refused at the cap, idle ones evicted for a new one, header and body deadlines, 431s.
EDGE_EVENTS = ("refused", "evicted", "header_timeout", "body_timeout", "too_large")
#: Statuses counted one by one; ``other`` is any other status, ``none`` a request whose client
#: left before any response started.
STATUSES = (
    "200", "204", "400", "401", "403", "404", "405", "408", "413", "422", "429", "431",
    "500", "502", "503", "504", "529", "other", "none",
)  # fmt: skip
_STATUS_INDEX = {s: i for i, s in enumerate(STATUSES)}
_ROUTE_INDEX = {r: i for i, r in enumerate(ROUTES)}
_OTHER_STATUS = _STATUS_INDEX["other"]
_OTHER_ROUTE = _ROUTE_INDEX["other"]

BEAT = 0
_COUNTS = 1
_EDGE = _COUNTS + len(ROUTES) * len(STATUSES)
_PLACE_WORDS = (_EDGE + len(EDGE_EVENTS) + 7) // 8 * 8  # a whole cache line or more
RESTARTS = 0
_MASTER_WORDS = 8


def heartbeat_interval(worker_timeout: float) -> float:
    """Seconds between a worker's heartbeats: a quarter of the timeout, at most one."""
    return min(1.0, worker_timeout / 4)


class ServeCounters:
    """The words of ``places`` worker places and the master over ``buffer`` (u64 words).

    Args:
        buffer: what `words_for` sized (``ctx.RawArray("Q", ServeCounters.words_for(W))``).
        places: worker places (``--workers``).
    """

    def __init__(self, buffer: Any, places: int) -> None:
        self.places = places
        self.buffer = buffer  # kept: the array pickles to the workers the master spawns
        self._words = memoryview(buffer).cast("B").cast("Q")
        if len(self._words) < self.words_for(places):
            raise ValueError(f"{len(self._words)} words: {self.words_for(places)} needed")
        self._master = places * _PLACE_WORDS

    @staticmethod
    def words_for(places: int) -> int:
        """u64 words for ``places`` worker places and the master's block."""
        return places * _PLACE_WORDS + _MASTER_WORDS

    def __reduce__(self) -> tuple[Any, ...]:
        return (ServeCounters, (self.buffer, self.places))

    # ------------------------------------------------------------------ a worker writes

    def beat(self, place: int) -> None:
        """Store worker place ``place``'s heartbeat (now, in monotonic nanoseconds)."""
        self._words[place * _PLACE_WORDS + BEAT] = time.monotonic_ns()

    def count(self, place: int, route: str, status: int | None) -> None:
        """Count one response of worker place ``place`` (``status`` None: the client left
        before any response)."""
        s = _STATUS_INDEX.get("none" if status is None else str(status), _OTHER_STATUS)
        r = _ROUTE_INDEX.get(route, _OTHER_ROUTE)
        self._words[place * _PLACE_WORDS + _COUNTS + r * len(STATUSES) + s] += 1

    def edge(self, place: int) -> list[int]:
        """Worker place ``place``'s published `EDGE_EVENTS` counts (a replacement's base)."""
        base = place * _PLACE_WORDS + _EDGE
        return [int(n) for n in self._words[base : base + len(EDGE_EVENTS)]]

    def set_edge(self, place: int, counts: list[int]) -> None:
        """Publish worker place ``place``'s `EDGE_EVENTS` counts (totals, in that order)."""
        base = place * _PLACE_WORDS + _EDGE
        for i, n in enumerate(counts):
            self._words[base + i] = n

    # ------------------------------------------------------------------ the master writes

    def add_restart(self) -> None:
        """Count one worker replaced (the master only)."""
        self._words[self._master + RESTARTS] += 1

    # ------------------------------------------------------------------ anyone reads

    def last_beat(self, place: int) -> int:
        """Worker place ``place``'s last heartbeat, monotonic nanoseconds (0: none yet)."""
        return int(self._words[place * _PLACE_WORDS + BEAT])

    @property
    def restarts(self) -> int:
        """Workers the master replaced."""
        return int(self._words[self._master + RESTARTS])

    def edge_totals(self) -> dict[str, int]:
        """`EDGE_EVENTS` counts of every worker place so far."""
        totals = [0] * len(EDGE_EVENTS)
        for place in range(self.places):
            for i, n in enumerate(self.edge(place)):
                totals[i] += n
        return dict(zip(EDGE_EVENTS, totals, strict=True))

    def requests(self) -> dict[tuple[str, str], int]:
        """Responses of every worker place so far, by (route, status); zero counts left out."""
        words = self._words.tolist()  # one 8-byte load per value
        out: dict[tuple[str, str], int] = {}
        for place in range(self.places):
            base = place * _PLACE_WORDS + _COUNTS
            for r, route in enumerate(ROUTES):
                for s, status in enumerate(STATUSES):
                    n = words[base + r * len(STATUSES) + s]
                    if n:
                        out[route, status] = out.get((route, status), 0) + n
        return out
