"""A simulated engine group: N ranks dialing one handshake address, as threads or processes.

Ranks get identities ``first_engine_index + rank`` and register with
``data_parallel_rank = rank`` and ``data_parallel_size = N``, like one TokenSpeed launch with
attention DP. In-process (the default) every rank is a thread of this process with its own
``zmq.Context``, and the per-rank test hooks of :class:`tsfront.sim.engine.SimEngine` are
available. With ``processes=True`` every rank is its own spawned OS process, so a fault can
kill one rank for real (``exit_after_steps`` then ``os._exit(1)``) and :meth:`SimGroup.stop`
sends SIGTERM, on which a rank sends ``ENGINE_CORE_DEAD`` as the engine does.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from collections.abc import Mapping
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any

from tsfront.sim.engine import EngineOptions, SimEngine
from tsfront.wire.addresses import check_endpoint

__all__ = ["SimGroup"]

_OUTCOME_EXIT_CODES = {"stopped": 0}


class SimGroup:
    """``num_engines`` simulated ranks dialing ``handshake_address``.

    Args:
        handshake_address: the frontend's handshake ROUTER, e.g. ``"tcp://127.0.0.1:30500"``.
        num_engines: number of ranks (the data-parallel size they register with).
        first_engine_index: identity of rank 0 (the engine's ``--zmq-engine-index``).
        processes: run each rank as its own OS process instead of a thread.
        rank_options: per-rank overrides by 0-based rank, e.g. ``{1: {"dead_after_steps": 3}}``.
        **options: :class:`tsfront.sim.engine.EngineOptions` fields for every rank.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        handshake_address: str,
        num_engines: int,
        first_engine_index: int = 0,
        *,
        processes: bool = False,
        rank_options: Mapping[int, Mapping[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        check_endpoint(handshake_address, "handshake_address", tcp_only=True)
        if num_engines < 1:
            raise ValueError(f"num_engines must be >= 1, got {num_engines}")
        if first_engine_index < 0 or first_engine_index + num_engines - 1 > 0xFFFF:
            raise ValueError("engine indices must fit in 0..65535")
        self.handshake_address = handshake_address
        self.num_engines = num_engines
        self.first_engine_index = first_engine_index
        self.processes = processes
        base = EngineOptions(**options)
        overrides = dict(rank_options or {})
        unknown = set(overrides) - set(range(num_engines))
        if unknown:
            raise ValueError(f"rank_options names ranks outside 0..{num_engines - 1}: {unknown}")
        self.rank_options = [base.replace(**overrides.get(r, {})) for r in range(num_engines)]
        self.engines: list[SimEngine] = []
        self._procs: list[BaseProcess] = []
        self._proc_registered: list[Any] = []
        self._started = False
        # One condition for every rank's log, so a group-wide wait wakes on any rank's event.
        self._events = threading.Condition()

    @property
    def engine_indices(self) -> list[int]:
        """The identity index of every rank, in rank order."""
        return [self.first_engine_index + r for r in range(self.num_engines)]

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> SimGroup:
        """Start every rank (they dial the handshake address at once); returns ``self``."""
        if self._started:
            raise RuntimeError("SimGroup already started")
        self._started = True
        if self.processes:
            ctx = multiprocessing.get_context("spawn")
            for rank, index in enumerate(self.engine_indices):
                registered = ctx.Event()
                proc = ctx.Process(
                    target=_run_rank_process,
                    args=(
                        self.handshake_address,
                        index,
                        rank,
                        self.num_engines,
                        self.rank_options[rank],
                        registered,
                    ),
                    name=f"tsfront-sim-engine-{index}",
                    daemon=True,
                )
                proc.start()
                self._procs.append(proc)
                self._proc_registered.append(registered)
            return self
        for rank, index in enumerate(self.engine_indices):
            engine = SimEngine(
                self.handshake_address,
                index,
                data_parallel_rank=rank,
                data_parallel_size=self.num_engines,
                options=self.rank_options[rank],
                condition=self._events,
            )
            self.engines.append(engine)
            engine.start()
        return self

    def stop(self, timeout: float = 5.0, *, sentinel: bool = True) -> bool:
        """Stop every rank and wait for it; returns whether all ended within ``timeout``.

        Threads are joined and their sockets closed; processes get SIGTERM (``sentinel`` is
        then always on), and SIGKILL if they outlive the deadline.
        """
        deadline = time.monotonic() + timeout
        clean = True
        if self.processes:
            for proc in self._procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in self._procs:
                proc.join(max(0.0, deadline - time.monotonic()))
                if proc.is_alive():
                    clean = False
                    proc.kill()
                    proc.join(1.0)
            return clean
        for engine in self.engines:
            engine.request_stop(sentinel=sentinel)
        for engine in self.engines:
            clean &= engine.stop(max(0.0, deadline - time.monotonic()), sentinel=sentinel)
        return clean

    def __enter__(self) -> SimGroup:
        """Start the group unless :meth:`start` already ran."""
        return self if self._started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- hooks --------------------------------------------------------------------------------

    def engine(self, index: int) -> SimEngine:
        """The in-process rank whose identity index is ``index``."""
        self._require_threads()
        return self.engines[index - self.first_engine_index]

    def wait_registered(self, timeout: float) -> bool:
        """Wait until every rank has sent its registration; raises ``TimeoutError``."""
        deadline = time.monotonic() + timeout
        if self.processes:
            for index, event in zip(self.engine_indices, self._proc_registered):
                if not event.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"engine {index} did not register in {timeout}s")
            return True
        for engine in self.engines:
            engine.wait_registered(max(0.0, deadline - time.monotonic()))
        return True

    def wait_request(self, rid: str, timeout: float) -> tuple[int, Any]:
        """Wait until some rank received an ADD for ``rid``; returns (engine index, request)."""
        engine = self._wait_any(lambda e: e.kind == "add" and e.rid == rid, timeout, rid)
        return engine.engine_index, engine.wait_request(rid, 0)

    def wait_abort(self, rid: str, timeout: float) -> int:
        """Wait until some rank received an ABORT for ``rid``; returns its engine index."""
        return self._wait_any(
            lambda e: e.kind == "abort" and e.rid == rid, timeout, rid
        ).engine_index

    def counters(self) -> dict[int, dict[str, int]]:
        """Per-rank counters keyed by engine index (see :meth:`SimEngine.counters`)."""
        self._require_threads()
        return {engine.engine_index: engine.counters() for engine in self.engines}

    def exitcodes(self) -> list[int | None]:
        """Process mode: every rank's exit code (``None`` while running)."""
        return [proc.exitcode for proc in self._procs]

    def wait_exited(self, timeout: float) -> list[int | None]:
        """Process mode: wait up to ``timeout`` for every rank process to exit; exit codes."""
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        return self.exitcodes()

    def pids(self) -> list[int | None]:
        """Process mode: every rank's pid."""
        return [proc.pid for proc in self._procs]

    def threads_alive(self) -> list[bool]:
        """Thread mode: whether each rank's thread is still running."""
        return [engine.alive for engine in self.engines]

    def _wait_any(self, match: Any, timeout: float, rid: str) -> SimEngine:
        self._require_threads()
        deadline = time.monotonic() + timeout
        # The engines share the group's condition, a re-entrant one: their log() takes it too.
        with self._events:
            while True:
                for engine in self.engines:
                    if any(match(entry) for entry in engine.log()):
                        return engine
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no engine saw an event for {rid!r} in {timeout}s")
                self._events.wait(remaining)

    def _require_threads(self) -> None:
        if self.processes:
            raise RuntimeError("per-rank hooks exist only for in-process (thread) groups")


def _run_rank_process(
    handshake_address: str,
    engine_index: int,
    rank: int,
    size: int,
    options: EngineOptions,
    registered: Any,
) -> None:
    """Main function of a rank process: serve until SIGTERM, then exit like the engine."""
    import os

    from tsfront.process.title import set_title

    set_title(f"sim rank {rank} (engine {engine_index})", f"sim {rank}")
    engine = SimEngine(
        handshake_address,
        engine_index,
        data_parallel_rank=rank,
        data_parallel_size=size,
        options=options.replace(hard_exit=True),
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: engine.request_stop())
    signal.signal(signal.SIGINT, lambda signum, frame: engine.request_stop())
    watcher = threading.Thread(
        target=lambda: engine.wait_registered(None) and registered.set(), daemon=True
    )
    watcher.start()
    outcome = engine.run()
    os._exit(_OUTCOME_EXIT_CODES.get(outcome, 1))
