"""``tsfront generate``: be the frontend of an engine group and run requests from the shell.

Everything on the command line and in the requests file is checked before the handshake is
bound (`tsfront.wire.validate_request` without engine limits: stop strings, token ids out of
int32, sampling values), so a bad request never waits out the handshake timeout. Then it binds
the handshake (the engines dial it), waits for every engine to register, and runs one
request (``--input-ids``) or a JSON-lines file of them (``--requests``) with at most
``--concurrency`` in flight, printing each chunk as it arrives: ``RID: ids...`` lines, or one
JSON object per chunk with ``--json``. Progress and a summary go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from typing import Any

from tsfront.client.engine_client import ClientListener, EngineClient
from tsfront.client.stream import OutputChunk
from tsfront.commands.base import Command, CommandError, UsageError, one_line, progress
from tsfront.commands.options import HANDSHAKE_TIMEOUT_S, add_engine_arguments, config_from_args
from tsfront.errors import Error, InvalidRequest
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput, validate_request

__all__ = ["COMMAND", "arguments", "parse_ids", "parse_requests", "run"]

_PROGRESS_S = 2.0
_SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_REQUEST_KEYS = frozenset({"rid", "input_ids", "data_parallel_rank", "sampling_params"})
_PROG = "tsfront generate"


def parse_ids(text: str, what: str) -> list[int]:
    """``"1,2, 3"`` → ``[1, 2, 3]``; raises `UsageError` naming the option ``what``."""
    try:
        ids = [int(part) for part in text.replace(" ", ",").split(",") if part.strip()]
    except ValueError:
        raise UsageError(_PROG, f"{what}={text!r}: expected comma-separated integers") from None
    if any(i < 0 for i in ids):
        raise UsageError(_PROG, f"{what}={text!r}: token ids are integers >= 0")
    return ids


def _check_options(args: argparse.Namespace) -> None:
    """Refuse out-of-range options (exit 2) before anything is bound."""
    if args.concurrency < 1:
        raise UsageError(_PROG, f"--concurrency={args.concurrency}: must be at least 1")
    if args.max_new_tokens < 1:
        raise UsageError(
            _PROG,
            f"--max-new-tokens={args.max_new_tokens}: must be at least 1 (an engine asked "
            "for 0 still samples one token)",
        )
    if args.rank is not None and not 0 <= args.rank < args.num_engines:
        raise UsageError(
            _PROG, f"--rank={args.rank}: ranks are 0..{args.num_engines - 1} (--num-engines)"
        )


def _defaults(args: argparse.Namespace) -> dict[str, Any]:
    sampling: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.stop_token_ids:
        sampling["stop_token_ids"] = parse_ids(args.stop_token_ids, "--stop-token-ids")
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    return sampling


def _build(
    obj: dict,
    index: int,
    prefix: str,
    sampling: dict,
    rank: int | None,
    where: str,
    num_engines: int | None = None,
) -> TokenizedGenerateReqInput:
    """One request from ``obj``, checked as far as it can be without the engines.

    Raises `CommandError` (a file line) or `UsageError` (``where`` is an option) naming
    ``where``.
    """

    def refuse(message: str) -> CommandError:
        return UsageError(_PROG, message) if where.startswith("--") else CommandError(message)

    if not isinstance(obj, dict):
        raise refuse(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - _REQUEST_KEYS - _SAMPLING_FIELDS
    if unknown:
        raise CommandError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; use input_ids, rid, "
            "data_parallel_rank, sampling_params or a SamplingParams field"
        )
    ids = obj.get("input_ids")
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    ):
        raise refuse(f"{where}: 'input_ids' must be a non-empty list of token ids")
    params = dict(sampling)
    nested = obj.get("sampling_params") or {}
    if not isinstance(nested, dict) or set(nested) - _SAMPLING_FIELDS:
        raise refuse(f"{where}: 'sampling_params' must be an object of SamplingParams fields")
    params.update(nested)
    params.update({k: v for k, v in obj.items() if k in _SAMPLING_FIELDS})
    try:
        sp = SamplingParams(**params)
    except TypeError as exc:
        raise refuse(f"{where}: {exc}") from None
    rid = obj.get("rid", f"{prefix}-{index}")
    if not isinstance(rid, str) or not rid:
        raise refuse(f"{where}: 'rid' must be a non-empty string")
    pin = obj.get("data_parallel_rank", rank)
    if pin is not None and (
        not isinstance(pin, int) or (num_engines is not None and not 0 <= pin < num_engines)
    ):
        ranks = "an int" if num_engines is None else f"0..{num_engines - 1}"
        raise refuse(f"{where}: data_parallel_rank={pin!r}: ranks are {ranks}")
    request = TokenizedGenerateReqInput(
        rid=rid, input_ids=ids, sampling_params=sp, stream=True, data_parallel_rank=pin
    )
    if isinstance(sp.max_new_tokens, int) and sp.max_new_tokens < 1:
        raise refuse(
            f"{where}: max_new_tokens={sp.max_new_tokens}: must be at least 1 (an engine "
            "asked for 0 still samples one token)"
        )
    try:
        # The engine-independent rules (stop strings, int32 ids, sampling ranges) now, so a
        # bad request is refused before the handshake is bound, not after the engines came.
        validate_request(request)
    except InvalidRequest as exc:
        raise refuse(f"{where}: {exc}") from None
    return request


def parse_requests(args: argparse.Namespace) -> list[TokenizedGenerateReqInput]:
    """The requests the command line asks for (raises `CommandError` / `OSError`)."""
    prefix = f"gen-{secrets.token_hex(4)}"
    sampling = _defaults(args)
    engines = args.num_engines
    if args.input_ids is not None:
        ids = parse_ids(args.input_ids, "--input-ids")
        if not ids:
            raise UsageError(_PROG, "--input-ids is empty; give at least one token id")
        return [_build({"input_ids": ids}, 0, prefix, sampling, args.rank, "--input-ids", engines)]
    if args.requests == "-":
        lines = sys.stdin.read().splitlines()
        name = "<stdin>"
    else:
        with open(args.requests, encoding="utf-8") as f:
            lines = f.read().splitlines()
        name = args.requests
    out: list[TokenizedGenerateReqInput] = []
    rids: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{where}: not JSON ({exc.msg})") from None
        request = _build(obj, len(out), prefix, sampling, args.rank, where, engines)
        if request.rid in rids:
            raise CommandError(f"{where}: rid {request.rid!r} appears twice")
        rids.add(request.rid)
        out.append(request)
    if not out:
        raise CommandError(f"{name}: no requests in the file")
    return out


class _Run:
    def __init__(self, args: argparse.Namespace, total: int) -> None:
        self.args = args
        self.total = total
        self.done = 0
        self.failed = 0
        self.tokens = 0
        self.per_engine: dict[int, int] = {}
        self.started = time.monotonic()

    def emit(self, line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def note(self, message: str) -> None:
        if not self.args.quiet:
            progress("generate", message)

    async def one(
        self, client: EngineClient, request: TokenizedGenerateReqInput, gate: asyncio.Semaphore
    ) -> None:
        async with gate:
            try:
                stream = await client.generate(request)
                async with stream:
                    async for chunk in stream:
                        self.tokens += len(chunk.output_ids)
                        if chunk.finished:
                            self.per_engine[chunk.engine_index] = (
                                self.per_engine.get(chunk.engine_index, 0) + 1
                            )
                        self._print_chunk(chunk)
            except Error as exc:
                self.failed += 1
                if self.total == 1:
                    if self.args.json:
                        self._print_error(request.rid, exc)
                    raise  # a lone request's failure is the command's error (one line)
                self._print_error(request.rid, exc)
                progress("generate", f"request {request.rid}: {one_line(exc)}")
            finally:
                self.done += 1

    def _print_chunk(self, chunk: OutputChunk) -> None:
        if self.args.json:
            self.emit(
                json.dumps(
                    {
                        "rid": chunk.rid,
                        "output_ids": chunk.output_ids,
                        "finish_reason": chunk.finish_reason,
                        "prompt_tokens": chunk.prompt_tokens,
                        "completion_tokens": chunk.completion_tokens,
                        "cached_tokens": chunk.cached_tokens,
                        "engine_index": chunk.engine_index,
                    }
                )
            )
            return
        parts = [f"{chunk.rid}:", *map(str, chunk.output_ids)]
        if chunk.finished:
            parts.append(
                f"[finished: {chunk.finish_reason}; prompt {chunk.prompt_tokens}, completion "
                f"{chunk.completion_tokens}, cached {chunk.cached_tokens}, engine "
                f"{chunk.engine_index}]"
            )
        self.emit(" ".join(parts))

    def _print_error(self, rid: str, exc: Error) -> None:
        kind = type(exc).__name__
        message = one_line(exc)
        if self.args.json:
            self.emit(json.dumps({"rid": rid, "error": message, "kind": kind}))
        else:
            self.emit(f"{rid}: error: {kind}: {message}")

    async def ticker(self) -> None:
        while True:
            await asyncio.sleep(_PROGRESS_S)
            elapsed = time.monotonic() - self.started
            self.note(
                f"{self.done}/{self.total} requests done, {self.tokens} tokens in "
                f"{elapsed:.1f}s ({self.tokens / elapsed:.0f} tokens/s)"
            )


async def _wait_engines(
    listener: ClientListener, run: _Run, n: int, timeout: float
) -> EngineClient:
    accept = asyncio.ensure_future(listener.accept())
    start = time.monotonic()
    while True:
        done, _ = await asyncio.wait({accept}, timeout=5.0)
        if done:
            return accept.result()
        run.note(
            f"still waiting for {n} engine(s) at {listener.handshake_address} "
            f"({time.monotonic() - start:.0f}s of {timeout:g}s)"
        )


async def _main(args: argparse.Namespace) -> int:
    _check_options(args)
    requests = parse_requests(args)
    config = config_from_args(args)
    run = _Run(args, len(requests))
    listener = await ClientListener.bind(config)
    run.note(
        f"handshake bound at {listener.handshake_address}; waiting for {config.num_engines} "
        f"engine(s) (indices {config.first_engine_index}.."
        f"{config.first_engine_index + config.num_engines - 1}, timeout "
        f"{config.handshake_timeout:g}s)"
    )
    try:
        client = await _wait_engines(listener, run, config.num_engines, config.handshake_timeout)
    except BaseException:
        await listener.close()
        raise
    try:
        engines = ", ".join(f"rank {e.rank} = engine {e.index}" for e in client.engines())
        run.note(f"engines ready ({engines}); running {len(requests)} request(s)")
        run.started = time.monotonic()
        gate = asyncio.Semaphore(args.concurrency)
        ticker = asyncio.ensure_future(run.ticker()) if len(requests) > 1 else None
        try:
            await asyncio.gather(*(run.one(client, r, gate) for r in requests))
        finally:
            if ticker is not None:
                ticker.cancel()
        elapsed = max(time.monotonic() - run.started, 1e-9)
        per = ", ".join(f"engine {k}: {v}" for k, v in sorted(run.per_engine.items()))
        run.note(
            f"done: {run.done - run.failed}/{run.total} finished, {run.tokens} tokens in "
            f"{elapsed:.2f}s ({run.tokens / elapsed:.0f} tokens/s)" + (f"; {per}" if per else "")
        )
    finally:
        await client.close()
    return 1 if run.failed else 0


def run(args: argparse.Namespace) -> int:
    """Run ``tsfront generate``; returns the exit status."""
    import uvloop

    # The I/O process logs to our stderr; its findings reach the user as stream errors and the
    # one-line error already, so keep it quiet unless TSFRONT_LOG says otherwise.
    os.environ.setdefault("TSFRONT_LOG", "CRITICAL")
    return uvloop.run(_main(args))


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront generate`` options to ``parser``."""
    add_engine_arguments(parser, handshake_timeout=HANDSHAKE_TIMEOUT_S)
    req = parser.add_argument_group("requests")
    what = req.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--input-ids", metavar="IDS", help="the prompt of one request, comma-separated token ids"
    )
    what.add_argument(
        "--requests",
        metavar="FILE",
        help="a JSON-lines file of requests, one object per line ('-' reads stdin)",
    )
    req.add_argument(
        "--max-new-tokens",
        type=int,
        default=16,
        metavar="M",
        help="default max_new_tokens (16)",
    )
    req.add_argument(
        "--stop-token-ids",
        metavar="IDS",
        help="default stop_token_ids, comma-separated",
    )
    req.add_argument(
        "--temperature", type=float, default=None, metavar="T", help="default temperature"
    )
    req.add_argument(
        "--rank",
        type=int,
        default=None,
        metavar="R",
        help="pin requests to this data-parallel rank (default: load-balanced)",
    )
    req.add_argument(
        "--concurrency",
        type=int,
        default=64,
        metavar="C",
        help="requests in flight at once (64)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per chunk (rid, output_ids, finish_reason, prompt_tokens, "
        "completion_tokens, cached_tokens, engine_index); errors as {rid, error}",
    )
    out.add_argument(
        "--quiet", action="store_true", help="no progress on stderr (errors still shown)"
    )


COMMAND = Command(
    name="generate",
    help="bind the handshake, wait for the engines, run requests and print their tokens",
    description="Be the frontend of an engine group: bind the handshake at --handshake, "
    "wait for --num-engines engines to dial it and register, run one request "
    "(--input-ids) or many (--requests FILE.jsonl), printing tokens as they arrive.",
    epilog="Each line of a --requests file is a JSON object with 'input_ids' (a list of "
    "ints) and optionally 'rid', 'data_parallel_rank', and any SamplingParams field "
    "('max_new_tokens', 'stop_token_ids', 'temperature', 'top_p', 'top_k', 'ignore_eos', "
    "'seed', ...), at the top level or under 'sampling_params'. Stop strings are refused: "
    "tsfront sends token ids only. Exit status: 0 if every request finished, 1 otherwise.",
    arguments=arguments,
    run=run,
)
