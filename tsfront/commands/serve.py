"""``tsfront serve``: an OpenAI-compatible server with W worker processes on one port.

The master process claims the port (refused, exit 2, if anything listens there: see
`tsfront.serve.processes.ports`), binding one listening SO_REUSEPORT socket per worker place, starts
one I/O process (or uses ``--attach``'s) and spawns the workers; each attaches and serves
HTTP on its place's socket, which the master keeps for the place's replacements. The
master prints ``handshake: ADDR`` once the I/O process is bound (the engines dial it); the
workers answer at once (``/liveness`` 200, ``/readiness`` and the API 503 while the engines
load), and the master says on stderr every `PROGRESS_S` which ranks registered and which are
missing; it prints ``listening: http://HOST:PORT`` once every engine registered, then
supervises (`tsfront.serve.processes.supervisor`): a worker that exits, is killed, or sends no
heartbeat for ``--worker-timeout`` seconds (then the master SIGKILLs it) is replaced by a new one on
the same listening socket and I/O process, at once, then with a growing backoff; only its
requests are lost (the I/O process aborts them on the engines when it sees the worker go). Past
``--max-worker-restarts`` replacements in ``--worker-restart-window`` seconds the server stops
and exits 1. SIGINT/SIGTERM drain: every worker closes its listening socket, finishes its
running requests for up to ``--graceful-timeout`` seconds, then cuts the rest (their engine
requests aborted); a second signal cuts at once; then the I/O process stops, exit 0. An engine
dying is not fatal: its requests end with an error and new ones go to the live ranks. The I/O
process dying stops everything, unless ``--state-dir`` is given: then the master starts a new
I/O process with the same config, which takes the running engines over
(docs/RELIABILITY.md), and sends the workers its address; they attach to it in place
(answering 503 meanwhile). The requests in flight are lost, the engines, their caches and the
workers are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from tsfront.commands.base import Command, CommandError, InUse, MissingExtra, UsageError
from tsfront.commands.options import HANDSHAKE_TIMEOUT_S, add_engine_arguments, config_from_args
from tsfront.config import ClientConfig
from tsfront.errors import Error
from tsfront.process.sigint import hold_sigint
from tsfront.process.title import set_title
from tsfront.serve.core.chatsettings import add_chat_arguments, chat_settings, settle
from tsfront.serve.core.seal import secret_from_env
from tsfront.serve.core.templates import add_template_arguments, template_options
from tsfront.serve.edge.settings import add_edge_arguments, edge_settings
from tsfront.serve.processes.store import DEFAULT_BYTES, DEFAULT_ITEMS

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    from tsfront.process.ioproc import IOProcess

__all__ = ["COMMAND", "arguments", "run"]

#: Seconds the workers may take beyond the handshake timeout to attach and listen.
READY_MARGIN_S = 30.0
#: Seconds between two lines saying where the engines' handshake stands while they load.
PROGRESS_S = float(os.environ.get("TSFRONT_SERVE_PROGRESS_S", "20"))
#: Seconds workers get beyond the graceful timeout (or after a cut) before they are killed.
STOP_GRACE_S = 5.0
_WATCH_S = 0.2
#: What ``tsfront serve`` imports beyond the base install (the ``serve`` extra).
SERVE_MODULES = ("tokenizers", "jinja2", "uvicorn", "httptools", "huggingface_hub")


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront serve`` options to ``parser``."""
    parser.add_argument(
        "model_positional",
        nargs="?",
        metavar="MODEL",
        help="the model folder or Hugging Face id, as vLLM's `vllm serve MODEL` (or --model / "
        "--model-path)",
    )
    parser.add_argument(
        "--model",
        "--model-path",
        metavar="DIR_OR_ID",
        help="model folder: tokenizer.json, tokenizer_config.json (chat template), "
        "config.json / generation_config.json; or a Hugging Face id (ORG/NAME), those files "
        "fetched into its cache (HF_HUB_CACHE; HF_HUB_OFFLINE=1: the cache only) "
        "(--model-path: SGLang's name)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR_OR_ID",
        help="the tokenizer's folder or Hugging Face id (tokenizer.json, tokenizer_config.json, "
        "the chat template) when it is not the model's, as vLLM's --tokenizer",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accepted for vLLM's command line: tsfront parses tool calls of tool_choice "
        '"auto" whenever --tool-call-parser is given (which this flag then requires)',
    )
    parser.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model's name in the API (default: the folder's name, or the Hugging Face id)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="the context in tokens (prompt + output) a request may span; the server enforces "
        "the smallest of N, the engines' and the model folder's (default: theirs)",
    )
    parser.add_argument(
        "--encode-cache-mb",
        type=int,
        default=None,
        metavar="MB",
        help="the workers' shared store of long prompts' token ids, so that a conversation's "
        "next turn encodes only its new text (docs/TEXT.md: ~8 bytes a cached token; "
        "default 64; 0: none)",
    )
    src = parser.add_argument_group("I/O process").add_mutually_exclusive_group(required=True)
    engines = add_engine_arguments(
        parser,
        handshake_timeout=HANDSHAKE_TIMEOUT_S,
        num_engines=1,
        handshake_in=src,
        load_balance=False,
    )
    src.add_argument(
        "--attach",
        metavar="IO_ADDRESS",
        help="use a running I/O process (the address `tsfront io` prints) instead of starting "
        "one (--handshake); the engine options are then that process's",
    )
    engines.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the engines' registrations in DIR; if the I/O process dies, a new one takes "
        "the running engines over and the workers start again on it (needs fixed addresses)",
    )
    engines.add_argument(
        "--slots-per-worker",
        type=int,
        default=2048,
        metavar="S",
        help="requests one worker may have in flight; one more is answered 503 (2048)",
    )
    http = parser.add_argument_group("HTTP")
    http.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a request may take from submission to its last token; past it the "
        "engine request is aborted and the client gets a timeout error (default: none)",
    )
    http.add_argument("--workers", type=int, default=1, metavar="W", help="worker processes (1)")
    http.add_argument("--host", default="127.0.0.1", help="address to serve on (127.0.0.1)")
    http.add_argument(
        "--port", type=int, default=8000, metavar="P", help="port; 0 picks a free one (8000)"
    )
    http.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve GET /metrics on this port of --host instead of the API port (0: a free "
        "one, printed)",
    )
    http.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM/SIGINT, seconds running requests get to finish before they are cut "
        "(30; a second signal cuts at once)",
    )
    sup = parser.add_argument_group("worker supervision")
    sup.add_argument(
        "--worker-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="a worker whose event loop sends no heartbeat for S seconds is killed and "
        "replaced (30)",
    )
    sup.add_argument(
        "--max-worker-restarts",
        type=int,
        default=10,
        metavar="N",
        help="replace at most N dead workers within --worker-restart-window; one more death "
        "stops the server, exit 1 (10; 0: a worker dying stops the server)",
    )
    sup.add_argument(
        "--worker-restart-window",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds of the restart budget's window (60)",
    )
    store = parser.add_argument_group("responses store (/v1/responses with store: true)")
    store.add_argument(
        "--responses-store-items",
        type=int,
        default=DEFAULT_ITEMS,
        metavar="N",
        help=f"stored responses kept, least recently used out first ({DEFAULT_ITEMS})",
    )
    store.add_argument(
        "--responses-store-bytes",
        type=int,
        default=DEFAULT_BYTES,
        metavar="B",
        help=f"bytes of stored responses kept ({DEFAULT_BYTES})",
    )
    add_chat_arguments(parser)
    add_edge_arguments(parser)
    add_template_arguments(parser)


def _shown_arguments(argv: list[str]) -> str:
    """The command line ps shows after ``tsfront: master`` (`tsfront.process.title`): the arguments,
    an API key's value masked (the original command line showed it to every user of the
    machine; the title, written over it, does not)."""
    shown = ["serve"]
    for arg in argv:
        if shown[-1] == "--api-key":
            arg = "***"
        elif arg.startswith("--api-key="):
            arg = "--api-key=***"
        shown.append(arg)
    return " ".join(shown)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _note(message: str) -> None:
    sys.stderr.write(f"tsfront serve: {message}\n")
    sys.stderr.flush()


def _wait_ready(
    events: Queue[Any],
    procs: list,
    io: IOProcess | None,
    stop: threading.Event,
    args: argparse.Namespace,
    url: str,
) -> bool:
    """Wait until every worker is ready (listens, and every engine registered); False if told
    to stop meanwhile. Says once when the port answers, and every `PROGRESS_S` where the
    engines' handshake stands."""
    deadline = time.monotonic() + args.handshake_timeout + READY_MARGIN_S
    t0 = time.monotonic()
    ready: set[int] = set()
    listening: set[int] = set()
    progress: dict[str, Any] | None = None  # the latest a worker reported
    said = t0
    while len(ready) < len(procs):
        if stop.is_set():
            return False
        now = time.monotonic()
        if now > deadline:
            raise Error("the workers did not attach and listen in time")
        if progress is not None and now - said >= PROGRESS_S:
            said = now
            _note(_progress_line(progress, now - t0))
        try:
            kind, index, payload = events.get(timeout=_WATCH_S)
        except queue.Empty:
            if io is not None and not io.alive():
                raise Error("the I/O process exited") from None
            dead = [p.name for p in procs if p.exitcode is not None]
            if dead:
                raise Error(f"{dead[0]} exited before serving") from None
            continue
        if kind == "failed":
            raise Error(f"worker {index} failed: {payload}")
        if kind == "handshake":
            raise Error(payload)  # the I/O process's own words: what to check, where
        if kind == "engines":
            progress = payload
        elif kind == "listening":
            listening.add(index)
            if len(listening) == len(procs) and len(ready) < len(procs):
                _note(
                    f"{url} answers: /liveness 200; /readiness, /health and the API 503 "
                    "until every engine registered"
                )
        elif kind == "ready":
            ready.add(index)
    return True


def _progress_line(progress: dict[str, Any], waited: float) -> str:
    """Where the engines' handshake stands, for the operator (`PROGRESS_S`)."""
    first = progress["first"]
    registered, missing = [], []
    for rank, state in enumerate(progress["states"]):
        name = f"rank {rank} (engine {first + rank})"
        if state in ("live", "stalled"):
            registered.append(name)
        else:
            missing.append(name if state == "absent" else f"{name}: {state}")
    address = progress["handshake"]
    dial = ""
    if address and address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        dial = f" (TokenSpeed's --data-parallel-address {host} --data-parallel-rpc-port {port})"
    return (
        f"waiting for the engines ({waited:.0f}s of {progress['timeout']:g}s): registered: "
        f"{', '.join(registered) or 'none'}; missing: {', '.join(missing) or 'none'}; "
        f"they dial {address}{dial}; engines handshake once per start: restart any that "
        "registered with an earlier frontend"
    )


def _stop_workers(procs: list, grace: float, signals: list[int], cut: bool = False) -> None:
    """SIGTERM (drain), wait up to ``grace`` + `STOP_GRACE_S`; a second signal in ``signals``
    (or ``cut``) sends the second SIGTERM (cut at once); SIGKILL what is left."""
    live = [p for p in procs if p.exitcode is None]
    for proc in live:
        proc.terminate()
    seen = len(signals)
    limit = time.monotonic() + grace + STOP_GRACE_S
    while live:
        if cut or len(signals) > seen:
            if not cut:  # a second signal (stopping on an error cuts without a word)
                _note(f"cutting {len(live)} worker(s)' running requests now")
            cut, seen = False, len(signals)
            for proc in live:
                proc.terminate()
            limit = min(limit, time.monotonic() + STOP_GRACE_S)
        left = limit - time.monotonic()
        if left <= 0:
            break
        multiprocessing.connection.wait([p.sentinel for p in live], min(left, _WATCH_S))
        live = [p for p in live if p.exitcode is None]
    for proc in live:
        _note(f"{proc.name} (pid {proc.pid}) did not stop in time; killing it")
        proc.kill()
        proc.join(1.0)
    for proc in procs:
        proc.join(0)


def _require_extras() -> None:
    MissingExtra.check("tsfront serve", SERVE_MODULES, "serve")


def _check(args: argparse.Namespace) -> None:
    def bad(message: str) -> UsageError:
        return UsageError("tsfront serve", message)

    # A bad command line exits 2 pointing at --help, as every command's does.
    if args.model_positional is not None:
        if args.model is not None and args.model != args.model_positional:
            raise bad(f"two models: {args.model_positional!r} and --model {args.model!r}")
        args.model = args.model_positional
    if args.model is None:
        raise bad("give the model folder or id: tsfront serve MODEL (or --model MODEL)")
    if args.encode_cache_mb is not None and args.encode_cache_mb < 0:
        raise bad(f"--encode-cache-mb={args.encode_cache_mb}: give 0 (none) or a size in MiB")
    if args.enable_auto_tool_choice and args.tool_call_parser in (None, "none"):
        raise bad("--enable-auto-tool-choice needs --tool-call-parser NAME (the calls' format)")
    if args.max_model_len is not None and args.max_model_len < 3:
        raise bad(
            f"--max-model-len={args.max_model_len}: must be at least 3 (the engine keeps 2 "
            "positions of every request)"
        )
    if not 1 <= args.workers <= 256:
        raise bad(f"--workers={args.workers}: must be between 1 and 256")
    if args.responses_store_items < 0 or args.responses_store_bytes < 0:
        raise bad("--responses-store-items and --responses-store-bytes must be >= 0 (0: keep none)")
    if not 1 <= args.slots_per_worker <= 65536:
        raise bad(f"--slots-per-worker={args.slots_per_worker}: must be 1..65536")
    if args.attach is not None and args.slots_per_worker != 2048:
        raise bad(
            "--slots-per-worker belongs to the I/O process: give it to `tsfront io` with --attach"
        )
    if args.state_dir is not None and args.attach is not None:
        raise bad("--state-dir belongs to the I/O process: give it to `tsfront io`")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise bad(f"--request-timeout={args.request_timeout:g}: must be > 0 seconds")
    if not args.stall_timeout >= 0:
        raise bad(f"--stall-timeout={args.stall_timeout:g}: must be >= 0 (0: never)")
    if not args.stall_fail_timeout >= 0:
        raise bad(f"--stall-fail-timeout={args.stall_fail_timeout:g}: must be >= 0 (0: never)")
    for option in ("stall_timeout", "stall_fail_timeout"):
        if args.attach is not None and getattr(args, option) != getattr(ClientConfig(), option):
            flag = "--" + option.replace("_", "-")
            raise bad(f"{flag} belongs to the I/O process: give it to `tsfront io` with --attach")
    if not args.worker_timeout > 0:
        raise bad(f"--worker-timeout={args.worker_timeout:g}: must be above 0 seconds")
    if not args.graceful_timeout >= 0:
        raise bad(f"--graceful-timeout={args.graceful_timeout:g}: must be 0 seconds or more")
    if args.max_worker_restarts < 0:
        raise bad(f"--max-worker-restarts={args.max_worker_restarts}: must be 0 or more")
    if not args.worker_restart_window > 0:
        raise bad(f"--worker-restart-window={args.worker_restart_window:g}: must be above 0")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise bad(f"--metrics-port={args.metrics_port}: must be 0..65535")
    if args.metrics_port is not None and args.metrics_port == args.port != 0:
        raise bad("--metrics-port must differ from --port")


def run(args: argparse.Namespace) -> int:
    """Run the server until SIGINT/SIGTERM; returns the exit status."""
    # From the start: a stop at any moment of start-up is an orderly one (exit 0), never a
    # KeyboardInterrupt in the middle of starting a process.
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        signals.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args, stop, signals)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _encode_cache(args: argparse.Namespace) -> Any:
    """The workers' shared encode cache: an unlinked file mapped by every worker (multiprocessing
    passes its descriptor at spawn, as for the counters; its pages are taken only as written),
    or ``False`` for none."""
    from multiprocessing.heap import Arena

    from tsfront.text.encode_cache import DEFAULT_CACHE_MB, new_cache

    mb = DEFAULT_CACHE_MB if args.encode_cache_mb is None else args.encode_cache_mb
    if mb <= 0:
        return False
    arena = Arena(mb << 20)
    new_cache(arena.buffer)
    return arena


def _run(args: argparse.Namespace, stop: threading.Event, signals: list[int]) -> int:
    from tsfront.process.ioproc import IOProcess
    from tsfront.serve.processes.counters import ServeCounters
    from tsfront.serve.processes.ports import PortInUse, claim_port
    from tsfront.serve.processes.store import StoreProcess
    from tsfront.serve.processes.supervisor import Place, RestartPolicy, Supervisor
    from tsfront.serve.processes.worker import WorkerOptions, worker_main

    _check(args)
    set_title("master", detail=_shown_arguments(getattr(args, "argv", [])))
    # The engine options are judged here, with the command line, before anything loads.
    config = None
    if args.attach is None:
        config = config_from_args(
            args,
            max_workers=args.workers,
            slots_per_worker=args.slots_per_worker,
            state_dir=args.state_dir,
        )
    try:
        edge = edge_settings(args)
        chat = chat_settings(args)
        # One seal for every worker: any of them verifies what another sealed.
        reasoning_key = secret_from_env()
    except ValueError as exc:
        raise UsageError("tsfront serve", str(exc)) from None
    _require_extras()  # before anything starts: no I/O process for a worker that cannot run
    from tsfront.text import TextError, TextModel

    try:  # fail here, once, rather than in every worker
        text = TextModel.load(args.model, args.tokenizer)
    except (TextError, OSError) as exc:
        given = f"--model {args.model}"
        if args.tokenizer is not None:
            given += f" --tokenizer {args.tokenizer}"
        raise CommandError(f"{given}: {exc}") from None
    name = args.served_model_name or text.name
    try:
        chat_template, template_kwargs = template_options(args, text.template_names)
    except ValueError as exc:
        raise UsageError("tsfront serve", str(exc)) from None
    try:
        chat, notes = settle(chat, text, chat_template)
    except ValueError as exc:
        raise UsageError("tsfront serve", str(exc)) from None
    if args.enable_auto_tool_choice and chat.tool_parser is None:
        raise UsageError(
            "tsfront serve",
            "--enable-auto-tool-choice needs --tool-call-parser NAME (the calls' format): "
            "auto found no tool-call format certain for this model folder",
        )
    # What start-up found out, said once the port is ours: a refused port stays one line.
    notices = list(notes)
    if chat.harmony:
        from tsfront.text.harmony import load_encoding

        try:  # here, once: its vocabulary is written from the model's tokenizer if need be
            load_encoding(text)
        except TextError as exc:
            raise CommandError(f"--model {args.model}: {exc}") from None
    elif chat_template is None and not text.chat_template:
        notices.append(
            f"warning: {args.tokenizer or args.model} has no chat template (no chat_template "
            "in tokenizer_config.json, no chat_template.jinja or .json): chat requests "
            "(/v1/chat/completions, /v1/responses) will be refused; give one with "
            "--chat-template FILE"
        )

    if stop.is_set():  # a signal while the model loaded: nothing started yet
        _note("stopped before starting")
        return 0
    encode_cache = _encode_cache(args)
    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    places: list[Place] = []
    addresses: dict[int, Queue[Any]] = {}
    io = None
    store = None
    # Each port's sockets, one per worker place (tsfront.serve.processes.ports): claimed before
    # anything starts, given to the workers, kept for their replacements, closed first when
    # stopping.
    listeners: list = []
    cut = True  # stopping on an error: no drain
    try:
        try:
            listeners.append(claim_port(args.host, args.port, args.workers))
            if args.metrics_port is not None:
                listeners.append(claim_port(args.host, args.metrics_port, args.workers))
        except PortInUse as exc:
            raise InUse(str(exc)) from None
        for line in notices:
            _note(line)
        port = listeners[0][0].getsockname()[1]
        metrics_port = None if len(listeners) < 2 else listeners[1][0].getsockname()[1]
        if config is not None:
            io = IOProcess.start(config)
            address = io.address
            _say(f"handshake: {io.handshake_address}")
            _note(f"I/O process {io.pid}; waiting for {args.num_engines} engine(s)")
        else:
            address = args.attach
            _note(f"attaching {args.workers} worker(s) to the I/O process at {address}")
        store = StoreProcess.start(args.responses_store_items, args.responses_store_bytes)
        _note(f"responses store process {store.pid}")
        opts = WorkerOptions(
            responses_store=store.address,
            # Folders: a Hugging Face id was looked up once, here, not in every worker.
            model=str(text.folder),
            tokenizer=None if args.tokenizer is None else str(text.tokenizer_folder),
            model_name=name,
            host=args.host,
            port=port,
            address=address,
            attach_timeout=args.handshake_timeout + READY_MARGIN_S,
            request_timeout=args.request_timeout,
            edge=edge,
            chat=chat,
            graceful_timeout=args.graceful_timeout,
            worker_timeout=args.worker_timeout,
            metrics_port=metrics_port,
            chat_template=chat_template,
            template_kwargs=template_kwargs,
            max_model_len=args.max_model_len,
            reasoning_key=reasoning_key,
            encode_cache=encode_cache,
        )
        counters = ServeCounters(
            ctx.RawArray("Q", ServeCounters.words_for(args.workers)), args.workers
        )

        def spawn(index: int) -> Any:
            # With a state directory the workers outlive an I/O process: each gets its
            # successor's address on a queue of its own (a fresh one for a replacement).
            if args.state_dir:
                old = addresses.pop(index, None)
                if old is not None:
                    old.cancel_join_thread()
                    old.close()
                addresses[index] = ctx.Queue()
            # Ctrl-C held off while it starts: it ignores SIGINT first thing (ignore_sigint).
            hold = hold_sigint()
            proc = ctx.Process(
                target=worker_main,
                args=(
                    index,
                    opts,
                    events,
                    addresses.get(index),
                    counters,
                    [socks[index] for socks in listeners],
                ),
                name=f"tsfront-serve-{index}",
            )
            try:
                proc.start()
            finally:
                hold.release()
            return proc

        for index in range(args.workers):
            places.append(Place(index, spawn(index), since=time.monotonic()))
        host = f"[{args.host}]" if ":" in args.host else args.host
        if not _wait_ready(
            events, [p.proc for p in places], io, stop, args, f"http://{host}:{port}"
        ):
            cut = False
            _note("stopping before the engines registered")
            return 0
        now = time.monotonic()
        for place in places:
            place.move("ready", now)
            place.ready_ns = time.monotonic_ns()
        _say(f"listening: http://{host}:{port}")
        if metrics_port is not None:
            _say(f"metrics: http://{host}:{metrics_port}/metrics")
        _note(f"{args.workers} worker(s) serving {name!r}; SIGINT/SIGTERM drains and stops")
        sup = Supervisor(
            places,
            spawn,
            RestartPolicy(args.max_worker_restarts, args.worker_restart_window),
            counters,
            args.worker_timeout,
            args.handshake_timeout + READY_MARGIN_S,
            _note,
        )
        reattaching: set[int] = set()
        t0 = 0.0
        while not stop.is_set():
            try:
                kind, index, payload = events.get(timeout=_WATCH_S)
            except queue.Empty:
                kind = None
            now = time.monotonic()
            if kind == "reattached" and index in reattaching:
                reattaching.discard(index)
                if not reattaching and io is not None:
                    _note(
                        f"I/O process {io.pid} took the engines over; the workers re-attached "
                        f"{now - t0:.2f}s after the restart began"
                    )
            elif kind is not None:
                sup.on_event(kind, index, payload, now)
            if stop.is_set():
                break
            if io is not None and not io.alive():
                if args.state_dir is None:
                    raise Error("the I/O process exited; stopping (--state-dir restarts it)")
                # A new I/O process on the same config and state directory takes the running
                # engines over; the workers attach to it in place, replacements start on it.
                t0 = now
                _note(
                    f"the I/O process {io.pid} exited; starting a new one on {args.state_dir} "
                    "(the engines keep running)"
                )
                io.stop()  # reap it
                assert config is not None  # only a process we started dies here
                io = IOProcess.start(config)
                opts = dataclasses.replace(opts, address=io.address)
                reattaching = {p.index for p in places if p.state == "serving"}
                for i in reattaching:
                    addresses[i].put(io.address)
                continue
            if store is not None and not store.alive():
                # Same address: the workers' clients connect to the new one by themselves.
                _note(f"the responses store process {store.pid} exited; starting a new one")
                store = store.restart()
                _note(f"responses store process {store.pid}")
            sup.tick(now)
        cut = False
        _note(
            f"stopping: draining the workers (up to {args.graceful_timeout:g}s; "
            "a second signal cuts at once)"
        )
        return 0
    finally:
        # The master's copies first: once a draining worker closes its own, its socket is
        # gone, and the kernel sends new connections to the workers still serving (or
        # refuses them), instead of queueing them where nobody accepts any more.
        for socks in listeners:
            for sock in socks:
                sock.close()
        _stop_workers([p.proc for p in places], args.graceful_timeout, signals, cut)
        for q in addresses.values():
            q.close()
            q.join_thread()
        if io is not None:
            io.stop()
        if store is not None:
            store.stop()
        events.close()
        events.join_thread()


COMMAND = Command(
    name="serve",
    help="serve the OpenAI API (completions, chat) from W worker processes",
    description="Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, "
    "/health, /liveness, /readiness) from W worker processes on one port, for an engine "
    "group that dials --handshake. Prints 'handshake: ADDR'; the port answers its probes at "
    "once (/readiness 503 while the engines load); prints 'listening: http://HOST:PORT' once "
    "every engine registered. SIGINT/SIGTERM stop it (exit 0).",
    arguments=arguments,
    run=run,
)
