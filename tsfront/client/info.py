"""What a client can know about its engines: `EngineInfo` (registration) and `EngineLoad`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from tsfront.wire import EngineRegistration

if TYPE_CHECKING:
    import numpy as np

    from tsfront.ipc.control import EngineEntry


# mypy reads msgspec's Struct as a dataclass and refuses a frozen subclass of a non-frozen
# one; msgspec itself allows it.
class EngineInfo(EngineRegistration, kw_only=True, frozen=True):  # type: ignore[misc]
    """An engine that completed the handshake: its index, rank, output endpoint, and every
    field of its registration (`tsfront.wire.EngineRegistration`: ``max_model_len``,
    ``data_parallel_rank``, ``vllm_version``, ...).

    ``max_model_len`` is the model's context length as the engine reports it; the usable limit
    for a prompt plus its new tokens is `context_limit` (the cache can be smaller).

    ``role`` is ``"aggregated"``, or under `Routing.disaggregated` ``"prefill"`` or
    ``"decode"``; ``rank`` counts from 0 within the engine's group.
    """

    index: int
    rank: int
    output_address: str = ""
    role: str = "aggregated"

    @property
    def context_limit(self) -> int | None:
        """Tokens a request (prompt + new tokens) may span on this engine, if known."""
        # Read on every request (twice): no list per call.
        model, cache = self.max_model_len, self.kv_cache_size_tokens
        if model and cache:
            return min(model, cache)
        return model or cache or None

    @classmethod
    def from_entry(cls, entry: EngineEntry) -> EngineInfo:
        """Build from an engine of the I/O process's `Engines` / `EngineUpdate` message."""
        reg = entry.registration
        values = msgspec.structs.asdict(reg) if reg is not None else {}
        return cls(
            index=entry.index,
            rank=entry.rank,
            output_address=entry.output_address,
            role=entry.role,
            **values,
        )


@dataclass(frozen=True)
class EngineLoad:
    """An engine's latest scheduler load, as reported with its outputs, plus tsfront's count.

    ``num_running``/``num_waiting``/``kv_*`` come from the load tail of the engine's last
    output frame (0.1.1 engines; zeros for older engines or before any output); ``age`` is how
    long ago that was, or None if never. ``in_flight`` is tsfront's own exact count. ``role``
    is the engine's (see `EngineInfo`).

    ``state`` is ``"absent"``, ``"handshaking"``, ``"live"``, ``"stalled"`` or ``"dead"``;
    ``alive`` is true for ``"live"`` and ``"stalled"`` (connected: a stalled engine held
    requests but sent no output for ``ClientConfig.stall_timeout``, so new requests go to the
    live ones and the I/O process probes it; it is ``"live"`` again with its next output).
    """

    index: int
    rank: int
    alive: bool
    state: str
    in_flight: int
    num_running: int
    num_waiting: int
    kv_active_pages: int
    kv_total_pages: int
    age: float | None
    requests_total: int
    role: str = "aggregated"

    @property
    def cache_usage(self) -> float | None:
        """``kv_active_pages / kv_total_pages``, or None without load information."""
        if not self.kv_total_pages:
            return None
        return self.kv_active_pages / self.kv_total_pages


STATE_NAMES = {0: "absent", 1: "handshaking", 2: "live", 3: "dead", 4: "stalled"}


def load_from_row(info: EngineInfo, row: np.ndarray, load_ms: int) -> EngineLoad:
    """Read engine ``info``'s row of the engine table (a numpy view of shared memory)."""
    from tsfront.ipc import region as r

    state = int(row[r.E_STATE])
    age = None if load_ms == 0 else max(0.0, time.monotonic() - load_ms / 1000.0)
    return EngineLoad(
        index=info.index,
        rank=info.rank,
        alive=state in r.SERVING_STATES,
        state=STATE_NAMES.get(state, "unknown"),
        in_flight=int(row[r.E_IN_FLIGHT]),
        num_running=int(row[r.E_RUNNING]),
        num_waiting=int(row[r.E_WAITING]),
        kv_active_pages=int(row[r.E_KV_ACTIVE]),
        kv_total_pages=int(row[r.E_KV_TOTAL]),
        age=age,
        requests_total=int(row[r.E_REQUESTS_LO]) | (int(row[r.E_REQUESTS_HI]) << 32),
        role=info.role,
    )
