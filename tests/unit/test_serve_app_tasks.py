"""`ServeApp` registers each generation request under the task that runs it (what `cut` and
the disconnect watch cancel), whichever event loop runs it: the app looks the task up by the
last request's loop and, in a loop of its own, by the running one. Under a server whose cycle
takes the `LOST_HOOK` (tsfront serve's protocol), the server's call cancels the request; the
plain-server watch is `tests/system/test_serve_embedded.py`'s."""

from __future__ import annotations

import asyncio
from typing import Any

from tsfront.serve.core.reply import Reply
from tsfront.serve.edge.asgi import ServeApp


class Service:
    """Answers completions with 200, noting the task the app registered it under."""

    def __init__(self) -> None:
        self.app: ServeApp | None = None
        self.seen: list[bool] = []

    async def completions(self, body: bytes, record: Any = None) -> Reply:
        assert self.app is not None
        task = asyncio.current_task()
        self.seen.append(list(self.app._running) == [task])
        return Reply(200, b"{}")


async def request(app: ServeApp) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # the client stays: no disconnect
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
    # As uvicorn does: a task per request.
    await asyncio.ensure_future(app(scope, receive, send))
    return sent


def test_each_request_is_registered_under_its_own_task_in_any_loop() -> None:
    service = Service()
    app = ServeApp(service)  # type: ignore[arg-type]
    service.app = app

    async def two() -> None:
        for _ in range(2):
            sent = await request(app)
            assert sent[0]["status"] == 200

    asyncio.run(two())
    asyncio.run(two())  # a new loop: the last request's loop is closed
    assert service.seen == [True] * 4 and not app._running


class _Cycle:
    """What tsfront serve's protocol gives the app: ``receive`` bound to a cycle that takes a
    `LOST_HOOK` (None until the app puts a callable there)."""

    def __init__(self, disconnected: bool = False) -> None:
        self.disconnected = disconnected
        self.tsfront_on_lost: Any = None
        self.messages = [{"type": "http.request", "body": b"{}", "more_body": False}]
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.messages:
            return self.messages.pop()
        await asyncio.Event().wait()  # nothing more comes: only the hook tells of a loss
        raise AssertionError


class Waiting:
    """Completions that wait until cancelled, noting the cancellation."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = False

    async def completions(self, body: bytes, record: Any = None) -> Reply:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError


def test_under_a_server_that_takes_the_hook_a_lost_connection_cancels_the_request() -> None:
    from tsfront.serve.edge.transport import LOST_HOOK

    async def main() -> None:
        service = Waiting()
        app = ServeApp(service)  # type: ignore[arg-type]
        cycle = _Cycle()
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        task = asyncio.ensure_future(app(scope, cycle.receive, send))
        await asyncio.wait_for(service.started.wait(), 5)
        hook = getattr(cycle, LOST_HOOK)
        assert callable(hook)
        assert cycle.receives == 1  # the body only: nothing waits on receive() for the loss
        hook()  # as EdgeProtocol.connection_lost calls it
        await asyncio.wait_for(task, 5)  # the handler ends; the task does not raise
        assert service.cancelled and sent == [] and not app._running
        assert getattr(cycle, LOST_HOOK) is None  # taken back when the request ended

    asyncio.run(main())


def test_a_connection_lost_before_the_hook_was_there_cancels_at_once() -> None:
    async def main() -> None:
        service = Waiting()
        app = ServeApp(service)  # type: ignore[arg-type]
        cycle = _Cycle(disconnected=True)  # the protocol told the cycle before the app hooked

        async def send(message: dict[str, Any]) -> None:
            raise AssertionError("nothing is sent to a lost connection")

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await asyncio.wait_for(asyncio.ensure_future(app(scope, cycle.receive, send)), 5)
        assert service.cancelled and not app._running

    asyncio.run(main())
