"""What the core answers with, whatever the dialect: a whole `Reply`, a streamed `SSEReply`
(its last item a `Final`), or an `ApiError`.

An error is a value (status, kind, message, param, code) that a shape renders: `openai_error`
(OpenAI's ``{"error": {...}}``) is the server's default, which the edge and the OpenAI
dialects use; a dialect with a shape of its own renders its errors with it, and the routing
re-renders the edge's errors on that dialect's paths (`Reply.error`, `Reply.shaped`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from tsfront.serve.core.push import Pusher

__all__ = [
    "CUT_MESSAGE",
    "JSON_HEADERS",
    "RETRY_AFTER_S",
    "ApiError",
    "ErrorShape",
    "Final",
    "Reply",
    "SSEReply",
    "Send",
    "openai_error",
]

#: Seconds a client should wait before retrying a 503.
RETRY_AFTER_S = 1
#: Why a stopping server cut a request (`tsfront.serve.edge.asgi.ServeApp.cut`).
CUT_MESSAGE = (
    "the server is shutting down and cut this request after its graceful timeout; retry it"
)

_JSON = msgspec.json.Encoder()
JSON_HEADERS = [(b"content-type", b"application/json")]


class Reply:
    """A complete response: status, JSON body bytes, extra headers; ``error``: the `ApiError`
    it renders, if it is one (so that a dialect's routes can render it in their own shape)."""

    __slots__ = ("body", "error", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        error: ApiError | None = None,
    ):
        self.status = status
        self.body = body
        self.headers = headers or JSON_HEADERS
        self.error = error

    def shaped(self, shape: ErrorShape) -> Reply:
        """This reply in ``shape`` if it is an error (its other headers kept), else itself."""
        if self.error is None:
            return self
        new = shape(self.error)
        names = {name for name, _ in new.headers}
        extra = [h for h in self.headers if h[0] not in names]
        return Reply(new.status, new.body, [*new.headers, *extra], self.error)


#: An ASGI ``send``: `Pusher` steps the coroutine it returns by hand.
Send = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]


class Final(bytes):
    """The last bytes of a streamed response (its last events and ``[DONE]``): the server
    sends them together with the end of the body, in one write."""

    __slots__ = ()


class SSEReply:
    """A streamed response (status 200, ``text/event-stream``): iterate ``events``; the last
    item is a `Final`.

    Closing the iterator early (``aclose``) aborts every engine request still running.
    """

    __slots__ = ("cut", "events", "push")

    status = 200
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        push: Callable[[Send], Pusher] | None = None,
        cut: Callable[[], bytes] | None = None,
    ) -> None:
        self.events = events
        #: For a response that can take the hot path: given the ASGI ``send`` (after the
        #: response start), installs and returns the `Pusher` of its one choice.
        self.push = push
        #: Makes the last bytes when a stopping server cuts the stream, at that moment (None:
        #: a chat-shaped error event and ``[DONE]``).
        self.cut = cut


class ApiError(Exception):
    """A request the server answers with an error object instead of an answer: its status,
    ``kind`` (OpenAI's error type), the request field it names, and an optional ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code
        super().__init__(message)

    def reply(self, shape: ErrorShape | None = None) -> Reply:
        """The error as an HTTP reply in ``shape`` (default: `openai_error`)."""
        return (shape or openai_error)(self)


#: Renders an `ApiError` as a dialect's error reply.
ErrorShape = Callable[[ApiError], Reply]


def openai_error(err: ApiError) -> Reply:
    """OpenAI's error object (503s carry ``Retry-After``): the server's default shape."""
    body = _JSON.encode(
        {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": err.code}}
    )
    headers = JSON_HEADERS
    if err.status == 503:
        headers = [*JSON_HEADERS, (b"retry-after", str(RETRY_AFTER_S).encode())]
    return Reply(err.status, body, headers, err)
