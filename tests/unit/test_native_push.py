"""The drain's native pass (``tsfront._native.push_batch`` via `tsfront.client.stream.deliver_all`)
against the Python path it stands in for (`RequestStream.deliver` → `Pusher.__call__`).

Two identical worlds of streams, each parked in a real reader task on a real `Pusher` with the
native step (a stand-in for uvicorn's cycle: its ``flow``, ``disconnected``,
``response_complete``, ``transport`` and ``send``), are fed the same batches of updates, one by
the Python loop the drain ran before (`deliver` per update) and one by `deliver_all`; between
batches both get the same changes of state (flow control paused, the client gone, the response
complete, a send in flight, a pushed error, a transport whose write raises, a reader cancelled,
a stream dropped, a sink that is not a native pusher). Everything observable must be the same:
the bytes each connection got, in order, through its transport and through ``send``; the
chunks and errors each reader saw; each stream's engine index, each choice's token count,
each pusher's error. Hypothesis draws the batches (plain tokens of one to three ids, logprobs,
finish codes engine and local, empty updates) and the changes.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.push_fixtures import LoggingOwner, PlainChoice

import tsfront.serve.core.push as push
from tsfront import _native
from tsfront.client.stream import RequestStream, deliver_all
from tsfront.ipc import region
from tsfront.serve.core.push import Pusher
from tsfront.text.detok import TableDetokenizer, TokenTable

_EURO = "€".encode()
PIECES = [b" a", b'"', b"\\", b"\n", _EURO[:1], _EURO[1:2], _EURO[2:], b"\xff", "😀".encode(), b"x"]
TABLE = TokenTable(PIECES, None, frozenset(), False, False, "replace")
HEAD, TAIL = b'data: {"text":', b"}\n\n"


class _Flow:
    def __init__(self) -> None:
        self.write_paused = False


class _Transport:
    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.raises: BaseException | None = None

    def write(self, data: bytes) -> None:
        if self.raises is not None:
            raise self.raises
        self.log.append(("write", data))


class _Cycle:
    """What the native step and `Pusher` use of uvicorn's `RequestResponseCycle`."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.chunked_encoding = True
        self.scope = {"method": "POST"}
        self.flow = _Flow()
        self.disconnected = False
        self.response_complete = False
        self.transport = _Transport(log)

    async def send(self, message: dict[str, Any]) -> None:
        self.log.append(("send", message["body"]))


@pytest.fixture(autouse=True)
def _fake_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(push, "_cycle_types", lambda: (_Cycle,))


class _World:
    """``n`` streams, each with its reader task, choice, cycle and pusher."""

    def __init__(self, n: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.owner = LoggingOwner(self.loop)
        self.logs: list[list[Any]] = [[] for _ in range(n)]
        self.streams: list[RequestStream | None] = []
        self.refs: list[weakref.ref[RequestStream] | None] = []
        self.choices: list[PlainChoice] = []
        self.cycles: list[_Cycle] = []
        self.pushers: list[Pusher] = []
        self.tasks: list[asyncio.Task] = []
        for i in range(n):
            stream = RequestStream(self.owner, f"r{i}", i, 1)
            detok = TableDetokenizer(TABLE)
            detok.step([0])  # past the first-token rules: the native step applies
            choice = PlainChoice(detok)
            cycle = _Cycle(self.logs[i])
            pusher = Pusher(choice, HEAD, TAIL, cycle.send)
            assert pusher.native
            stream.set_sink(pusher)
            self.streams.append(stream)
            self.refs.append(weakref.ref(stream))
            self.choices.append(choice)
            self.cycles.append(cycle)
            self.pushers.append(pusher)
            self.tasks.append(asyncio.ensure_future(self._read(stream, self.logs[i])))

    @staticmethod
    async def _read(stream: RequestStream, log: list[Any]) -> None:
        try:
            async for chunk in stream:
                log.append(("chunk", chunk.output_ids, chunk.finish_reason, chunk.engine_index))
        except Exception as exc:
            log.append(("error", type(exc).__name__))
        except asyncio.CancelledError:
            log.append(("cancelled",))

    def change(self, kind: str, i: int) -> None:
        cycle, pusher = self.cycles[i], self.pushers[i]
        if kind == "pause":
            cycle.flow.write_paused = not cycle.flow.write_paused
        elif kind == "gone":
            cycle.disconnected = True
        elif kind == "complete":
            cycle.response_complete = True
        elif kind == "inflight":
            pusher.inflight = None if pusher.inflight is not None else object()  # type: ignore[assignment]
        elif kind == "error":
            pusher.error = OSError("pushed error")
        elif kind == "raises":
            cycle.transport.raises = ConnectionResetError("write failed")
        elif kind == "cancel":
            self.tasks[i].cancel()
        elif kind == "drop":
            # The stream's owner lets it go (its reader task too): the slot's ref dies.
            self.tasks[i].cancel()
            self.streams[i] = None
        elif kind == "plain_sink":
            stream = self.streams[i]
            if stream is not None:
                stream.set_sink(lambda tokens: bool(self.logs[i].append(("sink", tokens))) or True)
        elif kind == "no_sink":
            stream = self.streams[i]
            if stream is not None:
                stream.set_sink(None)

    def observed(self) -> list[Any]:
        return [
            self.logs,
            self.owner.log,
            [s.engine_index if s is not None else None for s in self.streams],
            [c.tokens for c in self.choices],
            [c.detok.native_state()[1].getstate() for c in self.choices],  # type: ignore[index]
            [repr(p.error) for p in self.pushers],
        ]


Deliver = Callable[[list[tuple], list[Any]], None]


def _python_loop(updates: list[tuple], refs: list[Any]) -> None:
    # The drain's loop before the native pass.
    for update in updates:
        ref = refs[update[0]]
        if ref is not None and (stream := ref()) is not None:
            stream.deliver(update)


async def _play(n: int, script: list[tuple[str, Any]], deliver: Deliver) -> list[Any]:
    world = _World(n)
    await asyncio.sleep(0)  # every reader parks
    for what, arg in script:
        if what == "batch":
            deliver(list(arg), world.refs)
        else:
            world.change(what, arg)
            if what in ("cancel", "drop"):
                continue  # the next batch may come before the task sees it (a done waiter)
        for _ in range(3):
            await asyncio.sleep(0)  # readers woken take their chunks and park again
    for task in world.tasks:
        task.cancel()
    await asyncio.gather(*world.tasks, return_exceptions=True)
    return world.observed()


def _both(n: int, script: list[tuple[str, Any]]) -> tuple[list[Any], list[Any]]:
    return asyncio.run(_play(n, script, _python_loop)), asyncio.run(_play(n, script, deliver_all))


CHANGES = ["pause", "gone", "complete", "inflight", "error", "raises", "cancel", "drop"]
CHANGES += ["plain_sink", "no_sink"]


@st.composite
def _scripts(draw: st.DrawFn) -> tuple[int, list[tuple[str, Any]]]:
    # What a reader can produce: a slot has news only until it ends (a finish code, or the
    # stream aborted: cancelled or dropped), and never an update with nothing in it.
    n = draw(st.integers(1, 4))
    live = set(range(n))
    ending: set[int] = set()
    tokens = st.lists(st.integers(-1, len(PIECES)), min_size=0, max_size=3)
    engine_finish = [_native.FIN_STOP, _native.FIN_LENGTH]
    finish = st.sampled_from([0] * 12 + engine_finish + [region.FIN_ENGINE_DEAD])
    script: list[tuple[str, Any]] = []
    step = 1
    for _ in range(draw(st.integers(1, 14))):
        if not live:
            break
        if draw(st.integers(0, 3)) == 0:
            what, i = draw(st.sampled_from(CHANGES)), draw(st.integers(0, n - 1))
            script.append((what, i))
            if what in ("cancel", "drop"):
                ending.add(i)  # its news may still come in the next batch, not after
            continue
        slots = draw(st.permutations(sorted(live)))[: draw(st.integers(1, len(live)))]
        batch = []
        for slot in slots:
            fin = draw(finish)
            toks = draw(tokens) or ([] if fin else [0])
            lp = draw(st.integers(0, 9)) == 0
            vals = [-0.5] * len(toks) if lp else None
            idx = list(toks) if lp else None
            step += 1
            batch.append((slot, toks, vals, idx, fin, 5, step, 0, draw(st.integers(0, 2))))
            if fin:
                live.discard(slot)
        script.append(("batch", batch))
        live -= ending
        ending.clear()
    return n, script


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_scripts())
def test_deliver_all_is_the_python_loop(case: tuple[int, list[tuple[str, Any]]]) -> None:
    n, script = case
    python, native = _both(n, script)
    assert native == python


def _chunk(json: str) -> bytes:
    body = HEAD + json.encode() + TAIL
    return b"%x\r\n" % len(body) + body + b"\r\n"


def _plain(slot: int, tokens: list[int], engine: int = 1) -> tuple:
    return (slot, tokens, None, None, 0, 5, 1, 0, engine)


def test_the_common_case_is_written_without_calling_the_sink(monkeypatch) -> None:
    # Plain tokens of parked native pushers are the native pass's: Pusher.__call__ never runs,
    # and every byte is what __call__ would have written.
    calls: list[list[int]] = []
    real = Pusher.__call__

    def counted(self: Pusher, tokens: list[int]) -> bool:
        calls.append(tokens)
        return real(self, tokens)

    monkeypatch.setattr(Pusher, "__call__", counted)
    script: list[tuple[str, Any]] = [
        ("batch", [_plain(0, [0]), _plain(1, [1, 2])]),
        ("batch", [_plain(1, [4, 5, 6]), _plain(0, [8])]),
    ]
    python = asyncio.run(_play(2, script, _python_loop))
    assert len(calls) == 4
    calls.clear()
    native = asyncio.run(_play(2, script, deliver_all))
    assert calls == []
    assert native == python
    logs = native[0]
    assert logs[0] == [("write", _chunk('" a"')), ("write", _chunk('"\U0001f600"')), ("cancelled",)]
    assert native[2] == [1, 1] and native[3] == [2, 5]  # engine index; tokens counted


def test_each_fallback_goes_to_the_sink_or_the_reader() -> None:
    # Every check the pass makes, one per stream: each update is left to `deliver`, which
    # takes the ASGI send (paused), the reader (in flight, gone, complete, logprobs, finish).
    async def run() -> tuple[_World, list[tuple]]:
        world = _World(7)
        await asyncio.sleep(0)
        world.change("pause", 0)
        world.change("inflight", 1)
        world.change("gone", 2)
        world.change("complete", 3)
        batch = [_plain(i, [0]) for i in range(4)]
        batch.append((4, [0], [-1.0], [0], 0, 5, 1, 0, 1))  # logprobs
        batch.append((5, [0], None, None, _native.FIN_STOP, 5, 1, 0, 1))  # the last chunk
        batch.append((6, [], None, None, 0, 5, 1, 0, 1))  # no tokens
        rest = _native.push_batch(batch, world.refs)
        return world, rest

    async def main() -> None:
        world, rest = await run()
        assert [u[0] for u in rest] == list(range(7))
        assert all(not log for log in world.logs)  # nothing written by the pass
        for task in world.tasks:
            task.cancel()
        await asyncio.gather(*world.tasks, return_exceptions=True)

    asyncio.run(main())


def test_a_write_that_raises_is_the_pushers_error_and_a_base_exception_propagates() -> None:
    async def main() -> None:
        world = _World(2)
        await asyncio.sleep(0)
        world.change("raises", 0)
        assert _native.push_batch([_plain(0, [0]), _plain(1, [0])], world.refs) == []
        assert isinstance(world.pushers[0].error, ConnectionResetError)
        assert world.pushers[0].error.__traceback__ is not None
        assert world.pushers[1].error is None and world.logs[1]
        world.cycles[1].transport.raises = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt):
            _native.push_batch([_plain(1, [0])], world.refs)
        assert world.pushers[1].error is None
        for task in world.tasks:
            task.cancel()
        await asyncio.gather(*world.tasks, return_exceptions=True)

    asyncio.run(main())


def test_updates_of_free_dead_or_foreign_slots_are_left() -> None:
    async def main() -> None:
        world = _World(1)
        await asyncio.sleep(0)
        foreign = _Flow()  # alive, but not a stream: it has no ``_push``
        dead = weakref.ref(_Flow())
        assert dead() is None
        refs: list[Any] = [None, weakref.ref(foreign), dead, world.refs[0]]
        batch = [_plain(0, [0]), _plain(1, [0]), _plain(2, [0]), _plain(7, [0]), _plain(-1, [0])]
        batch += [("x",), _plain(3, [0])]  # type: ignore[list-item]
        rest = _native.push_batch(batch, refs)
        assert rest == batch[:6]
        assert [kind for kind, *_ in world.logs[0]] == ["write"]
        with pytest.raises(TypeError):
            _native.push_batch((), [])  # type: ignore[arg-type]
        world.tasks[0].cancel()
        await asyncio.gather(*world.tasks, return_exceptions=True)

    asyncio.run(main())
