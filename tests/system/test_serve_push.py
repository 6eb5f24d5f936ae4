"""The streamed hot path: `RequestStream.set_sink` and ``tsfront serve``'s `Pusher`.

The sink contract is checked on real streams (an I/O process, simulated ranks): tokens a sink
takes never reach the reader, everything else does, and the two together are every token once,
in order, whatever the sink answers or raises. `Pusher` is checked against ASGI ``send``
callables that complete, suspend (back-pressure) and fail. The end-to-end check is a client
that stops reading for a while on a long stream, so that the server's writes back up, and
then must get exactly the text the engine generated.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from support.core_fixtures import DEADLINE, expected_tokens, request, rig
from support.serve_fixtures import post_stream, read_chunked
from test_serve import expected_text, start_served

from tsfront.serve.core.push import Pusher

# ---------------------------------------------------------------------- RequestStream.set_sink


async def _read_with_sink(stream, answer) -> tuple[list[int], list[int], list]:
    taken: list[int] = []
    calls = [0]

    def sink(tokens: list[int]) -> bool:
        calls[0] += 1
        ok = answer(calls[0])
        if ok:
            taken.extend(tokens)
        return ok

    stream.set_sink(sink)
    read: list[int] = []
    chunks = []

    async def consume() -> None:
        async for chunk in stream:
            chunks.append(chunk)
            read.extend(chunk.output_ids)

    await asyncio.wait_for(consume(), DEADLINE)
    return taken, read, chunks


@pytest.mark.parametrize("answer", ["always", "every_other", "never"])
async def test_a_sink_takes_plain_tokens_and_the_reader_gets_the_rest_in_order(answer) -> None:
    answers = {
        "always": lambda n: True,
        "every_other": lambda n: n % 2 == 0,
        "never": lambda n: False,
    }[answer]
    async with rig(1) as r:
        n = 60
        stream = await r.client.generate(request("sink-" + answer, n))
        taken, read, chunks = await _read_with_sink(stream, answers)
        want = expected_tokens("sink-" + answer, n)
        # Every token exactly once, in order: the sink's share comes first whenever the reader
        # was parked, so the two interleave by position; rebuild by position.
        assert sorted(taken + read) == sorted(want) and len(taken) + len(read) == n
        assert chunks[-1].finish_reason == "length"
        assert chunks[-1].completion_tokens == n
        if answer == "never":
            assert taken == [] and read == want
        else:
            assert taken, "the sink was never offered tokens"
            # The last chunk always reaches the reader, with its tokens.
            assert chunks[-1].output_ids


async def test_tokens_taken_by_a_sink_and_read_interleave_in_generation_order() -> None:
    async with rig(1) as r:
        n = 50
        order: list[int] = []  # tokens in the order they were handed over, by either side
        calls = [0]
        declined = [0]

        def sink(tokens: list[int]) -> bool:
            calls[0] += 1
            if calls[0] % 3 == 0:
                declined[0] += 1
                return False
            order.extend(tokens)
            return True

        stream = await r.client.generate(request("sink-order", n))
        stream.set_sink(sink)
        async for chunk in stream:
            order.extend(chunk.output_ids)
        # A declined update reaches the reader before the sink is offered anything later.
        assert order == expected_tokens("sink-order", n)
        assert declined[0] > 0, "the sink never declined"


async def test_a_sink_set_or_removed_while_the_reader_is_parked_takes_effect_at_once() -> None:
    async with rig(1) as r:
        n = 80
        stream = await r.client.generate(request("sink-parked", n))
        read: list[int] = []
        chunks = []
        taken: list[int] = []
        took_some = asyncio.Event()
        removed_at = [-1]

        def sink(tokens: list[int]) -> bool:
            assert removed_at[0] < 0, "the sink was offered tokens after it was removed"
            taken.extend(tokens)
            if len(taken) >= 10:
                took_some.set()
            return True

        async def consume() -> None:
            async for chunk in stream:
                chunks.append(chunk)
                read.extend(chunk.output_ids)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)  # one step of the reader: it reads what is there and parks
        assert not task.done()
        before = len(chunks)
        stream.set_sink(sink)  # while parked: the next plain tokens are the sink's
        await asyncio.wait_for(took_some.wait(), DEADLINE)
        assert len(chunks) == before, "the reader got plain tokens while the sink was set"
        stream.set_sink(None)  # while parked (the sink took everything): the reader's again
        removed_at[0] = len(taken)
        await asyncio.wait_for(task, DEADLINE)
        assert len(taken) + len(read) == n and len(chunks) > before
        want = expected_tokens("sink-parked", n)
        head = len(read) - sum(len(c.output_ids) for c in chunks[before:])
        assert read[:head] + taken + read[head:] == want
        assert chunks[-1].finish_reason == "length"


async def test_a_sink_that_raises_is_dropped_and_nothing_is_lost(caplog) -> None:
    async with rig(1) as r:
        n = 40
        taken: list[int] = []

        def sink(tokens: list[int]) -> bool:
            if len(taken) >= 5:
                raise RuntimeError("boom")
            taken.extend(tokens)
            return True

        stream = await r.client.generate(request("sink-raises", n))
        stream.set_sink(sink)
        read: list[int] = []
        with caplog.at_level(logging.ERROR, logger="tsfront"):
            async for chunk in stream:
                read.extend(chunk.output_ids)
        assert taken + read == expected_tokens("sink-raises", n)
        assert any("its sink failed" in rec.getMessage() for rec in caplog.records)


# ---------------------------------------------------------------------- Pusher


class _Send:
    """An ASGI send that records bodies; ``gate`` (an Event) makes it wait like a server
    applying back-pressure (as uvicorn does: an Event's wait, i.e. a pending future)."""

    def __init__(self, gate: asyncio.Event | None = None, fail: Exception | None = None):
        self.bodies: list[bytes] = []
        self.gate = gate
        self.fail = fail

    async def __call__(self, message: dict) -> None:
        if self.fail is not None:
            raise self.fail
        if self.gate is not None and not self.gate.is_set():
            await self.gate.wait()
        self.bodies.append(message["body"])


class _Detok:
    """A detokenizer with no native step (as `StreamDetokenizer`): every event through send."""

    def __init__(self, text) -> None:
        self.step = text

    def native_state(self) -> None:
        return None


class _Choice:
    """What `Pusher` uses of a `Choice`: ``plain`` (the text, counting tokens), ``detok``."""

    def __init__(self, text) -> None:
        self.detok = _Detok(text)
        self.tokens = 0

    def plain(self, tokens: list[int]) -> str:
        self.tokens += len(tokens)
        return self.detok.step(tokens)


def _pusher(send) -> Pusher:
    return Pusher(_Choice(lambda tokens: "".join(f"<{t}>" for t in tokens)), b"H", b"T", send)


async def test_pusher_writes_an_event_per_call_when_send_does_not_wait() -> None:
    send = _Send()
    p = _pusher(send)
    assert p([1]) and p([2, 3])
    assert send.bodies == [b'H"<1>"T', b'H"<2><3>"T']
    assert p.inflight is None
    await p.settle()


async def test_pusher_declines_while_a_suspended_send_is_in_flight_then_settles_in_order() -> None:
    gate = asyncio.Event()
    send = _Send(gate)
    p = _pusher(send)
    assert p([1]) is True  # taken: its send now waits for the gate
    assert p.inflight is not None
    assert p([2]) is False  # declined: the reader will send it after the one in flight
    gate.set()
    await asyncio.wait_for(p.settle(), DEADLINE)
    assert p.inflight is None
    assert send.bodies == [b'H"<1>"T']
    assert p([3]) is True
    assert send.bodies == [b'H"<1>"T', b'H"<3>"T']


async def test_pusher_finishes_a_send_whose_future_is_still_pending_when_it_waits() -> None:
    # The future a suspended send yields is marked as awaited; waiting on it again without
    # clearing the mark raised "await wasn't used with future" while it was still pending.
    gate = asyncio.Event()
    send = _Send(gate)
    p = _pusher(send)
    assert p([1])
    await asyncio.sleep(0)  # the task now waits on the still-pending future
    assert p.inflight is not None and not p.inflight.done()
    gate.set()
    await asyncio.wait_for(p.settle(), DEADLINE)
    assert send.bodies == [b'H"<1>"T'] and p.error is None


async def test_pusher_keeps_what_send_raised_for_settle() -> None:
    p = _pusher(_Send(fail=ConnectionResetError("gone")))
    assert p([1]) is True  # consumed: a sink never raises after taking tokens
    assert p([2]) is False
    with pytest.raises(ConnectionResetError):
        await p.settle()


async def test_pusher_cancel_stops_a_send_in_flight() -> None:
    p = _pusher(_Send(asyncio.Event()))
    assert p([1])
    task = p.inflight
    p.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert p.inflight is None


async def test_pusher_holds_back_an_incomplete_character() -> None:
    send = _Send()
    p = Pusher(_Choice(lambda tokens: ""), b"H", b"T", send)
    assert p([7]) is True
    assert send.bodies == []


# ---------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def fast_served(tmp_path_factory: pytest.TempPathFactory):
    from tsfront.text.testing import make_test_model

    # The model's own context as long as the engine's: the server enforces the smaller.
    model = make_test_model(
        tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel", max_position_embeddings=32000
    )
    s = start_served(str(model), workers=1, context=32000, step_ms=0.05)
    yield s
    assert s.server.stop() == 0
    s.group.stop()


def test_a_client_that_stops_reading_gets_every_token_once_in_order(fast_served) -> None:
    # A small receive buffer and a pause in reading: the server's writes back up (the kernel
    # buffers fill, up to tcp_wmem's 4 MiB, then the transport's 64 KiB, then the server
    # applies back-pressure: ~5 MiB of events is past all three), and the events that could
    # not be pushed go the slow way. The text must be exact either way.
    n = 28000
    sock = post_stream(
        fast_served.url,
        {"model": "tiny-words", "prompt": "w5", "max_tokens": n, "stream": True},
        rcvbuf=4096,
        timeout=DEADLINE,
    )
    # Do not read until the engine has produced the whole stream.
    fast_served.wait("the whole stream generated", lambda: fast_served.in_flight() == 0, 120)
    head, rest = read_chunked(sock, read=1 << 16, within=60)
    assert head.startswith(b"HTTP/1.1 200")
    texts = []
    for line in rest.split(b"\n"):
        if line.startswith(b"data: {"):
            texts.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(texts) == expected_text(n)


def _chunks(raw: bytes) -> list[bytes]:
    out = []
    while raw:
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out.append(raw[:n])
        raw = raw[n + 2 :]
    return out


def _stream_raw(served, body: dict) -> bytes:
    host, port = served.url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(data), data)
        )
        out = bytearray()
        while not out.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1 << 16)
            assert chunk, "the server closed the connection early"
            out += chunk
    return bytes(out).partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("usage", [False, True])
def test_the_last_event_usage_and_done_travel_in_one_chunk(fast_served, usage: bool) -> None:
    body = {"model": "tiny-words", "prompt": "w5", "max_tokens": 5, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    chunks = _chunks(_stream_raw(fast_served, body))
    last = chunks[-1]
    assert last.endswith(b"data: [DONE]\n\n")
    assert b'"finish_reason":"length"' in last
    assert (b'"usage":{' in last) is usage
    texts = [
        json.loads(line[6:])["choices"][0]["text"]
        for c in chunks
        for line in c.split(b"\n")
        if line.startswith(b"data: {") and b'"choices":[{' in line
    ]
    assert "".join(texts) == expected_text(5)
