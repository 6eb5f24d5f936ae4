"""The step logic of one simulated TokenSpeed rank: admission, batching, finishing, cadence.

Pure: no sockets, no threads, no clock of its own (callers pass ``now``). The rank in
:mod:`tsfront.sim.engine` feeds it decoded requests and aborts, calls :meth:`Scheduler.step`
once per step time, and encodes whatever :class:`StepOutput` comes back as one
``BatchTokenIDOutSlim`` frame. Every rule here mirrors an engine behaviour in
``/work/shared/wire/CONTRACT.md``; the section is cited where it matters.

Token generation rule (so tests can predict outputs): the token at output position ``i``
(0-based) of request ``rid`` is :func:`default_token` ``(rid, i)`` =
``3 + (crc32(rid) + 7919 * i) % (vocab_size - 3)``. It never yields 0, 1 or 2, so with the default
``eos_token_id`` 2 a request only ends by length or a ``stop_token_ids`` match unless a
``token_fn`` says otherwise. A ``script`` (``prompt ids -> output ids | None``, e.g.
:class:`tsfront.sim.script.Script`) replaces that rule for the prompts it answers: the request
emits exactly the scripted ids, then ``eos_token_id`` (length and stop tokens still apply);
a `SCRIPT_ABORT` (-1) among them ends the request there with ``"abort"`` instead, as the
engine aborts a running request (NaN logits, a failed KV transfer).
The logprob of token ``t`` is :func:`default_logprob` ``(t)`` =
``-(1 + t % 15) / 16``: negative and exact in binary floating point.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FORCE_STREAM_INTERVAL",
    "SCRIPT_ABORT",
    "EngineFault",
    "LoadTail",
    "OutputRow",
    "Scheduler",
    "SchedulerConfig",
    "ScriptFn",
    "StepOutput",
    "TokenFn",
    "default_logprob",
    "default_token",
    "engine_rejection",
    "grammar_rejection",
]

SCRIPT_ABORT = -1
"""In a script's output ids: end the request here with a terminal ``"abort"`` (no token)."""

FORCE_STREAM_INTERVAL = 50
"""A ``stream=false`` request still emits at completion 1 and every 50 tokens (CONTRACT §3.4)."""

TokenFn = Callable[[str, int], int]
"""``token_fn(rid, position) -> token id``: the token generated at 0-based output ``position``."""

ScriptFn = Callable[[list[int]], "list[int] | None"]
"""``script(prompt ids) -> output ids``, or ``None`` for the usual tokens (pure, per request)."""

_TOKEN_STRIDE = 7919
_UNBOUNDED_NEW_TOKENS = 1 << 30


def default_token(rid: str, position: int, vocab_size: int = 32000) -> int:
    """Return the simulated token at 0-based output ``position`` of request ``rid``.

    ``3 + (crc32(rid) + 7919 * position) % (vocab_size - 3)``: never 0, 1 or 2 (so never the
    default EOS), and distinct across the first ``vocab_size - 3`` positions of one request.
    """
    seed = zlib.crc32(rid.encode("utf-8", "surrogatepass"))
    return 3 + (seed + _TOKEN_STRIDE * position) % (vocab_size - 3)


def default_logprob(token: int) -> float:
    """Return the simulated sampled-token logprob of ``token``: ``-(1 + token % 15) / 16``."""
    return -(1 + token % 15) / 16


#: The engine's normalised value for "top_k disabled" (``sampling_params._TOP_K_DISABLED``).
_ENGINE_TOP_K_DISABLED = 1 << 30


def engine_rejection(req: Any, *, enable_output_logprobs: bool = True) -> str | None:
    """Return why the engine would answer ``req`` with a terminal ``"abort"``, or ``None``.

    Delegates to :func:`tsfront.wire.validate_request` (``n != 1``, ``validation_error``, a
    session id, the logprob rules incl. ``--enable-output-logprobs``, sampling ranges), minus
    its stop-string refusal: the real engine accepts stop strings (CONTRACT §4.2), so they are
    cleared before asking; an already-normalised request (``is_normalized``, as SMG sends) is
    checked as the engine checks it, with its ``top_k`` sentinel read as -1. Length is not
    checked: the engine clamps ``max_new_tokens``.
    """
    import msgspec

    from tsfront.errors import InvalidRequest
    from tsfront.wire import validate_request

    sp = req.sampling_params
    if sp.stop is not None or sp.stop_strs is not None:
        sp = msgspec.structs.replace(sp, stop=None, stop_strs=None, stop_str_max_len=0)
    if sp.is_normalized:
        # A frontend that normalises itself (SMG) sends the engine's own encoding of "top_k
        # disabled"; the engine skips normalisation and its verify() accepts that value.
        top_k = -1 if sp.top_k == _ENGINE_TOP_K_DISABLED else sp.top_k
        sp = msgspec.structs.replace(sp, is_normalized=False, top_k=top_k)
    if not req.stream and sp.stream_interval is not None:
        # The engine never reads stream_interval for a non-streaming request.
        sp = msgspec.structs.replace(sp, stream_interval=None)
    if sp is not req.sampling_params:
        req = msgspec.structs.replace(req, sampling_params=sp)
    try:
        validate_request(req, enable_output_logprobs=enable_output_logprobs)
    except InvalidRequest as exc:
        return str(exc)
    return grammar_rejection(sp)


def grammar_rejection(sp: Any) -> str | None:
    """Why the engine's grammar backend would fail to compile ``sp``'s constraint, or ``None``.

    A stand-in for the engine's compile step (CONTRACT §4: a grammar that does not compile is
    a terminal ``"abort"``): ``json_schema`` must be JSON text of an object or a boolean,
    ``regex`` a pattern Python's ``re`` compiles, ``ebnf`` non-blank, ``structural_tag`` JSON
    text of an object. What it accepts is not checked further (the engine's backend is
    stricter; the interop suite runs the engine's own decoder).
    """
    import json
    import re

    if sp.json_schema is not None:
        try:
            schema = json.loads(sp.json_schema)
        except ValueError as exc:
            return f"json_schema is not JSON: {exc}"
        if not isinstance(schema, (dict, bool)):
            return "json_schema is not a JSON schema (an object or a boolean)"
    if sp.regex is not None:
        try:
            re.compile(sp.regex)
        except re.error as exc:
            return f"regex does not compile: {exc}"
    if sp.ebnf is not None and not sp.ebnf.strip():
        return "ebnf is empty"
    if sp.structural_tag is not None:
        try:
            tag = json.loads(sp.structural_tag)
        except ValueError as exc:
            return f"structural_tag is not JSON: {exc}"
        if not isinstance(tag, dict):
            return "structural_tag is not a JSON object"
    return None


class EngineFault(Exception):
    """A request that kills the real engine's scheduler loop (it then sends ENGINE_CORE_DEAD)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """The model geometry and policy of one simulated rank.

    Attributes:
        max_batch: requests decoded per step; beyond it requests wait (the engine's per-rank
            ``max_num_seqs // data_parallel_size``).
        max_model_len: context length; ``max_new_tokens`` is clamped to
            ``max_model_len - prompt - 2`` (CONTRACT §4.3).
        vocab_size: range of generated token ids (see :func:`default_token`).
        eos_token_id: generating it finishes ``"stop"`` unless ``ignore_eos`` (which, as in
            the engine, also disables ``stop_token_ids``).
        page_size: tokens per KV page (also the prefix-cache granularity).
        kv_total_pages: usable KV pages (the load tail's ``kv_total_pages``).
        stream_interval: the engine's ``--stream-interval`` (per-request override wins).
        chunk_tokens: above 1, a streamed request emits its tokens in chunks of 1 to
            ``chunk_tokens`` tokens, the size of each drawn from ``crc32`` of its rid and
            position (reproducible, and different for every request), instead of every
            ``stream_interval``: tests use it to split one output into engine chunks of
            random sizes. 1 (the default) keeps the engine's cadence.
        prefix_cache: report ``cached_tokens`` for page-aligned prompt prefixes seen before.
        prefix_cache_pages: pages the prefix cache holds (least recently used go first, the
            deepest page of a prompt before the pages it extends, as a radix cache evicts
            leaves first); ``None`` → 65,536. Set it to ``kv_total_pages`` for a cache as
            finite as the engine's KV pool.
        enable_output_logprobs: the engine's ``--enable-output-logprobs``.
        abort_memory_s: how long an ABORT for an unknown rid is remembered (300 s).
    """

    max_batch: int = 256
    max_model_len: int = 32768
    vocab_size: int = 32000
    eos_token_id: int = 2
    page_size: int = 64
    kv_total_pages: int = 4095
    stream_interval: int = 1
    chunk_tokens: int = 1
    prefix_cache: bool = True
    enable_output_logprobs: bool = True
    abort_memory_s: float = 300.0
    prefix_cache_pages: int | None = None


@dataclass(frozen=True)
class LoadTail:
    """The four load values an 0.1.1 engine piggybacks on each output frame (CONTRACT §5.4)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_active_pages: int = 0
    kv_total_pages: int = 0


@dataclass
class OutputRow:
    """One request's column values in an output frame; ``output_ids`` is the delta."""

    rid: str
    output_ids: list[int]
    finished_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprob_vals: list[float]
    logprob_idx: list[int]


@dataclass
class StepOutput:
    """Rows for one output frame and the load tail it carries."""

    rows: list[OutputRow]
    load: LoadTail


@dataclass(eq=False)
class _Request:
    """A request admitted on this rank, with its progress and unsent delta."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    stream: bool
    stream_interval: int
    return_logprob: bool
    cached_tokens: int = 0
    completion_tokens: int = 0
    pending_ids: list[int] = field(default_factory=list)
    pending_vals: list[float] = field(default_factory=list)
    finished_reason: str = ""
    script: list[int] | None = None
    emit_at: int = 1  # with chunk_tokens: the completion count of the next emission

    def pages(self, page_size: int) -> int:
        """KV pages this request holds right now."""
        return -(-(self.prompt_tokens + self.completion_tokens) // page_size)


class Scheduler:
    """Admission, one-token-per-step decoding and output cadence of one rank.

    Call :meth:`add` / :meth:`abort` as requests arrive and :meth:`step` once per step time.
    ``validate(req) -> reason | None`` decides terminal aborts (default
    :func:`engine_rejection`); ``token_fn`` replaces :func:`default_token`; ``script``
    answers the prompts it knows with scripted token ids (see the module docstring).
    """

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        token_fn: TokenFn | None = None,
        validate: Callable[[Any], str | None] | None = None,
        script: ScriptFn | None = None,
    ) -> None:
        self.config = config or SchedulerConfig()
        if self.config.vocab_size <= 3:
            raise ValueError("vocab_size must be > 3")
        vocab = self.config.vocab_size
        self._token_fn: TokenFn = token_fn or (lambda rid, pos: default_token(rid, pos, vocab))
        self._script = script
        enable = self.config.enable_output_logprobs
        self._validate = validate or (
            lambda req: engine_rejection(req, enable_output_logprobs=enable)
        )
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}
        self._live: dict[str, _Request] = {}
        # rid -> time of an ABORT that arrived before (or after) its request.
        self._pending_aborts: OrderedDict[str, float] = OrderedDict()
        self._prefixes: OrderedDict[int, None] = OrderedDict()
        self._last_load = LoadTail()
        self.steps = 0

    # -- inspection ---------------------------------------------------------------------------

    @property
    def last_load(self) -> LoadTail:
        """The load tail of the last step (what an output frame of this rank reports)."""
        return self._last_load

    @property
    def busy(self) -> bool:
        """Whether any request is running or waiting (a step would produce tokens)."""
        return bool(self._live)

    @property
    def num_running(self) -> int:
        """Admitted unfinished requests, queued ones included (the tail's ``num_running``)."""
        return len(self._live)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a batch slot or KV pages."""
        return len(self._waiting)

    def live_rids(self) -> list[str]:
        """Rids of every admitted unfinished request."""
        return list(self._live)

    # -- input --------------------------------------------------------------------------------

    def add(self, req: Any, now: float = 0.0) -> StepOutput | None:
        """Admit one decoded ADD request.

        Raises :class:`EngineFault` for ``input_ids=None``, as the engine's loop crashes on it.
        Returns the single terminal ``"abort"`` frame for a request the engine rejects
        (published at admission with the previous step's load tail), else ``None``. A rid with a
        remembered ABORT, or a rid already live, is dropped without output.
        """
        self._expire_aborts(now)
        rid = req.rid
        if req.input_ids is None:
            # The engine's RequestState takes len(None): its loop dies (CONTRACT §4.4).
            raise EngineFault(f"request {rid!r} has input_ids=None")
        sp = req.sampling_params
        if req.stream and sp.stream_interval == 0:
            # The engine's cadence check takes completion_tokens % 0: its loop dies.
            raise EngineFault(f"request {rid!r} has stream_interval=0")
        if self._pending_aborts.pop(rid, None) is not None or rid in self._live:
            return None
        input_ids = list(req.input_ids)
        prompt = len(input_ids)
        reason = self._validate(req)
        if reason is not None:
            row = OutputRow(rid, [], "abort", prompt, 0, 0, [], [])
            return StepOutput([row], self._last_load)
        cfg = self.config
        limit = cfg.max_model_len - prompt - 2
        requested = sp.max_new_tokens if sp.max_new_tokens is not None else _UNBOUNDED_NEW_TOKENS
        interval = sp.stream_interval if sp.stream_interval is not None else cfg.stream_interval
        request = _Request(
            rid=rid,
            prompt_tokens=prompt,
            max_new_tokens=min(requested, limit),
            stop_token_ids=frozenset(sp.stop_token_ids or ()),
            ignore_eos=bool(sp.ignore_eos),
            stream=bool(req.stream),
            stream_interval=max(1, interval),
            return_logprob=bool(req.return_logprob),
            cached_tokens=self._cache_lookup(input_ids),
            script=self._script(input_ids) if self._script is not None else None,
        )
        self._live[rid] = request
        self._waiting.append(request)
        return None

    def abort(self, rids: Iterable[str], now: float = 0.0) -> list[str]:
        """Abort requests silently (no terminal frame); returns the rids that were live.

        An unknown rid is remembered for ``abort_memory_s`` so a later ADD with it is dropped.
        """
        self._expire_aborts(now)
        aborted = []
        for rid in rids:
            request = self._live.pop(rid, None)
            if request is None:
                self._pending_aborts[rid] = now
                self._pending_aborts.move_to_end(rid)
                continue
            aborted.append(rid)
            if self._running.pop(rid, None) is None:
                self._waiting.remove(request)
        return aborted

    # -- stepping -----------------------------------------------------------------------------

    def step(self) -> StepOutput | None:
        """Run one step: admit waiting requests, sample the load, decode one token each.

        Returns the frame to publish (only rows whose cadence says "emit"), or ``None`` if no
        row has output this step.
        """
        self._admit()
        cfg = self.config
        load = LoadTail(
            num_running=len(self._live),
            num_waiting=len(self._waiting),
            kv_active_pages=min(cfg.kv_total_pages, self._active_pages()),
            kv_total_pages=cfg.kv_total_pages,
        )
        self._last_load = load
        if not self._running:
            return None
        self.steps += 1
        rows: list[OutputRow] = []
        for request in list(self._running.values()):
            self._decode_one(request)
            if self._should_emit(request, self.config.chunk_tokens):
                rows.append(self._take_row(request))
            if request.finished_reason:
                del self._running[request.rid]
                del self._live[request.rid]
        return StepOutput(rows, load) if rows else None

    def _admit(self) -> None:
        cfg = self.config
        free = cfg.kv_total_pages - self._active_pages()
        while self._waiting and len(self._running) < cfg.max_batch:
            request = self._waiting[0]
            need = -(-(request.prompt_tokens + 1) // cfg.page_size)
            # An empty batch always takes the head request, so one huge prompt cannot wedge us.
            if need > free and self._running:
                break
            self._waiting.popleft()
            self._running[request.rid] = request
            free -= need

    def _decode_one(self, request: _Request) -> None:
        position = request.completion_tokens
        script = request.script
        if script is None:
            token = self._token_fn(request.rid, position)
        else:
            token = script[position] if position < len(script) else self.config.eos_token_id
            if token == SCRIPT_ABORT:
                request.finished_reason = "abort"
                return
        request.completion_tokens += 1
        request.pending_ids.append(token)
        if request.return_logprob:
            request.pending_vals.append(default_logprob(token))
        # The engine's check_finished order: length (after appending, CONTRACT §4.3), then,
        # unless ignore_eos (which disables stop_token_ids too), stop tokens and EOS.
        if request.completion_tokens >= request.max_new_tokens:
            request.finished_reason = "length"
        elif not request.ignore_eos and (
            token in request.stop_token_ids or token == self.config.eos_token_id
        ):
            request.finished_reason = "stop"

    @staticmethod
    def _should_emit(request: _Request, chunk_tokens: int = 1) -> bool:
        if request.finished_reason:
            return True
        done = request.completion_tokens
        if not request.stream:
            return done == 1 or done % FORCE_STREAM_INTERVAL == 0
        if chunk_tokens > 1:
            if done < request.emit_at:
                return False
            seed = zlib.crc32(f"{request.rid}:{done}".encode("utf-8", "surrogatepass"))
            request.emit_at = done + 1 + seed % chunk_tokens
            return True
        if request.stream_interval == 1:
            return True
        return done % request.stream_interval == 1

    @staticmethod
    def _take_row(request: _Request) -> OutputRow:
        ids, request.pending_ids = request.pending_ids, []
        vals, request.pending_vals = request.pending_vals, []
        return OutputRow(
            rid=request.rid,
            output_ids=ids,
            finished_reason=request.finished_reason,
            prompt_tokens=request.prompt_tokens,
            completion_tokens=request.completion_tokens,
            cached_tokens=request.cached_tokens,
            logprob_vals=vals,
            logprob_idx=list(ids) if request.return_logprob else [],
        )

    def _active_pages(self) -> int:
        page = self.config.page_size
        return sum(request.pages(page) for request in self._running.values())

    # -- memory -------------------------------------------------------------------------------

    def _expire_aborts(self, now: float) -> None:
        horizon = now - self.config.abort_memory_s
        while self._pending_aborts:
            rid, seen = next(iter(self._pending_aborts.items()))
            if seen >= horizon:
                break
            del self._pending_aborts[rid]

    def _cache_lookup(self, input_ids: list[int]) -> int:
        """Return the cached prefix length of a prompt and remember its page-aligned prefixes.

        At least the last prompt token is always computed, as in a real prefix cache.
        """
        if not self.config.prefix_cache:
            return 0
        page = self.config.page_size
        cached = 0
        key = 0
        keys = []
        for end in range(page, len(input_ids), page):
            # A chained hash names the whole prefix without re-hashing it page by page.
            key = hash((key, *input_ids[end - page : end]))
            keys.append(key)
            if key in self._prefixes and cached == end - page:
                cached = end
        # Deepest page first, so the prompt's first page ends most recent: eviction then
        # takes the pages that extend a prefix before the prefix itself.
        for key in reversed(keys):
            self._prefixes[key] = None
            self._prefixes.move_to_end(key)
        capacity = self.config.prefix_cache_pages
        capacity = 65536 if capacity is None else capacity
        while len(self._prefixes) > capacity:
            self._prefixes.popitem(last=False)
        return cached
