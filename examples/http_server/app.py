"""One worker's HTTP/1.1 server: ``POST /generate`` and ``GET /health`` over asyncio streams.

Deliberately small: request line + headers + a ``Content-Length`` body, keep-alive by
default (HTTP/1.1), responses with ``Content-Length`` or, for streams, chunked transfer
carrying Server-Sent Events. No dependency beyond the standard library and tsfront.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
from http import HTTPStatus
from typing import Any

from textproc import StopMatcher

from tsfront import EngineClient, Error, InvalidRequest, StreamError
from tsfront.errors import Busy, ClientClosed, EngineUnavailable
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 4 * 1024 * 1024
IDLE_TIMEOUT_S = 75.0
DEFAULT_MAX_TOKENS = 16
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "min_new_tokens")


class HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


class Request:
    __slots__ = ("body", "headers", "method", "path", "version")

    def __init__(self, method: str, path: str, version: str, headers: dict, body: bytes):
        self.method = method
        self.path = path
        self.version = version
        self.headers = headers
        self.body = body

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection, or None at a clean end of stream."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HTTPError(400, "truncated request head") from None
    except asyncio.LimitOverrunError:
        raise HTTPError(431, "request head too large") from None
    except TimeoutError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, version = lines[0].split(" ")
    except ValueError:
        raise HTTPError(400, f"bad request line {lines[0]!r}") from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HTTPError(505, f"{version} is not supported")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HTTPError(400, f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HTTPError(411, "chunked request bodies are not supported; send Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise HTTPError(400, "bad Content-Length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise HTTPError(413, f"body larger than {MAX_BODY_BYTES} bytes")
    body = await reader.readexactly(length) if length else b""
    return Request(method, path.split("?", 1)[0], version, headers, body)


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    phrase = HTTPStatus(status).phrase
    lines = [f"HTTP/1.1 {status} {phrase}", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Worker:
    """The HTTP side of one worker process (its `EngineClient` is shared by all connections)."""

    def __init__(self, index: int, client: EngineClient, tokenizer: Any) -> None:
        self.index = index
        self.client = client
        self.tokenizer = tokenizer
        self._rids = itertools.count()
        self._rid_prefix = f"http-w{index}-{os.getpid()}-{secrets.token_hex(3)}"
        self.connections: set[asyncio.Task] = set()

    # -- connection loop ----------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.connections.add(task)
        try:
            while True:
                try:
                    request = await read_request(reader)
                except HTTPError as exc:
                    await self._send_json(writer, exc.status, {"error": str(exc)}, False)
                    return
                if request is None:
                    return
                keep = await self._dispatch(request, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; any open stream was aborted on the way out
        finally:
            self.connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def _dispatch(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        keep = request.keep_alive
        if request.path == "/generate":
            if request.method != "POST":
                await self._send_json(writer, 405, {"error": "use POST /generate"}, keep)
                return keep
            return await self.generate(request, writer, keep)
        if request.path == "/health":
            if request.method != "GET":
                await self._send_json(writer, 405, {"error": "use GET /health"}, keep)
                return keep
            return await self.health(writer, keep)
        await self._send_json(writer, 404, {"error": f"no route {request.path}"}, keep)
        return keep

    async def _send_json(self, writer, status: int, obj: dict, keep: bool, extra=()) -> None:
        body = json.dumps(obj).encode()
        headers = [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "keep-alive" if keep else "close"),
            ("X-Worker", str(self.index)),
            *extra,
        ]
        writer.write(_head(status, headers) + body)
        await writer.drain()

    # -- routes -------------------------------------------------------------------------------

    async def health(self, writer, keep: bool) -> bool:
        try:
            loads = [
                {"rank": ld.rank, "index": ld.index, "state": ld.state, "in_flight": ld.in_flight}
                for ld in self.client.load()
            ]
        except ClientClosed as exc:
            await self._send_json(writer, 503, {"error": str(exc)}, keep)
            return keep
        ok = any(ld["state"] == "live" for ld in loads)
        payload = {"ok": ok, "worker": self.index, "pid": os.getpid(), "engines": loads}
        await self._send_json(writer, 200 if ok else 503, payload, keep)
        return keep

    def _parse(self, request: Request) -> tuple[dict, list[str]]:
        try:
            body = json.loads(request.body or b"null")
        except ValueError:
            raise HTTPError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, 'send a JSON object: {"prompt": "...", "max_tokens": 16}')
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise HTTPError(400, "'prompt' must be a non-empty string")
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise HTTPError(400, "'stop' must be a string or a list of strings")
        max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise HTTPError(400, "'max_tokens' must be a positive integer")
        if not isinstance(body.get("stream", False), bool):
            raise HTTPError(400, "'stream' must be true or false")
        return body, stops

    async def generate(self, request: Request, writer, keep: bool) -> bool:
        try:
            body, stops = self._parse(request)
        except HTTPError as exc:
            await self._send_json(writer, exc.status, {"error": str(exc)}, keep)
            return keep
        rid = f"{self._rid_prefix}-{next(self._rids)}"
        sampling = {k: body[k] for k in SAMPLING_KEYS if k in body}
        try:
            input_ids = self.tokenizer.encode(body["prompt"])
            stream = await self.client.generate(
                TokenizedGenerateReqInput(
                    rid=rid,
                    input_ids=input_ids,
                    stream=True,
                    sampling_params=SamplingParams(max_new_tokens=body["max_tokens"], **sampling),
                )
            )
        except (InvalidRequest, TypeError) as exc:
            await self._send_json(writer, 400, {"error": str(exc)}, keep)
            return keep
        except (Busy, EngineUnavailable, ClientClosed) as exc:
            await self._send_json(writer, 503, {"error": str(exc)}, keep, [("Retry-After", "1")])
            return keep
        async with stream:  # leaving early (stop string, disconnect) aborts the request
            if body.get("stream", False):
                return await self._stream(stream, rid, stops, writer, keep, len(input_ids))
            return await self._whole(stream, rid, stops, writer, keep, len(input_ids))

    async def _events(self, stream, stops: list[str], prompt_tokens: int):
        """Yield ``("text", str)`` deltas, then one ``("end", info)`` (finish, usage, error)."""
        detok = self.tokenizer.detokenizer()
        matcher = StopMatcher(stops)
        info: dict[str, Any] = {
            "finish_reason": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0},
        }
        try:
            async for chunk in stream:
                info["usage"]["completion_tokens"] = chunk.completion_tokens
                info["engine_index"] = chunk.engine_index
                text, stop = matcher.feed(detok.feed(chunk.output_ids))
                if chunk.finished and stop is None:
                    more, stop = matcher.feed(detok.flush())
                    text += more
                    if stop is None:
                        text += matcher.flush()
                if text:
                    yield "text", text
                if stop is not None:
                    stream.abort()  # the engine stops decoding now; we trim, it never sees text
                    info["finish_reason"] = "stop"
                    info["matched_stop"] = stop
                    break
                if chunk.finished:
                    info["finish_reason"] = chunk.finish_reason
        except StreamError as exc:
            info["finish_reason"] = "error"
            info["error"] = f"{type(exc).__name__}: {exc}"
        except Error as exc:
            info["finish_reason"] = "error"
            info["error"] = str(exc)
        yield "end", info

    async def _stream(self, stream, rid, stops, writer, keep: bool, prompt_tokens: int) -> bool:
        headers = [
            ("Content-Type", "text/event-stream"),
            ("Cache-Control", "no-cache"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "keep-alive" if keep else "close"),
            ("X-Request-Id", rid),
            ("X-Worker", str(self.index)),
        ]
        writer.write(_head(200, headers))
        await writer.drain()
        async for kind, value in self._events(stream, stops, prompt_tokens):
            event = {"text": value} if kind == "text" else {"text": "", "id": rid, **value}
            data = f"data: {json.dumps(event)}\n\n"
            if kind == "end":
                data += "data: [DONE]\n\n"
            payload = data.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            await writer.drain()  # back-pressure; raises if the client is gone
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return keep

    async def _whole(self, stream, rid, stops, writer, keep: bool, prompt_tokens: int) -> bool:
        parts: list[str] = []
        info: dict[str, Any] = {}
        async for kind, value in self._events(stream, stops, prompt_tokens):
            if kind == "text":
                parts.append(value)
            else:
                info = value
        status = 502 if info.get("finish_reason") == "error" else 200
        payload = {"id": rid, "text": "".join(parts), "worker": self.index, **info}
        await self._send_json(writer, status, payload, keep, [("X-Request-Id", rid)])
        return keep
