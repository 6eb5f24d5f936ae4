"""`ServeApp` registers each generation request under the task that runs it (what `cut` and
the disconnect watch cancel), whichever event loop runs it: the app looks the task up by the
last request's loop and, in a loop of its own, by the running one."""

from __future__ import annotations

import asyncio
from typing import Any

from tsfront.serve.api import Reply
from tsfront.serve.asgi import ServeApp


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
