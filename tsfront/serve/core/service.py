"""The core of one worker: a request planned and run, whatever dialect it came in,
independent of the HTTP stack.

`Service` turns a request into a `Plan` (prompts as token ids, sampling, one engine grammar,
a parser per choice) and runs it as engine requests on its worker's `EngineClient`; their
output goes to the dialect's response shape (`tsfront.serve.core.shape.Format`), and the
answer is a `Reply` (status, JSON body, headers) or, streamed, an `SSEReply` whose body is an
async iterator of ready-to-send events (`tsfront.serve.core.reply`). An HTTP adapter
(`tsfront.serve.edge.asgi`) only moves those bytes. Every dialect plans through it: OpenAI's
chat completions and completions (`plan_chat`, `plan_completion`,
`tsfront.serve.openai.completions`); ``/v1/responses`` and Anthropic's Messages as chat
requests (`chat_request`); the tokenize routes through its steps (`encoded`, `rendered_ids`).

Per streamed chunk the work is: the detokenizer's step, the stop matcher's feed (only when
the request has stop strings), one ``msgspec.json.encode`` of the new text, and one bytes
concatenation with the request's pre-encoded prefix and suffix. A chunk may carry several
tokens when the worker fell behind (the stream coalesces them; nothing is dropped).

A stop string that matches aborts the engine request (``stream.abort()``); a cancelled
handler (the client went away) aborts it too, because cancelling a stream's read does.

Before any work for a request, its fields, counts and lengths are checked against the bounds
of `tsfront.serve.core.limits` and one context limit (the smallest of the engines', the model's and
``--max-model-len``; a refusal names the one that applied);
large work is then done on a thread, sized by the work (`tsfront.serve.core.offload`: a long text
tokenized, a long conversation rendered, a long token list detokenized), so that no request
holds the event loop its worker's other streams run on. The stop
strings are compiled once per request (`tsfront.text.StopSet`) for all of its choices.

A chat request's tools (`tsfront.serve.core.tooling`) and the server's reasoning parser give each
choice an `tsfront.serve.core.parsing.OutputParser`: its chunks' text becomes reasoning, content
and tool-call deltas (the task path, never the push path); ``response_format``,
``structured_outputs`` and a constrained ``tool_choice`` become one engine grammar
(`tsfront.serve.core.structured`). An engine abort after the output began ends the response with
an error (502), never with ``finish_reason: "abort"``. The parse step (the parsers and the
response shape of what they give) runs inside one boundary: whatever it raises on a model's
output ends the response with a 502 error (streamed: an error event, then the stream's end),
and the engine request is aborted (`_unparseable`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import msgspec

from tsfront.client.engine_client import EngineClient
from tsfront.client.stream import OutputChunk
from tsfront.errors import (
    Busy,
    ClientClosed,
    DeadlineExceeded,
    EngineUnavailable,
    Error,
    InvalidRequest,
    StreamError,
)
from tsfront.serve.core.chatsettings import ChatSettings
from tsfront.serve.core.choice import ABORT, Choice
from tsfront.serve.core.limits import (
    INT64_MAX,
    INT64_MIN,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    Refused,
    check_template_kwargs,
    decoded,
)
from tsfront.serve.core.offload import OFFLOAD_CHARS, Offload
from tsfront.serve.core.push import ParsedPusher, Pusher
from tsfront.serve.core.reply import ApiError, Final, Reply, Send, SSEReply
from tsfront.serve.core.schema import ChatRequest, CompletionRequest
from tsfront.serve.core.seal import Seal, secret_from_env
from tsfront.serve.core.shape import Format
from tsfront.serve.core.structured import Constraint, constraint, guided_fields
from tsfront.serve.core.tooling import history_message, tool_plan
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

if TYPE_CHECKING:
    from tsfront.serve.core.parsing import OutputParser
    from tsfront.serve.core.record import RequestRecord, Summary
    from tsfront.text.stop import StopSet

__all__ = ["MAX_CHOICES", "Plan", "Service"]

log = logging.getLogger("tsfront.serve")

#: Most completions one request may fan out to (prompts x n); each takes a worker slot.
MAX_CHOICES = 64
#: ``max_tokens`` when a completions request gives none (OpenAI's default).
DEFAULT_COMPLETION_TOKENS = 16
#: The engine keeps two positions of its context for every request (as validate_request).
_CONTEXT_RESERVE = 2
#: ``logit_bias`` values, as OpenAI documents them.
_BIAS_LIMIT = 100.0
#: Messages a chat request may have when no context length is known.
_MAX_MESSAGES = 65536

_JSON = msgspec.json.Encoder()
# OpenAI sampling fields passed to the engine's SamplingParams under the same name.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)

#: The streamed hot path (tsfront/serve/core/push.py); ``TSFRONT_SERVE_PUSH=0`` turns it off, to
#: measure what it saves (``tsfront bench serve --stacks pull``) or to rule it out.
_PUSH = os.environ.get("TSFRONT_SERVE_PUSH", "1") != "0"
# The API's names for the engine fields a refusal names (others pass through as they are).
_PARAMS = {
    "sampling_params.max_new_tokens": "max_tokens",
    "sampling_params.min_new_tokens": "min_tokens",
    "input_ids": "prompt",
    **{
        f"sampling_params.{name}": name
        for name in (
            *_SAMPLING_FIELDS,
            "stop_token_ids",
            "logit_bias",
        )
    },
}


def _summary(fmt: Format, choices: list[Choice]) -> Summary:
    """A response's ``(prompt_tokens, completion_tokens, finish_reason)`` for its log line."""
    prompt, completion = fmt.counts(choices)
    reasons = sorted({ch.finish or "none" for ch in choices})
    return prompt, completion, ",".join(reasons)


def _ending(plan: Plan, fmt: Format, ch: Choice, last: bytes | None) -> Final:
    # A whole one-choice stream's end: its last event, the usage and [DONE] in one write,
    # with the end of the body.
    ending = [last] if last else []
    if plan.include_usage:
        ending.append(fmt.usage_event([ch]))
    ending.append(fmt.done)
    return Final(b"".join(ending))


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _unavailable(message: str) -> ApiError:
    return ApiError(503, message, kind="service_unavailable_error")


def _stream_failed(exc: StreamError) -> ApiError:
    """A stream that ended with an error before the response began: 504 for the server's
    request timeout (``--request-timeout``), else 503 (an engine died, ...)."""
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, str(exc), kind="timeout_error")
    return _unavailable(str(exc))


def _aborted(ch: Choice) -> ApiError:
    """A request the engine aborted after it began (NaN logits, a failed KV transfer, ...):
    502, the engine failed; the wire carries no reason (CONTRACT §3.3)."""
    return ApiError(
        502,
        f"the engine aborted the request after {ch.tokens} tokens (the engine's log says why); "
        "retry it",
        kind="server_error",
    )


def _unparseable(exc: Exception) -> ApiError:
    """The parse step's boundary: the server could not turn the model's output into a
    response (a parser, or the response shape, raised on it). 502, as for an engine that
    answered garbage: not the client's fault, and a retry may be answered differently. The
    traceback goes to the server's log (a bug to report)."""
    log.error("the model's output could not be parsed into a response", exc_info=exc)
    return ApiError(
        502,
        f"the server could not parse the model's output into a response "
        f"({type(exc).__name__}; the server's log has the details); retry it",
        kind="server_error",
    )


def _abort_event(fmt: Format, ch: Choice) -> bytes:
    """The error event that ends a stream the engine aborted (never ``finish_reason:
    "abort"``, which OpenAI does not have)."""
    err = _aborted(ch)
    return fmt.error_event(err, err.status, err.kind)


def _refusal(exc: Error) -> ApiError:
    """tsfront's refusals of ``generate`` as API errors (their messages passed through)."""
    if isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc), param=_PARAMS.get(exc.field, exc.field))
    if isinstance(exc, (Busy, EngineUnavailable, ClientClosed)):
        return _unavailable(str(exc))
    return ApiError(500, str(exc), kind="server_error")


class Plan:
    """What one API request asks for: prompts (token ids), sampling, and output options."""

    __slots__ = (
        "chat",
        "chat_max",
        "constraint",
        "include_stop",
        "include_usage",
        "keep",
        "logprobs",
        "max_tokens",
        "n",
        "parse",
        "prompts",
        "sampling",
        "skip_special",
        "stop",
        "stream",
    )

    # Set by plan_completion / plan_chat (and _sampling) before the plan is used.
    chat: bool
    chat_max: bool  # max_completion_tokens given (the name a length refusal uses)
    constraint: Constraint | None  # the engine grammar (response_format, tools, ...)
    parse: Callable[[], OutputParser] | None  # a fresh parser per choice (tools, reasoning)
    include_stop: bool
    include_usage: bool
    keep: frozenset[int]  # special tokens decoded though skipped: the parsers' markers
    logprobs: bool
    max_tokens: int | None
    n: int
    prompts: list[list[int]]
    sampling: dict[str, Any]
    skip_special: bool
    stop: StopSet | None
    stream: bool


class Service:
    """One worker's requests planned and run over its `EngineClient` and a
    `tsfront.text.TextModel` (the dialects' routes are over it).

    Args:
        client: the worker's attached client.
        text: the model's `TextModel` (tokenizer, chat template, stop ids).
        model_name: the name ``/v1/models`` lists and requests may give as ``model``.
        worker: this worker's number (in request ids and the ``x-worker`` header).
        request_timeout: every request's deadline in seconds (``None``: none): past it the
            engine request is aborted and the response ends with a timeout error (504).
        chat_template: a template for every chat request instead of the model's
            (``--chat-template``).
        template_kwargs: template variables for every chat request; a request's
            ``chat_template_kwargs`` override them key by key (``--default-chat-template-kwargs``).
        chat: the chat output's parsers (``--tool-call-parser``, ``--reasoning-parser``);
            `ChatSettings` ``()``: none.
        max_model_len: the server's own context limit (``--max-model-len``): the context is
            the smallest of it, the engines' and the model folder's.
        reasoning_key: the secret of the seal on reasoning handed to clients (`seal`; the
            master's, shared by every worker); None: ``TSFRONT_REASONING_KEY``, else a fresh one.
        encode_cache: the region of the server's shared encode cache (a formatted buffer:
            `tsfront.text.encode_cache`); ``None``: a store of this process's own; ``False``:
            none (``--encode-cache-mb 0``).
    """

    def __init__(
        self,
        client: EngineClient,
        text: Any,
        model_name: str,
        worker: int = 0,
        request_timeout: float | None = None,
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        chat: ChatSettings | None = None,
        max_model_len: int | None = None,
        reasoning_key: bytes | None = None,
        encode_cache: Any = None,
    ) -> None:
        self.client = client
        #: Seals the reasoning a dialect hands a client to send back (`tsfront.serve.core.seal`).
        self.seal = Seal(reasoning_key if reasoning_key is not None else secret_from_env())
        self.max_model_len = max_model_len
        # The server's own bound of the context: the model folder's and --max-model-len's.
        own = [n for n in (getattr(text, "max_model_len", None), max_model_len) if n]
        self._own_context: int | None = min(own, default=None)
        self.chat_settings = chat or ChatSettings()
        if self.chat_settings.harmony:
            from tsfront.text.harmony import load_encoding

            load_encoding(text)  # at start, not in a first request (the master checked it)
        self.request_timeout = request_timeout
        self.text = text
        self.model_name = model_name
        self.worker = worker
        self._ids = itertools.count()
        self._prefix = f"w{worker}-{os.getpid()}-{secrets.token_hex(4)}"
        self._stop_ids = list(getattr(text, "stop_token_ids", None) or [])
        self.vocab: int = text.vocab_size
        self.token_chars: int = max(1, text.max_token_chars)
        self._template_names: frozenset[str] = text.template_names
        self._offload = Offload()  # large work on a thread, sized by the work
        self.off_loop = self._offload.run
        self._chat_template = chat_template
        self._template_kwargs = dict(template_kwargs or {})
        # Rendered into every chat prompt: part of every render's size.
        self.defaults_chars = len(_JSON.encode(self._template_kwargs)) if template_kwargs else 0
        #: When this worker's service began (the model card's ``created``).
        self.created = int(time.time())
        self._markers: tuple[frozenset[int], tuple[str, ...]] | None = None  # `_marker_ids`
        self.encode_cache_off = self._use_encode_cache(encode_cache)
        """Why chat prompts are encoded whole (``""``: through the encode cache)."""

    def _use_encode_cache(self, region: Any) -> str:
        use = getattr(self.text, "use_encode_cache", None)
        if use is None or region is False:
            return "off"
        from tsfront import _native
        from tsfront.text.encode_cache import private_cache

        cache = private_cache() if region is None else _native.EncodeCache(region)
        return use(cache, [self._chat_template] if self._chat_template else [])

    # ------------------------------------------------------------------ plain routes

    def health(self, extra: dict[str, Any] | None = None) -> Reply:
        """``GET /health``: 200 while at least one engine is live (``"live"``: a stalled or
        dead rank does not count), else 503 (``extra``: more fields of the body, e.g. the
        server's worker restarts)."""
        if self.client.closed:
            return _unavailable("the I/O process is gone").reply()
        engines = [
            {"rank": e.rank, "index": e.index, "state": e.state, "in_flight": e.in_flight}
            for e in self.client.load()
        ]
        live = any(e["state"] == "live" for e in engines)
        body = {"ok": live, "worker": self.worker, "engines": engines, **(extra or {})}
        if not live:
            return Reply(503, _JSON.encode(body), ApiError(503, "").reply().headers)
        return Reply(200, _JSON.encode(body))

    def context_limit(self) -> int | None:
        """The context: the smallest of the engines' (kept by the client per registration) and
        the server's own (the model folder's, ``--max-model-len``); None: none known."""
        limit = self.client.context_limit
        own = self._own_context
        if own and (limit is None or own < limit):
            return own
        return limit

    def context(self, limit: int) -> str:
        """The context limit ``limit`` and which of the three it is, for a refusal (the
        server's flag first: where two agree, it is the one an operator set)."""
        if limit == self.max_model_len:
            source = "--max-model-len"
        elif limit == self.client.context_limit:
            source = "the engines' max_model_len, or their KV cache if smaller"
        else:
            source = "the model's config.json"
        return f"this server's context is {limit} tokens ({source}; GET /v1/models max_model_len)"

    # ------------------------------------------------------------------ generation routes

    async def chat_request(
        self,
        req: ChatRequest,
        size: int,
        format_of: Callable[[Plan], Format],
        record: RequestRecord | None = None,
    ) -> Reply | SSEReply:
        """A decoded chat request run as chat completions run it (``size``: at least the
        characters of text it brings, the bytes of the body it came from plus any conversation
        loaded for it, `tsfront.serve.core.offload.text_chars`: its render's size), its output
        in the shape ``format_of(plan)`` makes; every choice's text is parsed (`OutputParser`:
        reasoning and tools when asked, else all content), so the format sees `Format.pieces`
        and the parser's ``message()``. For the dialects over the chat path (``/v1/responses``,
        ``/v1/messages``); refusals raise `ApiError` or `Refused`."""
        plan = await self.plan_chat(req, size)
        if plan.parse is None:
            from tsfront.serve.core.parsing import OutputParser

            plan.parse = lambda: OutputParser(None, None)
        return await self._run(plan, format_of(plan), record)

    async def prompt_ids(self, req: ChatRequest, size: int) -> list[int]:
        """The token ids of ``req``'s prompt as `plan_chat` renders it (its tools rendered,
        none required of the output; ``size`` as for `chat_request`): a count of input tokens
        without a generation. Refusals raise `ApiError` or `Refused`."""
        self.check_model(req.model)
        if not req.messages:
            raise _bad("messages must not be empty", "messages")
        limit = self.context_limit()
        tools = tool_plan(req.tools, "none" if req.tools else None, True, None)
        kwargs = self.template_kwargs_of(req.chat_template_kwargs)
        messages = self.messages_of(req.messages, limit)
        rendered = tools.tools if tools is not None else None
        add = req.add_generation_prompt
        ids: list[int] = await self.off_loop(
            size + self.defaults_chars, self.rendered_ids, messages, add, kwargs, rendered
        )
        return ids

    def encoded(self, text: str, special: bool) -> list[int]:
        """``text``'s token ids (with the special tokens if ``special``)."""
        # encode_batch releases the GIL (a thread's encode does not stall the loop).
        if len(text) <= OFFLOAD_CHARS:
            return self.text.encode(text, add_special_tokens=special)
        return self.text.encode_batch([text], add_special_tokens=special)[0]

    def rendered_ids(
        self,
        messages: list[dict[str, Any]],
        add: bool,
        kwargs: dict[str, Any],
        tools: list[dict[str, Any]] | None,
    ) -> list[int]:
        """The token ids of messages rendered as chat renders them (`render_and_encode`; for
        gpt-oss, Harmony's render at the server's reasoning effort)."""
        if self.chat_settings.harmony:
            return self._render_harmony(messages, tools, self._default_effort())
        return self.render_and_encode(messages, add, kwargs, tools)[1]

    def _default_effort(self) -> str:
        from tsfront.text.harmony import reasoning_effort

        return reasoning_effort(self.chat_settings.reasoning_effort, "--reasoning-effort")

    async def generate(
        self,
        body: bytes,
        decoder: msgspec.json.Decoder,
        plan_of: Callable[[Any, int], Coroutine[Any, Any, Plan]],
        format_of: Callable[[Plan], Format],
        record: RequestRecord | None = None,
    ) -> Reply | SSEReply:
        """Body → typed request (``decoder``) → plan (``plan_of``: `plan_chat`,
        `plan_completion`) → engine requests → the reply in ``format_of(plan)``'s shape;
        refusals as OpenAI error replies."""
        try:
            plan = await plan_of(decoded(decoder, body), len(body))
            return await self._run(plan, format_of(plan), record)
        except Refused as exc:
            return _bad(str(exc), exc.param).reply()
        except ApiError as exc:
            return exc.reply()

    # ------------------------------------------------------------------ request → plan
    #
    # Cheap checks first (fields, counts, lengths against the context), then the expensive
    # steps (template, tokenizer, stop strings), on a thread when their input is large, then
    # the checks that need the token counts.

    def check_model(self, model: str | None) -> None:
        """Refuse (404) a request for a model this server does not serve."""
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r} "
                "(GET /v1/models)",
                param="model",
            )

    def _check_request(self, req: CompletionRequest | ChatRequest, prompts: int) -> None:
        self.check_model(req.model)
        if req.best_of not in (None, 1):
            raise _bad("best_of is not supported; use n", "best_of")
        if not 1 <= req.n <= MAX_CHOICES:
            raise _bad(f"n={req.n}: must be between 1 and {MAX_CHOICES}", "n")
        total = prompts * req.n
        if total > MAX_CHOICES:
            raise _bad(
                f"prompts x n = {total}: at most {MAX_CHOICES} completions per request",
                "n" if prompts == 1 else "prompt",
            )
        slots = self.client.slots
        if total > slots:
            # Never servable: a 503 would invite retries that cannot succeed.
            raise _bad(
                f"prompts x n = {total}: a worker of this server has {slots} slots, so at most "
                f"{slots} completions can run for one request (tsfront serve --slots-per-worker)",
                "n",
            )
        stop = req.stop
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None:
            if len(stop) > MAX_STOP_STRINGS:
                raise _bad(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}", "stop")
            if any(not s for s in stop):
                raise _bad("stop strings must not be empty", "stop")
            longest = max(len(s) for s in stop)
            if longest > MAX_STOP_CHARS:
                raise _bad(
                    f"a stop string of {longest} characters: at most {MAX_STOP_CHARS} each",
                    "stop",
                )
        if req.temperature is not None and req.temperature < 0:
            raise _bad(f"temperature={req.temperature}: must be >= 0 (0 is greedy)", "temperature")
        for name in ("seed", "top_k", "min_tokens"):
            value = getattr(req, name)
            if value is not None and not INT64_MIN <= value <= INT64_MAX:
                raise _bad(f"{name}={value}: must fit in a signed 64-bit integer", name)
        if req.seed is not None and req.seed + req.n - 1 > INT64_MAX:
            raise _bad(
                f"seed={req.seed} with n={req.n}: choice k is sampled with seed + k, which "
                f"must stay at most 2**63 - 1 = {INT64_MAX}",
                "seed",
            )
        vocab = self.vocab
        for t in req.stop_token_ids or ():
            if not 0 <= t < vocab:
                raise _bad(
                    f"stop_token_ids holds {t}: token ids of this model are 0..{vocab - 1}",
                    "stop_token_ids",
                )
        for key, bias in (req.logit_bias or {}).items():
            if not (key.isdecimal() and len(key) < 12 and int(key) < vocab):
                raise _bad(
                    f"logit_bias key {key[:32]!r}: keys are token ids of this model, "
                    f'"0".."{vocab - 1}"',
                    "logit_bias",
                )
            if not -_BIAS_LIMIT <= bias <= _BIAS_LIMIT:
                raise _bad(
                    f"logit_bias[{key!r}]={bias}: biases are between -100 and 100", "logit_bias"
                )

    def _sampling(self, req: CompletionRequest | ChatRequest, plan: Plan) -> None:
        """The engine's sampling values and the output options (after the prompts are known)."""
        plan.include_stop = req.include_stop_str_in_output
        plan.skip_special = req.skip_special_tokens
        plan.keep = frozenset()
        plan.stream = req.stream
        plan.include_usage = bool(
            req.stream and req.stream_options and req.stream_options.include_usage
        )
        stop_ids = list(req.stop_token_ids or ())
        if not req.ignore_eos:
            stop_ids.extend(i for i in self._stop_ids if i not in stop_ids)
        values: dict[str, Any] = {
            "max_new_tokens": plan.max_tokens,
            "stop_token_ids": stop_ids or None,
            "ignore_eos": req.ignore_eos,
            "skip_special_tokens": req.skip_special_tokens,
        }
        for name in _SAMPLING_FIELDS:
            value = getattr(req, name)
            if value is not None:
                values[name] = value
        if req.min_tokens is not None:
            values["min_new_tokens"] = req.min_tokens
        if req.logit_bias:
            values["logit_bias"] = req.logit_bias
        plan.sampling = values

    async def _stops(self, req: CompletionRequest | ChatRequest, plan: Plan) -> None:
        # Awaited only when there are stop strings (no coroutine per request without).
        stop = [req.stop] if isinstance(req.stop, str) else req.stop
        if not stop:
            plan.stop = None
            return
        from tsfront.text import StopSet

        # Compiled once for every choice of the request (16 x 1,024 characters: ~15 ms).
        plan.stop = await self.off_loop(sum(map(len, stop)) * 4, StopSet, stop)

    @staticmethod
    def _constrain(plan: Plan) -> None:
        """The plan's grammar (if any) into the engine's sampling values."""
        if plan.constraint is not None:
            plan.sampling[plan.constraint.field] = plan.constraint.value

    def _max_tokens(self, value: int | None, name: str) -> int | None:
        if value is not None and value < 1:
            raise _bad(f"{name}={value}: must be at least 1", name)
        return value

    def _fit(self, plan: Plan, limit: int | None, what: str) -> None:
        """Refuse prompts the context cannot hold; fill in chat's default ``max_tokens``."""
        if limit is None:
            return
        room = limit - _CONTEXT_RESERVE
        longest = max(len(ids) for ids in plan.prompts)
        if longest > room:
            raise _bad(
                f"the prompt is {longest} tokens; {self.context(limit)}, so a prompt may have "
                f"at most {room}: shorten it",
                what,
            )
        if plan.max_tokens is None:
            plan.max_tokens = room - longest  # "the rest of the context", within one limit
        elif longest + plan.max_tokens > room:
            raise _bad(
                f"prompt ({longest} tokens) + max_tokens ({plan.max_tokens}) must be at most "
                f"{room} (the context less 2; {self.context(limit)}); send max_tokens <= "
                f"{room - longest}",
                "max_completion_tokens" if what == "messages" and plan.chat_max else "max_tokens",
            )

    async def plan_completion(self, req: CompletionRequest, size: int) -> Plan:
        """A completions request's plan (``size``: the bytes of its body)."""
        plan = Plan()
        plan.chat = False
        plan.chat_max = False
        items = self._completion_items(req.prompt)
        self._check_request(req, len(items))
        if req.echo:
            raise _bad("echo is not supported (prompt logprobs are not on the engine wire)", "echo")
        if req.suffix:
            raise _bad("suffix is not supported (no insertion models)", "suffix")
        if req.logprobs is not None and req.logprobs != 0:
            raise _bad(
                f"logprobs={req.logprobs}: the engine returns only the sampled token's logprob; "
                "send logprobs=0 (or omit it)",
                "logprobs",
            )
        plan.logprobs = req.logprobs == 0
        plan.max_tokens = self._max_tokens(req.max_tokens, "max_tokens") or (
            DEFAULT_COMPLETION_TOKENS
        )
        limit = self.context_limit()
        texts = [item for item in items if isinstance(item, str)]
        chars = sum(map(len, texts))
        for item in items:
            if isinstance(item, str):
                self.check_chars(len(item), limit, "prompt")
            else:
                self._check_ids(item, limit)
        if texts:
            if chars <= OFFLOAD_CHARS:  # on the loop: no coroutine for `off_loop`
                encoded = iter(self._encode_all(texts))
            else:
                encoded = iter(await self.off_loop(chars, self._encode_all, texts))
            plan.prompts = [next(encoded) if isinstance(i, str) else i for i in items]
        else:
            plan.prompts = cast("list[list[int]]", items)  # all token-id lists here
        if any(not ids for ids in plan.prompts):
            raise _bad("the prompt encodes to no tokens; send a non-empty prompt", "prompt")
        plan.n = req.n
        plan.constraint = constraint(
            req.response_format, req.structured_outputs, guided_fields(req)
        )
        plan.parse = None
        self._fit(plan, limit, "prompt")
        if req.stop:
            await self._stops(req, plan)
        else:
            plan.stop = None
        self._sampling(req, plan)
        self._constrain(plan)
        return plan

    @staticmethod
    def _completion_items(prompt: str | list[Any]) -> list[str | list[int]]:
        """The prompts of a completions request, as texts and token-id lists (not encoded)."""
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise _bad("prompt must not be empty", "prompt")
        if all(type(t) is int for t in prompt):
            return [prompt]
        items: list[str | list[int]] = []
        for i, item in enumerate(prompt):
            if isinstance(item, str) or (
                isinstance(item, list) and item and all(type(t) is int for t in item)
            ):
                items.append(item)
            else:
                raise _bad(
                    f"prompt[{i}] must be a string or a non-empty list of token ids", "prompt"
                )
        return items

    def check_chars(self, chars: int, limit: int | None, what: str) -> None:
        """Refuse ``chars`` characters of ``what`` that cannot fit the context ``limit``."""
        # No token stands for more characters than the vocabulary's longest token.
        if limit is not None and chars > limit * self.token_chars:
            raise _bad(
                f"the {what} has {chars} characters: it cannot fit the context (no token here is "
                f"longer than {self.token_chars} characters; {self.context(limit)}); shorten it",
                what,
            )

    def _check_ids(self, ids: list[int], limit: int | None) -> None:
        if limit is not None and len(ids) > limit - _CONTEXT_RESERVE:
            raise _bad(
                f"the prompt is {len(ids)} tokens; {self.context(limit)}, so a prompt may have "
                f"at most {limit - _CONTEXT_RESERVE}: shorten it",
                "prompt",
            )
        top = max(ids)
        if top >= self.vocab:
            raise _bad(
                f"the prompt holds token id {top}: token ids of this model are 0..{self.vocab - 1}",
                "prompt",
            )

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        # encode_batch releases the GIL (a thread's encode does not stall the loop).
        if len(texts) == 1 and len(texts[0]) <= OFFLOAD_CHARS:
            return [self.text.encode(texts[0], add_special_tokens=True)]
        return self.text.encode_batch(texts, add_special_tokens=True)

    async def plan_chat(self, req: ChatRequest, size: int) -> Plan:
        """A chat request's plan (``size``: at least the characters of text it brings)."""
        plan = Plan()
        plan.chat = True
        self._check_request(req, 1)
        if req.top_logprobs:
            raise _bad(
                f"top_logprobs={req.top_logprobs}: the engine returns only the sampled token's "
                "logprob; send top_logprobs=0 (or omit it)",
                "top_logprobs",
            )
        plan.logprobs = req.logprobs
        a = self._max_tokens(req.max_completion_tokens, "max_completion_tokens")
        b = self._max_tokens(req.max_tokens, "max_tokens")
        plan.max_tokens = a if a is not None else b
        plan.chat_max = a is not None
        if not req.messages:
            raise _bad("messages must not be empty", "messages")
        settings = self.chat_settings
        tools = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, settings.tool_parser)
        limit = self.context_limit()
        kwargs = self.template_kwargs_of(req.chat_template_kwargs)
        messages = self.messages_of(req.messages, limit)
        if settings.harmony:  # gpt-oss: Harmony renders the prompt (tsfront.text.harmony)
            effort = self._harmony_checks(req, tools)
            rendered = None if tools is None or tools.mode == "none" else tools.tools
            prompt, ids = (
                "",
                await self.off_loop(size, self._render_harmony, messages, rendered, effort),
            )
        else:
            # Sized by what the template is given: any string of the request (a message's
            # other fields, a template variable) is part of ``size``, the server's variables
            # are not.
            prompt, ids = await self.off_loop(
                size + self.defaults_chars,
                self.render_and_encode,
                messages,
                req.add_generation_prompt,
                kwargs,
                tools.tools if tools is not None else None,
            )
        plan.prompts = [ids]
        plan.n = req.n
        # One constraint per request: response_format wins over the tools' (as vLLM, SMG).
        plan.constraint = constraint(
            req.response_format, req.structured_outputs, guided_fields(req)
        )
        constrained = False
        if plan.constraint is None and tools is not None:
            schema = tools.schema()
            if schema is not None:
                plan.constraint = Constraint("json_schema", schema, "tool_choice")
                constrained = True
        if settings.harmony:
            if plan.constraint is not None:
                raise _bad(
                    f"{plan.constraint.param} with gpt-oss (Harmony): an engine grammar would "
                    "constrain its channels too; not supported, ask for JSON in the messages",
                    plan.constraint.param,
                )
            plan.parse = self._harmony_factory(tools.parallel if tools is not None else True)
        else:
            plan.parse = self._parser_factory(tools, constrained, prompt, kwargs)
        self._fit(plan, limit, "messages")
        if req.stop:
            await self._stops(req, plan)
        else:
            plan.stop = None
        self._sampling(req, plan)
        self._constrain(plan)
        if plan.parse is not None:
            if plan.stream and plan.logprobs:
                raise _bad(
                    "logprobs on a stream whose output is parsed (tools or reasoning) is not "
                    "supported; send stream: false for logprobs",
                    "logprobs",
                )
            # A format's markers may be special tokens ([TOOL_CALLS], <|python_tag|>, ...): the
            # parsers read them whatever skip_special_tokens says; it governs the others, and
            # a marker left over as text is not content.
            plan.keep, hidden = self._marker_ids()
            make = plan.parse
            if plan.keep and plan.skip_special:
                plan.parse = lambda: make().hide(hidden)
        return plan

    def _harmony_checks(self, req: ChatRequest, tools: Any) -> str:
        """What gpt-oss's Harmony path refuses, each a 400 naming its field; the request's
        reasoning effort (Harmony's name)."""
        from tsfront.text import TextError
        from tsfront.text.harmony import reasoning_effort

        if tools is not None and tools.mode in ("required", "named"):
            raise _bad(
                'tool_choice "required" or a named function with gpt-oss (Harmony) is not '
                'supported: an engine grammar would constrain its channels too; send "auto"',
                "tool_choice",
            )
        if req.stop:
            raise _bad(
                "stop strings with gpt-oss (Harmony) are not supported: its output is parsed "
                "as Harmony messages, which end on their own tokens; omit stop",
                "stop",
            )
        given = req.reasoning_effort
        try:
            return reasoning_effort(
                given if given is not None else self.chat_settings.reasoning_effort,
                "reasoning_effort",
            )
        except TextError as exc:
            raise _bad(str(exc), "reasoning_effort") from None

    def _render_harmony(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, effort: str
    ) -> list[int]:
        from tsfront.text import TextError
        from tsfront.text.harmony import load_encoding, render_prompt

        try:
            return render_prompt(load_encoding(self.text), messages, tools, effort)
        except TextError as exc:
            raise _bad(str(exc), "messages") from None

    def _harmony_factory(self, parallel: bool) -> Callable[[], OutputParser]:
        """Each choice's parser of gpt-oss's channels (on the engine's token ids)."""
        from tsfront.serve.core.parsing import OutputParser
        from tsfront.text.harmony import HarmonyParser, load_encoding

        encoding = load_encoding(self.text)
        text = self.text

        def parser() -> OutputParser:
            return OutputParser(
                None, None, parallel, harmony=HarmonyParser(encoding, text.detokenizer())
            )

        return parser

    def _marker_ids(self) -> tuple[frozenset[int], tuple[str, ...]]:
        """The ids of the special tokens the server's parsers read, and their texts (made
        once)."""
        found = self._markers
        if found is None:
            from tsfront.text.reasoning import REASONING_PARSERS
            from tsfront.text.tools import TOOL_PARSERS

            settings = self.chat_settings
            texts: list[str] = []
            if settings.tool_parser in TOOL_PARSERS:
                texts += TOOL_PARSERS[settings.tool_parser].special
            if settings.reasoning_parser in REASONING_PARSERS:
                texts += REASONING_PARSERS[settings.reasoning_parser].special
            special_ids = getattr(self.text, "special_ids", None)
            ids = special_ids(texts) if special_ids and texts else frozenset()
            hidden = tuple(self.text.tokenizer.id_to_token(i) for i in ids)
            found = self._markers = (ids, hidden)
        return found

    def template_kwargs_of(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """A request's ``chat_template_kwargs`` (checked) over the server's defaults."""
        kwargs = given or {}
        if kwargs:
            check_template_kwargs(kwargs, self._template_names)
        if self._template_kwargs:
            kwargs = {**self._template_kwargs, **kwargs}
        return kwargs

    def messages_of(self, given: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
        """The messages as the template takes them (text parts joined, tool calls' arguments
        parsed), within the bounds of the context."""
        most = limit or _MAX_MESSAGES
        if len(given) > most:
            raise _bad(
                f"{len(given)} messages: at most {most} (each message takes at least a "
                "token of the context)",
                "messages",
            )
        messages = [history_message(i, self._message(i, m)) for i, m in enumerate(given)]
        chars = sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
        self.check_chars(chars, limit, "messages")
        return messages

    def _parser_factory(
        self, tools: Any, constrained: bool, prompt: str, kwargs: dict[str, Any]
    ) -> Callable[[], OutputParser] | None:
        """What makes each choice's `OutputParser`, or ``None`` (the text is the content)."""
        from tsfront.serve.core.parsing import OutputParser
        from tsfront.text.reasoning import REASONING_PARSERS, make_reasoning_parser

        reasoning_name = self.chat_settings.reasoning_parser
        parses_tools = tools is not None and tools.parser(constrained) is not None
        if reasoning_name is None and not parses_tools:
            return None
        # A template that opens <think> (its format's tag) in the prompt leaves the output
        # inside the section; enable_thinking: false (Qwen3) closes it there: no reasoning.
        kind = REASONING_PARSERS.get(reasoning_name) if reasoning_name is not None else None
        inside = kind is not None and kind.prompt_opens(prompt)
        enabled = kwargs.get("enable_thinking") is not False
        parallel = tools.parallel if tools is not None else True

        def parser() -> OutputParser:
            reasoning = (
                make_reasoning_parser(reasoning_name, starts_in_reasoning=inside, enabled=enabled)
                if reasoning_name is not None
                else None
            )
            return OutputParser(
                reasoning, tools.parser(constrained) if parses_tools else None, parallel
            )

        return parser

    def render_and_encode(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        kwargs: dict[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[str, list[int]]:
        from tsfront.text import TextError

        if self._chat_template is None and not self.text.chat_template:
            raise _bad(
                f"the model {self.model_name!r} has no chat template, so this server cannot "
                "render messages: start it with --chat-template FILE (a Jinja chat template), "
                "or add chat_template to the model's tokenizer_config.json (or a "
                "chat_template.jinja); or send a prompt to /v1/completions",
                "messages",
            )
        try:
            prompt = self.text.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                chat_template=self._chat_template,
                **kwargs,
            )
        except TextError as exc:  # ChatTemplateError included
            raise _bad(str(exc), "messages") from None
        # The template writes the special tokens (BOS) itself; a long prompt's encode releases
        # the GIL and reads the ids of its known prefix from the encode cache.
        try:
            ids = self.text.encode_prompt(prompt)
        except (TypeError, UnicodeEncodeError):
            # The tokenizer takes no lone surrogate: one the template made of the messages
            # (the server's own parsing refuses those it finds: `limits.check_json`).
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad(
                    "the rendered prompt holds a lone UTF-16 surrogate (\\ud800-\\udfff "
                    "without its other half), which no tokenizer takes: a message's text must be "
                    "valid Unicode",
                    "messages",
                ) from None
            raise
        if not ids:
            raise _bad("the prompt encodes to no tokens; send a non-empty prompt", "prompt")
        return prompt, ids

    @staticmethod
    def _message(i: int, message: dict[str, Any]) -> dict[str, Any]:
        role = message.get("role")
        if not isinstance(role, str):
            raise _bad(f"messages[{i}].role must be a string", "messages")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise _bad(
                        f"messages[{i}].content[{j}]: only text parts are supported", "messages"
                    )
                parts.append(str(part.get("text", "")))
            message = {**message, "content": "".join(parts)}
        elif content is not None and not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string or a list of parts", "messages")
        return message

    # ------------------------------------------------------------------ submit

    async def _run(
        self, plan: Plan, fmt: Format, record: RequestRecord | None = None
    ) -> Reply | SSEReply:
        choices = await self._submit(plan, None if record is None else record.request_id)
        if record is not None:
            record.summary = lambda: _summary(fmt, choices)
        try:
            if not plan.stream:
                return await self._collect(plan, fmt, choices, record)
            # Wait for the first output before answering, so that a request the engine
            # refuses outright gets a status instead of a stream that says "abort".
            first = await self._first(choices[0], plan.constraint)
            if record is not None:
                record.output_began()
        except BaseException:
            for ch in choices:
                ch.stream.abort()
            raise
        if len(choices) == 1:
            ch = choices[0]
            push = None
            if ch.stop is None and not plan.logprobs and _PUSH:
                if ch.parser is None:

                    def push(send: Send) -> Pusher:
                        pusher = Pusher(ch, fmt.head(ch.index), fmt.tail, send)
                        ch.stream.set_sink(pusher)
                        return pusher

                else:

                    def push(send: Send) -> Pusher:
                        pusher = ParsedPusher(ch, fmt, send)
                        ch.stream.set_sink(pusher)
                        return pusher

            return SSEReply(self._one(plan, fmt, ch, first, whole=True), push)
        return SSEReply(self._events(plan, fmt, choices, first))

    async def _submit(self, plan: Plan, request_id: str | None = None) -> list[Choice]:
        if plan.stop is not None:
            from tsfront.text import StopMatcher
        text = self.text
        # Unique by the worker's prefix and count; the HTTP request id (bounded) follows.
        base = f"{self._prefix}-{next(self._ids)}"
        if request_id:
            base = f"{base}-{request_id}"
        choices: list[Choice] = []
        total = len(plan.prompts) * plan.n
        if total > MAX_CHOICES:
            raise _bad(f"prompts x n = {total}: at most {MAX_CHOICES} completions per request")
        try:
            index = 0
            for ids in plan.prompts:
                for k in range(plan.n):
                    values = plan.sampling
                    if k and values.get("seed") is not None:
                        # Same seed for every choice would make them all the same.
                        values = {**values, "seed": values["seed"] + k}
                    request = TokenizedGenerateReqInput(
                        rid=f"{base}-{index}" if total > 1 else base,
                        input_ids=ids,
                        stream=True,
                        return_logprob=plan.logprobs,
                        sampling_params=SamplingParams(**values),
                    )
                    try:
                        stream = await self.client.generate(request, deadline=self.request_timeout)
                    except Error as exc:
                        raise _refusal(exc) from None
                    stop = (
                        StopMatcher(plan.stop, include_stop_str_in_output=plan.include_stop)
                        if plan.stop is not None
                        else None
                    )
                    detok = text.detokenizer(
                        prompt_ids=ids, skip_special_tokens=plan.skip_special, keep=plan.keep
                    )
                    parser = plan.parse() if plan.parse is not None else None
                    choices.append(Choice(index, stream, detok, stop, len(ids), parser))
                    index += 1
        except BaseException:
            for ch in choices:
                ch.stream.abort()
            raise
        return choices

    @staticmethod
    async def _first(ch: Choice, grammar: Constraint | None = None) -> OutputChunk | None:
        try:
            chunk = await ch.stream.__anext__()
        except StopAsyncIteration:
            return None
        except StreamError as exc:
            raise _stream_failed(exc) from None
        if chunk.finish_reason == "abort" and not chunk.output_ids:
            # The wire carries no reason for an abort (CONTRACT §3.3): the engine logs it.
            if grammar is not None:
                raise _bad(
                    f"the engine refused the request: most likely the {grammar.field} grammar "
                    f"made from {grammar.param} does not compile (or the engine runs with "
                    "--grammar-backend none); the engine's log says why",
                    grammar.param,
                )
            raise _bad(
                "the engine refused the request (it breaks a rule the engine checks, e.g. "
                "logprobs on an engine started without --enable-output-logprobs)"
            )
        return chunk

    # ------------------------------------------------------------------ non-streamed

    async def _collect(
        self,
        plan: Plan,
        fmt: Format,
        choices: list[Choice],
        record: RequestRecord | None = None,
    ) -> Reply:
        first = await self._first(choices[0], plan.constraint)
        if record is not None:
            record.output_began()
        texts = await asyncio.gather(
            *(self._gather(plan, ch, first if i == 0 else None) for i, ch in enumerate(choices))
        )
        aborted = [ch for ch in choices if ch.finish == ABORT]
        if aborted:
            raise _aborted(aborted[0])
        try:
            for ch, text in zip(choices, texts, strict=True):
                if ch.parser is not None:
                    if ch.parser.has_reasoning:  # fed chunk by chunk (`_gather`)
                        ch.parser.finish(length=ch.finish == "length")
                    else:
                        ch.parser.whole(text, length=ch.finish == "length")
                    ch.settle()
            body = fmt.whole(choices, texts)
        except Exception as exc:  # the parse step's boundary
            raise _unparseable(exc) from None
        return Reply(200, body)

    async def _gather(self, plan: Plan, ch: Choice, first: OutputChunk | None) -> str:
        parts: list[str] = []
        logprobs = ch.logprobs = [] if plan.logprobs else None
        chunk = first
        stream = ch.stream
        # With a reasoning parser the text is parsed as it comes, so that the thought's
        # tokens are counted as the engine sent them (`OutputParser.feed`), not encoded again.
        thinks = ch.parser if ch.parser is not None and ch.parser.has_reasoning else None
        try:
            while True:
                if chunk is None:
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                if thinks is not None:
                    text = ch.text(chunk)
                    try:
                        thinks.feed(text, len(chunk.output_ids), chunk.output_ids)
                    except Exception as exc:  # the parse step's boundary
                        raise _unparseable(exc) from None
                else:
                    parts.append(ch.text(chunk))
                if logprobs is not None and chunk.output_token_logprobs_val:
                    logprobs.extend(
                        zip(chunk.output_ids, chunk.output_token_logprobs_val, strict=False)
                    )
                if ch.finish is not None:
                    break
                chunk = None
        except StreamError as exc:
            raise _stream_failed(exc) from None
        return "".join(parts)

    # ------------------------------------------------------------------ streamed

    async def _events(
        self, plan: Plan, fmt: Format, choices: list[Choice], first: OutputChunk | None
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for event in self._many(plan, fmt, choices, first):
                yield event
            yield Final(fmt.usage_event(choices) + fmt.done if plan.include_usage else fmt.done)
        finally:
            for ch in choices:
                ch.stream.abort()

    async def _one(
        self,
        plan: Plan,
        fmt: Format,
        ch: Choice,
        chunk: OutputChunk | None,
        *,
        whole: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        # The hot path: one event per chunk, built from pre-encoded fragments. With ``whole``
        # it is the response's entire event stream (one choice: no wrapper generator per token).
        if ch.parser is not None:
            async for event in self._parsed(plan, fmt, ch, chunk, whole=whole):
                yield event
            return
        stream = ch.stream
        lp = plan.logprobs
        index = ch.index
        head = fmt.head(index)
        tail = fmt.tail
        encode = _JSON.encode
        last: bytes | None = None  # the event with the finish reason, or the error event
        try:
            opening = fmt.opening(index)
            if opening:
                yield opening
            while True:
                if chunk is None:
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                text = ch.text(chunk)
                if ch.finish is not None:
                    if ch.finish == ABORT:
                        if text:
                            yield head + encode(text) + tail
                        last = _abort_event(fmt, ch)
                    else:
                        last = fmt.last(ch, text, chunk if lp else None)
                    break
                if lp:
                    yield fmt.with_logprobs(index, text, chunk)
                elif text:
                    yield head + encode(text) + tail
                chunk = None
        except StreamError as exc:
            last = fmt.error_event(exc)
        finally:
            if whole:
                stream.abort()
                stream.set_sink(None)  # the sink refers back to this choice
        if whole:
            yield _ending(plan, fmt, ch, last)
        elif last:
            yield last

    async def _parsed(
        self,
        plan: Plan,
        fmt: Format,
        ch: Choice,
        chunk: OutputChunk | None,
        *,
        whole: bool = False,
    ) -> AsyncGenerator[bytes, None]:
        # A chat choice whose text is parsed (tools, reasoning): each chunk's pieces become
        # reasoning_content, content and tool_calls deltas. A streamed single choice without
        # stop strings has a `ParsedPusher` that parses the tokens arriving while this waits,
        # in the drain; this takes the first chunk, the last, and any that arrive while it runs.
        stream = ch.stream
        parser = ch.parser
        assert parser is not None
        index = ch.index
        pieces = fmt.pieces
        last: bytes | None = None
        try:
            opening = fmt.opening(index)
            if opening:
                yield opening
            while True:
                if chunk is None:
                    try:
                        chunk = await stream.__anext__()
                    except StopAsyncIteration:
                        break
                text = ch.text(chunk)
                if ch.finish == ABORT:
                    last = _abort_event(fmt, ch)
                    break
                try:  # the parse step's boundary
                    events = pieces(
                        index, parser.feed(text, len(chunk.output_ids), chunk.output_ids)
                    )
                    if ch.finish is not None:
                        events += pieces(index, parser.finish(length=ch.finish == "length"))
                        ch.settle()
                        last = fmt.last(ch, "", None)
                except Exception as exc:
                    stream.abort()
                    err = _unparseable(exc)
                    last = fmt.error_event(err, err.status, err.kind)
                    break
                if events:
                    yield events
                if ch.finish is not None:
                    break
                chunk = None
        except StreamError as exc:
            last = fmt.error_event(exc)
        finally:
            if whole:
                stream.abort()
                stream.set_sink(None)  # the sink refers back to this choice
        if ch.failure is not None and last is None:
            # The sink's parse step raised on the model's output (it aborted the request).
            err = _unparseable(ch.failure)
            last = fmt.error_event(err, err.status, err.kind)
        if whole:
            yield _ending(plan, fmt, ch, last)
        elif last:
            yield last

    async def _many(
        self, plan: Plan, fmt: Format, choices: list[Choice], first: OutputChunk | None
    ) -> AsyncGenerator[bytes, None]:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def pump(ch: Choice, chunk: OutputChunk | None) -> None:
            try:
                async for event in self._one(plan, fmt, ch, chunk):
                    queue.put_nowait(event)
            finally:
                queue.put_nowait(None)

        tasks = [
            asyncio.ensure_future(pump(ch, first if i == 0 else None))
            for i, ch in enumerate(choices)
        ]
        try:
            running = len(tasks)
            while running:
                event = await queue.get()
                if event is None:
                    running -= 1
                else:
                    yield event
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
