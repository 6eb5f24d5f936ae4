"""Replay engines for throughput tests: ranks that push pre-encoded output frames on cue.

A simulated rank encodes every step it sends, so a consumer measured against it measures the
simulator too. `ReplayEngines` starts a real I/O process and ``ranks`` replay engines
(:mod:`tsfront.bench.replay`, the throughput suite's own: each its own spawned process that
handshakes as a TokenSpeed rank, through :class:`tsfront.sim.endpoint.EngineEndpoint`). A
test attaches its clients to `ReplayEngines.address`, then per round:

1. `ReplayEngines.round` picks fresh rids (``rows`` per rank) and has every engine encode that
   round's frames (a cycle of decode steps, one token per request each, and the step that
   finishes them all with ``"length"``); `ReplayRound.requests` are the matching pinned
   requests;
2. the test submits them (``EngineClient.generate``) and calls `ReplayEngines.wait_adds`,
   which returns once every engine has received its ADDs;
3. `ReplayEngines.burst` has every engine send ``steps`` frames back to back: every request
   then streams exactly ``steps`` tokens and finishes.

Nothing is encoded while a burst is sent, so what the consumer does per token is what a
round costs beyond the frames' transport. Nothing here imports pytest.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from tsfront.bench import replay
from tsfront.config import ClientConfig
from tsfront.process.ioproc import IOProcess
from tsfront.testing.engines import private_addresses
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

__all__ = ["ReplayEngines", "ReplayRound"]


@dataclass(frozen=True)
class ReplayRound:
    """One round's rids per rank, and the requests that match its frames."""

    name: str
    rids: list[list[str]]
    requests: list[TokenizedGenerateReqInput]

    @property
    def rows(self) -> int:
        """Requests per rank."""
        return len(self.rids[0])


class _Engine:
    """One replay engine process and the driver's end of its pipe."""

    def __init__(self, ctx: Any, handshake: tuple[str, int, int, int]) -> None:
        self.conn: Connection
        self.conn, child = ctx.Pipe()
        self.proc: BaseProcess = ctx.Process(
            target=replay.engine_main, args=(child, handshake), daemon=True
        )
        self.proc.start()
        child.close()

    def ask(self, *msg: Any) -> None:
        self.conn.send(msg)

    def answer(self, expect: str, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"replay engine {self.proc.pid}: no {expect!r} in {timeout}s")
        reply = self.conn.recv()
        if reply[0] != expect:
            raise RuntimeError(f"replay engine {self.proc.pid}: {reply[0]!r}, not {expect!r}")
        return reply

    def close(self) -> None:
        try:
            self.conn.send(("exit",))
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


class ReplayEngines:
    """An I/O process and ``ranks`` replay engines; `close` (or ``with``) stops them all.

    ``config``: more `ClientConfig` fields (``max_workers``, ``slots_per_worker``,
    ``ring_capacity``...); ``timeout``: seconds any start or answer may take.
    """

    def __init__(
        self,
        ranks: int = 1,
        *,
        config: dict[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.ranks = ranks
        self.timeout = timeout
        self.rounds = 0
        options: dict[str, Any] = private_addresses()
        options.update(config or {})
        self.config = ClientConfig(
            handshake_address="tcp://127.0.0.1:0",
            num_engines=ranks,
            handshake_timeout=timeout,
            **options,
        )
        self.io = IOProcess.start(self.config)
        self.engines: list[_Engine] = []
        try:
            mp = multiprocessing.get_context("spawn")
            for rank in range(ranks):
                hs = (self.io.handshake_address, rank, rank, ranks)
                self.engines.append(_Engine(mp, hs))
            for e in self.engines:
                e.answer("ready", timeout)
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        """The I/O process's address, for ``EngineClient.attach``."""
        return self.io.address

    def round(self, rows: int) -> ReplayRound:
        """Fresh rids, ``rows`` per rank, and their frames encoded by every engine."""
        self.rounds += 1
        name = f"r{self.rounds}"
        rids = [replay.make_rids(f"{name}e{k}", rows) for k in range(self.ranks)]
        for k, engine in enumerate(self.engines):
            engine.ask("build", name, rids[k], k)
        for engine in self.engines:
            engine.answer("built", self.timeout)
        requests = [
            TokenizedGenerateReqInput(
                rid=rid,
                input_ids=[1, 2, 3],
                stream=True,
                data_parallel_rank=k,
                sampling_params=SamplingParams(max_new_tokens=1024),
            )
            for i in range(rows)
            for k in range(self.ranks)
            for rid in [rids[k][i]]
        ]
        return ReplayRound(name, rids, requests)

    def wait_adds(self, rnd: ReplayRound) -> None:
        """Block until every engine has received the ADDs of ``rnd``."""
        for engine in self.engines:
            engine.ask("expect", rnd.rows)
        for engine in self.engines:
            engine.answer("got", self.timeout)

    def burst(self, rnd: ReplayRound, steps: int) -> list[float]:
        """Every engine sends ``steps`` frames of ``rnd`` back to back (``steps - 1`` decode
        steps, then the finishing one); the seconds each engine took to send them."""
        if steps < 1:
            raise ValueError(f"steps={steps!r}: a burst is at least the finishing step")
        for engine in self.engines:
            engine.ask("burst", rnd.name, steps, None)
        return [engine.answer("sent", self.timeout)[1] for engine in self.engines]

    def close(self) -> None:
        """Stop the I/O process, then the engines (an engine leaving a live I/O process is an
        engine death; our own teardown is not)."""
        self.io.stop()
        for e in self.engines:
            e.close()
        self.engines = []

    def __enter__(self) -> ReplayEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
