"""A lean raw ASGI app over the core and its dialects (no framework on the per-token path).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses`` (and
``GET``/``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/{id}/cancel``), ``POST /v1/messages`` and ``POST
/v1/messages/count_tokens`` (Anthropic's; every answer on a ``/v1/messages`` path, the edge's
errors included, in Anthropic's error shape), ``GET /v1/models``, ``POST
/v1/tokenize``, ``POST /v1/detokenize`` (also without ``/v1``, as vLLM serves them; counted as
``other``), ``GET /health``, ``GET /liveness`` and ``GET /readiness`` (the probes: the worker
answers; every engine registered, one live, not draining), ``GET /metrics`` (when given a page
to render, on ``metrics_port`` only if one is set; rendered in a thread). Until every engine
registered (a `tsfront serve` worker serves while they load), the API routes answer 503 with
``Retry-After`` (`LOADING_RETRY_AFTER_S`). While the worker drains (`draining`), ``/health``,
``/readiness`` and new completions answer 503 with ``Connection: close``. With ``counters`` (and a
gate, whose exchange sees each status), every response is counted by route and status in the
server's shared words, once it is over (nothing per token). A streamed reply is sent as it is
produced, one ``http.response.body`` message per event. While a request runs, a client that
goes away cancels the handler, and cancelling a stream's read aborts its engine request. Under
``tsfront serve``'s protocol the protocol says so itself (`_LostWatch`: a callable in the
request's cycle, `tsfront.serve.edge.transport.LOST_HOOK`); under any other server a watcher
(`_DisconnectWatch`, no task of its own) waits on ``receive()`` for ``http.disconnect``.

Made with a service (`tsfront serve`'s workers), or with ``attach=`` and ``model=``: then the
ASGI lifespan attaches to the I/O process at startup and detaches at shutdown, which is how a
server that runs its own workers (granian, ``uvicorn --workers``) embeds it.

With a `tsfront.serve.edge.gate.Gate` (``tsfront serve`` gives one) every request first passes the
edge: API keys, request ids, CORS; its responses carry the edge's headers, and its end writes
the access-log line.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import msgspec

from tsfront.serve.anthropic.messages import Messages, anthropic_error
from tsfront.serve.core.reply import CUT_MESSAGE, ApiError, ErrorShape, Final, Reply, SSEReply
from tsfront.serve.edge.metrics_page import CONTENT_TYPE
from tsfront.serve.edge.transport import LOST_HOOK
from tsfront.serve.openai.completions import OpenAIService
from tsfront.serve.responses.endpoints import Responses, stored_route
from tsfront.serve.tokenize import Tokenize

if TYPE_CHECKING:
    from collections.abc import Callable

    from tsfront.client.engine_client import EngineClient
    from tsfront.serve.edge.gate import Exchange, Gate
    from tsfront.serve.processes.counters import ServeCounters

__all__ = ["ServeApp", "app_from_env"]

log = logging.getLogger("tsfront.serve")

#: Largest request body accepted (a prompt of ~1M tokens as JSON ids fits).
MAX_BODY_BYTES = 16 * 1024 * 1024

#: ``Retry-After`` of the API routes while the engines load (they take minutes).
LOADING_RETRY_AFTER_S = 5
#: The routes that answer while the engines load (everything else is a 503 then).
_PROBES = frozenset({"health", "liveness", "readiness", "metrics"})

_NOT_FOUND = ApiError(404, "no such route", kind="not_found_error").reply()
_TOO_LARGE = ApiError(413, f"request body over {MAX_BODY_BYTES} bytes").reply()
_END = {"type": "http.response.body", "body": b"", "more_body": False}
_JSON = msgspec.json.Encoder()
_METRICS_HEADERS = [(b"content-type", CONTENT_TYPE)]


class _Disconnected(Exception):
    pass


class ServeApp:
    """The ASGI application of one worker.

    Args:
        service: the worker's `OpenAIService`; None to make one in the lifespan startup.
        attach: the I/O process address to attach to at startup (when ``service`` is None).
        model: the model folder for `tsfront.text.TextModel.load` (when ``service`` is None).
        tokenizer: the tokenizer's folder, when it is not the model's (``--tokenizer``).
        model_name: the served model name (default: the model's own).
        max_model_len: the server's context limit (``tsfront serve --max-model-len``), when
            ``service`` is None.
        gate: the HTTP edge's rules (keys, request ids, CORS, access log); None for none.
        counters: the server's `ServeCounters` to count responses in (place ``place``).
        metrics: renders the ``GET /metrics`` page (blocking: it is called in a thread).
        metrics_port: serve ``/metrics`` on this local port only (and nothing else there).
        responses: the ``/v1/responses`` routes (`tsfront.serve.responses.endpoints.Responses`,
            with the server's shared store); None: made over ``service`` with an in-process store.
        loading: the service's client may still wait for its engines (attached with
            ``registered=False``): until they registered the API routes answer 503.
    """

    def __init__(
        self,
        service: OpenAIService | None = None,
        *,
        attach: str | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
        model_name: str | None = None,
        gate: Gate | None = None,
        counters: ServeCounters | None = None,
        place: int = 0,
        metrics: Callable[[], bytes] | None = None,
        metrics_port: int | None = None,
        responses: Responses | None = None,
        loading: bool = False,
        max_model_len: int | None = None,
    ) -> None:
        if counters is not None and gate is None:
            raise ValueError("ServeApp counts responses through its gate: give gate= too")
        self.service = service
        self.responses = responses
        self._tokenize: Tokenize | None = None
        self._messages: Messages | None = None
        self.gate = gate
        self.draining = False
        # The generation requests running, with their state lists (see `_request`): `cut`
        # ends them.
        self._running: dict[asyncio.Task[Any], list[bool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the last request's (see _request)
        self._counters = counters
        self._place = place
        self._metrics = metrics
        self._metrics_port = metrics_port
        self._attach = attach
        self._model = model
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._max_model_len = max_model_len
        self._owned: EngineClient | None = None
        self._routes = {
            ("POST", "/v1/completions"): "completions",
            ("POST", "/v1/chat/completions"): "chat",
            ("POST", "/v1/responses"): "responses",
            ("POST", "/v1/messages"): "messages",
            ("POST", "/v1/messages/count_tokens"): "count_tokens",
            ("GET", "/v1/models"): "models",
            ("POST", "/v1/tokenize"): "tokenize",
            ("POST", "/v1/detokenize"): "detokenize",
            ("POST", "/tokenize"): "tokenize",
            ("POST", "/detokenize"): "detokenize",
            ("GET", "/health"): "health",
            ("GET", "/liveness"): "liveness",
            ("GET", "/readiness"): "readiness",
            ("GET", "/metrics"): "metrics",
        }
        # Until the service's engines have all registered once (they never unregister).
        self._loading = loading

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    # ------------------------------------------------------------------ lifespan

    async def startup(self) -> None:
        """Attach to the I/O process and load the model (the lifespan's startup)."""
        if self.service is not None:
            return
        from tsfront.client.engine_client import EngineClient
        from tsfront.text import TextModel

        if not self._attach or not self._model:
            raise RuntimeError("ServeApp needs a service, or attach= and model=")
        text = TextModel.load(self._model, self._tokenizer)
        client = await EngineClient.attach(self._attach)
        self._owned = client
        self.service = OpenAIService(
            client,
            text,
            self._model_name or text.name,
            os.getpid(),
            max_model_len=self._max_model_len,
        )

    async def shutdown(self) -> None:
        """Detach from the I/O process if `startup` attached."""
        client, self._owned = self._owned, None
        if client is not None:
            await client.close()

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _responses_of(self, service: OpenAIService) -> Responses:
        responses = self.responses
        if responses is None or responses.service is not service:
            from tsfront.serve.processes.store import LocalStore

            store = responses.store if responses is not None else LocalStore()
            responses = self.responses = Responses(service, store)
        return responses

    def _messages_of(self, service: OpenAIService) -> Messages:
        messages = self._messages
        if messages is None or messages.service is not service:
            messages = self._messages = Messages(service)
        return messages

    def _tokenize_of(self, service: OpenAIService) -> Tokenize:
        tokens = self._tokenize
        if tokens is None or tokens.service is not service:
            tokens = self._tokenize = Tokenize(service)
        return tokens

    def _readiness(self, service: OpenAIService) -> Reply:
        """``GET /readiness``: 200 once every engine registered, while one is live and the
        worker does not drain; else 503 saying why (each rank's state while they load)."""
        client = service.client
        body: dict[str, Any] = {"ready": False, "worker": service.worker}
        if self.draining:
            body["reason"] = "the server is shutting down"
            return Reply(503, _JSON.encode(body), _DRAINING.headers)
        if client.closed:
            body["reason"] = "the I/O process is gone"
        elif not client.registered:
            states = client.registration()
            body["reason"] = _loading_text(states)
            body["engines"] = [{"rank": r, "state": st} for r, st in enumerate(states)]
        else:
            engines = [{"rank": e.rank, "index": e.index, "state": e.state} for e in client.load()]
            body["engines"] = engines
            if any(e["state"] == "live" for e in engines):
                body["ready"] = True
                return Reply(200, _JSON.encode(body))
            body["reason"] = "no engine is live"
        return Reply(503, _JSON.encode(body), _LOADING_HEADERS)

    def cut(self) -> int:
        """End every generation request still running (the worker stops after its graceful
        timeout): a streamed response gets an error event and ``[DONE]``, one not started yet
        a 503, and their engine requests are aborted. Returns how many were cut."""
        count = 0
        for task, state in list(self._running.items()):
            if not (state[0] or state[1] or state[2]):
                state[2] = True
                task.cancel()
                count += 1
        return count

    # ------------------------------------------------------------------ requests

    async def _http(self, scope: dict, receive: Any, send: Any) -> None:
        gate = self.gate
        if gate is None:
            await self._request(scope, receive, send, None)
            return
        ex = gate.open(scope)
        try:
            if ex.refusal is not None:
                await _send_reply(send, ex.refusal, ex, _shape_of(scope["path"]))
            else:
                await self._request(scope, receive, send, ex)
        finally:
            ex.close()
            counters = self._counters
            if counters is not None:  # by the status the exchange saw sent: nothing per token
                route = self._routes.get((scope["method"], scope["path"]), "other")
                counters.count(self._place, route, ex.sent)

    async def _request(self, scope: dict, receive: Any, send: Any, ex: Exchange | None) -> None:
        route = self._routes.get((scope["method"], scope["path"]))
        # The edge's own errors in the shape of the dialect whose path this is.
        shape = _shape_of(scope["path"])
        stored = None
        if route is None and scope["method"] in ("GET", "DELETE", "POST"):
            stored = stored_route(scope["method"], scope["path"])
            if stored is not None:
                route = "stored"
            elif scope["method"] == "GET" and scope["path"].startswith("/v1/models/"):
                route = "model"  # GET /v1/models/{id}, as openai's models.retrieve asks
        if self._metrics_port is not None:
            server = scope.get("server")
            on_metrics_port = server is not None and server[1] == self._metrics_port
            if on_metrics_port != (route == "metrics"):
                route = None
        if route == "metrics" and self._metrics is None:
            route = None
        service = self.service
        if route == "liveness":
            worker = self._place if service is None else service.worker
            await _send_reply(
                send, Reply(200, _JSON.encode({"live": True, "worker": worker})), ex, shape
            )
            return
        if route is None or service is None:
            await _send_reply(send, _NOT_FOUND if route is None else _unready(), ex, shape)
            return
        if self._loading and route not in _PROBES:
            if service.client.registered:
                self._loading = False
            else:
                await _send_reply(send, _still_loading(service.client), ex, shape)
                return
        if route == "readiness":
            await _send_reply(send, self._readiness(service), ex, shape)
            return
        if route not in _GENERATION:
            try:
                answer = await self._answer(route, service, scope, receive, stored, ex)
            except _Disconnected:
                if ex is not None:
                    ex.client_gone()
                return
            except Exception:  # a bug: still an error object, never a plain-text 500
                log.exception("request on %s failed", scope["path"])
                answer = _INTERNAL
            await _send_reply(send, answer, ex, shape)
            return
        if self.draining:
            await _send_reply(send, _DRAINING, ex, shape)
            return
        try:
            body = await _read_body(receive)
        except _Disconnected:
            if ex is not None:
                ex.client_gone()
            return
        if body is None:
            await _send_reply(send, _TOO_LARGE, ex, shape)
            return
        # A request handler always runs in a task (the server's, per connection). Looked up
        # by the loop of the last request: asyncio.get_running_loop() (in a bare
        # current_task()) makes a getpid system call in Python 3.11, per request.
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:  # the first request, or a loop other than the last one's
            self._loop = asyncio.get_running_loop()
            task = cast("asyncio.Task[Any]", asyncio.current_task(self._loop))
        state = [False, False, False]  # [handler finished, client disconnected, cut]
        self._running[task] = state
        watcher = _watch(receive, task, state)
        reply = None
        pusher = None
        started = False
        try:
            if route == "completions":
                handler = service.completions
            elif route == "responses":
                handler = self._responses_of(service).create
            elif route == "messages":
                handler = self._messages_of(service).create
            else:
                handler = service.chat
            reply = await handler(body, None if ex is None else ex.record)
            if type(reply) is SSEReply:
                headers = reply.headers if ex is None else ex.head(200, reply.headers)[0]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                started = True
                if reply.push is not None:
                    # Plain tokens are now written from the worker's drain (serve/core/push.py);
                    # this loop sends the rest, after any pushed send still in flight.
                    pusher = reply.push(send)
                message = {"type": "http.response.body", "body": b"", "more_body": True}
                ended = False
                async for event in reply.events:
                    if pusher is not None:
                        await pusher.settle()
                    if type(event) is Final:  # with the end of the body, in one write
                        await send({"type": "http.response.body", "body": event})
                        ended = True
                    else:
                        message["body"] = event
                        await send(message)
                if pusher is not None:
                    await pusher.settle()
                if not ended:
                    await send(_END)
            else:
                await _send_reply(send, cast(Reply, reply), ex, shape)
        except asyncio.CancelledError:
            if not (state[1] or state[2]):
                raise
            # Our own cancellation: the client left, or the stopping worker cut the request
            # (`cut`); either way its engine requests are aborted (below and by the service).
            task.uncancel()
            if state[1]:
                if ex is not None:
                    ex.client_gone()
            else:
                if pusher is not None:
                    pusher.cancel()
                ending = reply.cut() if type(reply) is SSEReply and reply.cut else None
                await _send_cut(send, started, ex, ending, shape)
        except OSError:
            # The connection broke while sending; the events' close aborts the request.
            if ex is not None:
                ex.client_gone()
        except Exception:
            log.exception("request on %s failed", scope["path"])
            if reply is None:
                await _send_reply(send, _INTERNAL, ex, shape)
        finally:
            state[0] = True
            del self._running[task]
            watcher.cancel()
            if pusher is not None:
                pusher.cancel()
            if type(reply) is SSEReply:
                await reply.events.aclose()

    async def _answer(
        self,
        route: str,
        service: OpenAIService,
        scope: dict,
        receive: Any,
        stored: tuple[str, str] | None,
        ex: Exchange | None,
    ) -> Reply:
        """The reply of a route that is not a generation (one `Reply`, no stream)."""
        if route == "metrics":
            page = await asyncio.to_thread(cast("Callable[[], bytes]", self._metrics))
            return Reply(200, page, _METRICS_HEADERS)
        if self.draining and route not in ("models", "model"):
            return _DRAINING
        if route == "models":
            return service.models()
        if route == "model":  # GET /v1/models/{id}
            return service.model(unquote(scope["path"][len("/v1/models/") :]))
        if route == "stored":
            responses = self._responses_of(service)
            assert stored is not None
            action, rid = stored
            record = None if ex is None else ex.record
            if action == "retrieve":
                return await responses.retrieve(rid, record)
            if action == "input_items":
                return await responses.input_items(rid, scope.get("query_string", b""), record)
            if action == "cancel":
                return await responses.cancel(rid, record)
            return await responses.delete(rid, record)
        if route == "health":
            extra = None if self._counters is None else {"worker_restarts": self._counters.restarts}
            return service.health(extra)
        body = await _read_body(receive)
        if body is None:
            return _TOO_LARGE
        if route == "count_tokens":
            record = None if ex is None else ex.record
            return await self._messages_of(service).count_tokens(body, record)
        tokens = self._tokenize_of(service)
        if route == "tokenize":
            return await tokens.tokenize(body)
        return await tokens.detokenize(body)


#: The routes whose handler makes engine requests (streams, `cut` on shutdown).
_GENERATION = frozenset({"completions", "chat", "responses", "messages"})
_INTERNAL = ApiError(500, "internal server error", kind="server_error").reply()


def _draining() -> Reply:
    reply = ApiError(503, "the server is shutting down", kind="service_unavailable_error").reply()
    return Reply(503, reply.body, [*reply.headers, (b"connection", b"close")], reply.error)


_DRAINING = _draining()


def _shape_of(path: str) -> ErrorShape | None:
    """The error shape of the dialect a path belongs to (None: the default, OpenAI's)."""
    return anthropic_error if path.startswith("/v1/messages") else None


_CUT_EVENT = (
    b"data: "
    + ApiError(503, CUT_MESSAGE, kind="service_unavailable_error").reply().body
    + b"\n\ndata: [DONE]\n\n"
)


async def _send_cut(
    send: Any,
    started: bool,
    ex: Exchange | None,
    ending: bytes | None,
    shape: ErrorShape | None = None,
) -> None:
    try:
        if started:
            body = _CUT_EVENT if ending is None else ending
            await send({"type": "http.response.body", "body": body, "more_body": False})
        else:
            await _send_reply(send, _DRAINING, ex, shape)
    except OSError:
        pass  # the connection is gone too


_LOADING_HEADERS = [
    (b"content-type", b"application/json"),
    (b"retry-after", str(LOADING_RETRY_AFTER_S).encode()),
]


def _loading_text(states: list[str]) -> str:
    done = sum(1 for state in states if state == "live")
    return f"the engines are loading: {done} of {len(states)} rank(s) registered"


def _still_loading(client: EngineClient) -> Reply:
    try:
        why = _loading_text(client.registration())
    except Exception:  # closed meanwhile
        why = "the engines are not registered"
    message = f"{why}; retry in a few seconds (GET /readiness answers 200 once they are)"
    error = ApiError(503, message, kind="service_unavailable_error")
    return Reply(503, error.reply().body, _LOADING_HEADERS, error)


def _unready() -> Reply:
    return ApiError(503, "the server is starting", kind="service_unavailable_error").reply()


async def _read_body(receive: Any) -> bytes | None:
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return None
            parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts) if len(parts) != 1 else parts[0]


def _watch(receive: Any, task: asyncio.Task[Any], state: list[bool]) -> Any:
    """What tells the handler ``task`` that its client left (see `_DisconnectWatch`): the
    server's own word where ``receive``'s cycle takes a `LOST_HOOK`, else the watch."""
    cycle = getattr(receive, "__self__", None)
    if cycle is not None and getattr(cycle, LOST_HOOK, False) is None:
        return _LostWatch(cycle, task, state)
    return _DisconnectWatch(receive, task, state)


class _LostWatch:
    """`_DisconnectWatch`'s job where the server calls the request cycle's `LOST_HOOK` when
    the connection is lost (`tsfront.serve.edge.protocol`): that call cancels the handler ``task``
    as the watch would, and `cancel` takes the hook back."""

    __slots__ = ("_cycle", "_state", "_task")

    def __init__(self, cycle: Any, task: asyncio.Task[Any], state: list[bool]) -> None:
        self._cycle = cycle
        self._task = task
        self._state = state
        if cycle.disconnected:  # lost before the hook was there: as the watch's first step
            self()
        else:
            setattr(cycle, LOST_HOOK, self)

    def __call__(self) -> None:
        if not self._state[0]:
            self._state[1] = True
            self._task.cancel()

    def cancel(self) -> None:
        """Stop watching (the request is over)."""
        setattr(self._cycle, LOST_HOOK, None)


class _DisconnectWatch:
    """Waits on the ASGI ``receive()`` for ``http.disconnect`` while a request runs, then
    cancels its handler ``task`` (marking ``state[1]``, unless ``state[0]``: it finished).

    ``receive()`` is stepped by hand, as `tsfront.serve.core.push.Pusher` steps ``send``: what it
    waits on gets a done callback that steps it again. A task would do the same with a Task
    object, a loop turn to start it and another to cancel it, per request.
    """

    __slots__ = ("_closed", "_coro", "_receive", "_state", "_task")

    def __init__(self, receive: Any, task: asyncio.Task[Any], state: list[bool]) -> None:
        self._receive = receive
        self._task = task
        self._state = state
        self._coro: Any = None
        self._closed = False
        self._step()

    def _step(self, _: object = None) -> None:
        while not self._closed:
            coro = self._coro
            if coro is None:
                coro = self._coro = self._receive()
            try:
                waiting = coro.send(None)
            except StopIteration as done:
                self._coro = None
                if done.value["type"] != "http.disconnect":
                    continue  # more of the body: wait on
                self._closed = True
                if not self._state[0]:
                    self._state[1] = True
                    self._task.cancel()
                return
            except (Exception, asyncio.CancelledError):
                # receive() failed: stop watching (a task would have ended with it).
                self._closed = True
                self._coro = None
                return
            if waiting is None:  # a bare yield: step again on the next turn
                asyncio.get_running_loop().call_soon(self._step)
            else:
                # As a Task does before it waits on what a coroutine yields.
                waiting._asyncio_future_blocking = False
                waiting.add_done_callback(self._step)
            return

    def cancel(self) -> None:
        """Stop watching (the request is over)."""
        self._closed = True
        coro, self._coro = self._coro, None
        if coro is not None:
            coro.close()


async def _send_reply(
    send: Any, reply: Reply, ex: Exchange | None = None, shape: ErrorShape | None = None
) -> None:
    if shape is not None:
        reply = reply.shaped(shape)
    headers, body = reply.headers, reply.body
    if ex is not None:
        headers, body = ex.head(reply.status, headers, body)
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def app_from_env() -> ServeApp:
    """An app configured by ``TSFRONT_ATTACH``, ``TSFRONT_MODEL`` (and optionally
    ``TSFRONT_TOKENIZER``, ``TSFRONT_MODEL_NAME``, ``TSFRONT_MAX_MODEL_LEN``): for servers that
    import their app by name in every worker."""
    max_model_len = os.environ.get("TSFRONT_MAX_MODEL_LEN")
    return ServeApp(
        attach=os.environ["TSFRONT_ATTACH"],
        model=os.environ["TSFRONT_MODEL"],
        tokenizer=os.environ.get("TSFRONT_TOKENIZER") or None,
        model_name=os.environ.get("TSFRONT_MODEL_NAME") or None,
        max_model_len=int(max_model_len) if max_model_len else None,
    )
