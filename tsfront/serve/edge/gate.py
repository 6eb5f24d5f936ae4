"""The HTTP edge of one request: API keys, request ids, CORS, the access-log line.

`Gate.open` looks at a request's scope once, before it is routed, and returns its `Exchange`: the
request's id (the client's ``X-Request-Id`` if it is well formed, else a 400; a fresh one from
`secrets` when there is none, `tsfront.ids.request_id`), the headers every response of it carries
(``x-request-id``, CORS), a refusal if it gets one (401 without a valid key, ``Authorization: Bearer
KEY`` or Anthropic's ``X-Api-Key: KEY``, on any route but `OPEN_ROUTES`, an answered CORS preflight,
a bad request id) and the `RequestRecord` the service fills, with the request's owner: the handle of
the key it came with (`owner_of`), under which the responses store files what the request stores and
looks up what it names. The ASGI app sends the response through `Exchange.head` and calls
`Exchange.close` at the end, which writes the access-log line. Nothing here runs per token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront import ids
from tsfront.serve.core.record import RequestRecord
from tsfront.serve.core.reply import ApiError, Reply

if TYPE_CHECKING:
    from tsfront.serve.edge.settings import EdgeSettings

__all__ = ["MAX_REQUEST_ID", "OPEN_ROUTES", "Exchange", "Gate", "owner_of"]

access_log = logging.getLogger("tsfront.serve.access")

#: The routes a server with API keys answers without one: probes send none. ``/metrics`` is
#: open too unless ``--protect-metrics``; every other path needs a key.
OPEN_ROUTES = frozenset({"/health", "/liveness", "/readiness"})
#: Longest ``X-Request-Id`` taken from a client (characters of `_REQUEST_ID`).
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,%d}" % MAX_REQUEST_ID)
#: Status logged for a request whose client left before its response was complete (nginx's).
CLIENT_GONE = 499
_JSON = msgspec.json.Encoder()
_PREFLIGHT_METHODS = b"GET, POST, OPTIONS"
_PREFLIGHT_HEADERS = (
    b"Authorization, Content-Type, X-Request-Id, X-Api-Key, Anthropic-Version, Anthropic-Beta"
)
_PREFLIGHT_MAX_AGE = b"600"


def _unauthorized(message: str) -> Reply:
    # OpenAI's answer to a missing or wrong key (the openai client raises AuthenticationError;
    # on Anthropic's paths the routing renders it as authentication_error).
    reply = ApiError(401, message, code="invalid_api_key").reply()
    reply.headers = [*reply.headers, (b"www-authenticate", b"Bearer")]
    return reply


def owner_of(key: bytes) -> str:
    """The owner handle of an API key: a digest, the same in every worker (their requests share
    one store), from which the key cannot be read back (the store never holds a key)."""
    return hashlib.sha256(b"tsfront.serve.owner\0" + key).hexdigest()[:32]


_NO_KEY = (
    "You didn't provide an API key: send it in an Authorization header using Bearer auth "
    "(Authorization: Bearer KEY), or as Anthropic's clients do (X-Api-Key: KEY); the server's "
    "keys are its --api-key / TSFRONT_API_KEY"
)
_BAD_KEY = "Incorrect API key provided; use one of the server's --api-key / TSFRONT_API_KEY keys"


class Exchange:
    """One request at the edge: its id, record, response headers, refusal and outcome."""

    __slots__ = ("_gate", "headers", "method", "path", "record", "refusal", "sent", "status")

    def __init__(self, gate: Gate, method: str, path: str, request_id: str) -> None:
        self._gate = gate
        self.method = method
        self.path = path
        self.record = RequestRecord(request_id)
        #: Headers added to every response of the request.
        self.headers: list[tuple[bytes, bytes]] = [(b"x-request-id", request_id.encode())]
        #: The reply the edge answers with instead of routing the request, or None.
        self.refusal: Reply | None = None
        #: The status sent (`CLIENT_GONE` if the client left first); None before the response.
        self.status: int | None = None
        #: The status of the response start, kept whatever happens after (None: none sent).
        self.sent: int | None = None

    def head(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b""
    ) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """A response's headers with the edge's, and its body (an error object gets the
        request id as ``error.request_id``)."""
        self.status = self.sent = status
        if status >= 400 and body.startswith(b'{"error":'):
            try:
                obj = msgspec.json.decode(body)
                obj["error"]["request_id"] = self.record.request_id
                body = _JSON.encode(obj)
            except (msgspec.DecodeError, TypeError, KeyError):
                pass
        elif status >= 400 and body.startswith(b'{"type":"error"'):
            try:  # Anthropic's shape: the request id beside the error, as Anthropic's API
                obj = msgspec.json.decode(body)
                obj["request_id"] = self.record.request_id
                body = _JSON.encode(obj)
            except (msgspec.DecodeError, TypeError):
                pass
        return [*headers, *self.headers], body

    def client_gone(self) -> None:
        """The client left before the response was complete."""
        self.status = CLIENT_GONE

    def close(self) -> None:
        """The request is over: write its access-log line (with ``--access-log``)."""
        if self._gate.access_log:
            self._gate.log_line(self)


class Gate:
    """One worker's edge rules (from `tsfront.serve.edge.settings.EdgeSettings`)."""

    def __init__(self, settings: EdgeSettings) -> None:
        self._keys = [k.encode() for k in settings.api_keys]
        self._owners = [owner_of(k) for k in self._keys]
        # An allow-list, not a prefix: the key guards every route but these, whatever its
        # path (vLLM's /tokenize beside /v1/tokenize, a route added later, a 404).
        self._open = OPEN_ROUTES if settings.protect_metrics else OPEN_ROUTES | {"/metrics"}
        origins = settings.allowed_origins
        self._any_origin = "*" in origins
        self._origins = {o.encode() for o in origins if o != "*"}
        self._cors = bool(origins)
        self.access_log = settings.access_log
        self._json_log = settings.log_format == "json"

    # ------------------------------------------------------------------ per request

    def open(self, scope: dict[str, Any]) -> Exchange:
        """The `Exchange` of a request (with its refusal, if the edge refuses it)."""
        auth = api_key = given = origin = preflight = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"x-api-key":
                api_key = value
            elif name == b"x-request-id":
                given = value
            elif name == b"origin":
                origin = value
            elif name == b"access-control-request-method":
                preflight = value
        method, path = scope["method"], scope["path"]
        bad_id = given is not None and _REQUEST_ID.fullmatch(given) is None
        request_id = (
            given.decode() if given is not None and not bad_id else ids.request_id()
        )  # a bad one is answered under a fresh id
        ex = Exchange(self, method, path, request_id)
        cors = self._cors_headers(origin) if origin is not None and self._cors else None
        if cors:
            ex.headers.extend(cors)
        if method == "OPTIONS" and preflight is not None and self._cors:
            ex.refusal = self._preflight(cors)
        elif bad_id:
            ex.refusal = ApiError(
                400,
                f"X-Request-Id must be 1 to {MAX_REQUEST_ID} characters of A-Z a-z 0-9 . _ : - "
                "(or left out, and the server makes one)",
                param="x-request-id",
            ).reply()
        elif self._keys and path not in self._open:
            owner = self._owner(auth)
            if owner is None and api_key is not None:
                owner = self._owner_of(api_key.strip())
            if owner is None:
                given_key = auth is not None or api_key is not None
                ex.refusal = _unauthorized(_BAD_KEY if given_key else _NO_KEY)
            else:
                ex.record.owner = owner
        return ex

    def _owner(self, auth: bytes | None) -> str | None:
        """The owner handle of the key in ``auth`` (None: no key, or not one of ours)."""
        if auth is None:
            return None
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() != b"bearer":
            return None
        return self._owner_of(token.strip())

    def _owner_of(self, token: bytes) -> str | None:
        """The owner handle of the key ``token`` (None: not one of ours)."""
        owner = None
        for key, handle in zip(self._keys, self._owners, strict=True):
            if hmac.compare_digest(token, key):  # every key compared, each in constant time
                owner = handle
        return owner

    def _cors_headers(self, origin: bytes) -> list[tuple[bytes, bytes]] | None:
        if self._any_origin:
            return [
                (b"access-control-allow-origin", b"*"),
                (b"access-control-expose-headers", b"x-request-id"),
            ]
        if origin in self._origins:
            return [
                (b"access-control-allow-origin", origin),
                (b"vary", b"origin"),
                (b"access-control-expose-headers", b"x-request-id"),
            ]
        return None

    @staticmethod
    def _preflight(cors: list[tuple[bytes, bytes]] | None) -> Reply:
        if cors is None:
            return ApiError(
                403, "this origin is not allowed (--allowed-origins)", kind="permission_error"
            ).reply()
        return Reply(
            204,
            b"",
            [
                (b"access-control-allow-methods", _PREFLIGHT_METHODS),
                (b"access-control-allow-headers", _PREFLIGHT_HEADERS),
                (b"access-control-max-age", _PREFLIGHT_MAX_AGE),
            ],
        )

    # ------------------------------------------------------------------ access log

    def log_line(self, ex: Exchange) -> None:
        """Write ``ex``'s access-log line (at the end of the request)."""
        record = ex.record
        now = time.monotonic()
        prompt = completion = None
        finish = None
        if record.summary is not None:
            prompt, completion, finish = record.summary()
        ttft = record.first_output - record.started if record.first_output is not None else None
        duration = now - record.started
        if self._json_log:
            line = _JSON.encode(
                {
                    "time": time.time(),
                    "request_id": record.request_id,
                    "method": ex.method,
                    "route": ex.path,
                    "status": ex.status,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "ttft_s": None if ttft is None else round(ttft, 6),
                    "duration_s": round(duration, 6),
                    "finish_reason": finish,
                }
            ).decode()
        else:
            line = (
                f"{record.request_id} {ex.method} {ex.path} {ex.status} "
                f"prompt_tokens={_dash(prompt)} completion_tokens={_dash(completion)} "
                f"ttft={'-' if ttft is None else f'{ttft:.4f}'} duration={duration:.4f} "
                f"finish={_dash(finish)}"
            )
        access_log.info(line)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)
