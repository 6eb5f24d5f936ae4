"""The ``tsfront sim`` command: run simulated TokenSpeed ranks against a frontend.

Runs in the foreground until SIGINT/SIGTERM (then every rank sends ``ENGINE_CORE_DEAD``, as
the engine does on SIGTERM, and the command exits 0). Like TokenSpeed's headless launcher it
exits 1 as soon as any rank dies (a ``--dead-after-steps`` / ``--exit-after-steps`` fault or a
failed handshake), after stopping the others; ``--exit-after-steps`` takes the whole process
down with ``os._exit(1)`` unless ``--processes`` gives each rank its own process.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

from tsfront.commands.base import Command, UsageError, one_line
from tsfront.commands.options import HANDSHAKE_TIMEOUT_S, endpoint

if TYPE_CHECKING:
    from tsfront.sim.group import SimGroup

__all__ = ["COMMAND", "arguments", "group_from_args", "run"]

_FAULTS = ("dead_after_steps", "exit_after_steps", "silent_after_steps")
_WATCH_S = 0.05


def arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``tsfront sim`` options to ``parser``."""
    parser.add_argument(
        "--handshake",
        required=True,
        type=endpoint(tcp_only=True),
        metavar="ADDR",
        help="frontend handshake ROUTER, e.g. tcp://127.0.0.1:30500",
    )
    parser.add_argument(
        "--num-engines",
        type=int,
        default=1,
        metavar="N",
        help="number of ranks (data-parallel size); default 1",
    )
    parser.add_argument(
        "--first-engine-index",
        type=int,
        default=0,
        metavar="K",
        help="identity index of rank 0 (--zmq-engine-index); default 0",
    )
    parser.add_argument(
        "--processes", action="store_true", help="run every rank as its own OS process"
    )
    model = parser.add_argument_group("model and scheduler")
    model.add_argument("--step-ms", type=float, default=2.0, help="time per decode step (2)")
    model.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="requests decoded per step (default max_num_seqs // N)",
    )
    model.add_argument("--max-num-seqs", type=int, default=256, help="global max_num_seqs (256)")
    model.add_argument("--max-model-len", type=int, default=32768, help="context length (32768)")
    model.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="vocabulary size (32000; with --model, the model's)",
    )
    model.add_argument(
        "--eos-token-id",
        type=int,
        default=None,
        help="EOS token id (2; with --model, the model's first eos id)",
    )
    model.add_argument("--page-size", type=int, default=64, help="tokens per KV page (64)")
    model.add_argument("--kv-total-pages", type=int, default=4095, help="usable KV pages (4095)")
    model.add_argument("--stream-interval", type=int, default=1, help="--stream-interval (1)")
    model.add_argument(
        "--chunk-tokens",
        type=int,
        default=1,
        metavar="N",
        help="stream in chunks of 1..N tokens, sizes drawn per request (1: every token)",
    )
    model.add_argument(
        "--no-prefix-cache", action="store_true", help="always report cached_tokens 0"
    )
    model.add_argument(
        "--disable-output-logprobs",
        action="store_true",
        help="abort return_logprob requests (no --enable-output-logprobs)",
    )
    model.add_argument("--instance-id", default="tsfront-sim", help="registration instance_id")
    model.add_argument(
        "--handshake-timeout",
        type=float,
        default=HANDSHAKE_TIMEOUT_S,
        help=f"seconds to wait for INIT ({HANDSHAKE_TIMEOUT_S:g})",
    )
    model.add_argument(
        "--disaggregation-mode",
        choices=("prefill", "decode"),
        default=None,
        help="a PD rank: prefill finishes after its bootstrap token, decode streams (none)",
    )
    script = parser.add_argument_group(
        "scripted output",
        'a JSON list of {"match": TEXT, "output": TEXT} rules: the first rule whose match is '
        "in the prompt (decoded with special tokens kept) answers with its output, encoded by "
        "the model's tokenizer, then EOS; other prompts get the usual tokens. Example: "
        '[{"match": "weather", "output": "<tool_call>\\n{\\"name\\": \\"get_weather\\", '
        '\\"arguments\\": {}}\\n</tool_call>"}]',
    )
    script.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="model folder (tokenizer.json): the vocabulary, eos id and script encoding",
    )
    script.add_argument(
        "--script", default=None, metavar="FILE", help="scripted answers (needs --model)"
    )
    wire = parser.add_argument_group("wire generation")
    wire.add_argument(
        "--output-form",
        type=int,
        default=14,
        help="output array length: 9 (Aug3), 10 (Aug12), 14 (0.1.1), >14 (future)",
    )
    wire.add_argument(
        "--legacy-registration",
        action="store_true",
        help="send Aug3's registration map (block_size, 18 keys)",
    )
    faults = parser.add_argument_group("fault injection (steps that decoded something)")
    faults.add_argument(
        "--dead-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="send ENGINE_CORE_DEAD after N steps, then stop",
    )
    faults.add_argument(
        "--exit-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="exit after N steps without ENGINE_CORE_DEAD",
    )
    faults.add_argument(
        "--silent-after-steps",
        type=int,
        default=None,
        metavar="N",
        help="stop emitting after N steps, sockets stay open",
    )
    faults.add_argument(
        "--fault-ranks",
        default=None,
        metavar="R,R",
        help="0-based ranks the faults apply to (default: all)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (INFO)")


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """vocab_size, eos_token_id and script from --model / --script (or the defaults)."""
    vocab, eos, script = args.vocab_size, args.eos_token_id, None
    if args.script is not None and args.model is None:
        raise ValueError("--script needs --model DIR: the tokenizer that encodes its outputs")
    if args.model is not None:
        from tsfront.sim.script import Script
        from tsfront.text import TextModel

        model = TextModel.load(args.model)
        if vocab is None:
            vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
        if eos is None and model.eos_token_ids:
            eos = model.eos_token_ids[0]
        if args.script is not None:
            script = Script.from_file(args.script, args.model)
    return {
        "vocab_size": 32000 if vocab is None else vocab,
        "eos_token_id": 2 if eos is None else eos,
        "script": script,
    }


def group_from_args(args: argparse.Namespace) -> SimGroup:
    """The `SimGroup` the options describe (not started); raises what `SimGroup` refuses."""
    from tsfront.sim.group import SimGroup

    options: dict[str, Any] = {
        "step_ms": args.step_ms,
        "max_batch": args.max_batch,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "page_size": args.page_size,
        "kv_total_pages": args.kv_total_pages,
        "stream_interval": args.stream_interval,
        "chunk_tokens": args.chunk_tokens,
        "prefix_cache": not args.no_prefix_cache,
        "enable_output_logprobs": not args.disable_output_logprobs,
        "instance_id": args.instance_id,
        "handshake_timeout_s": args.handshake_timeout,
        "output_form": args.output_form,
        "legacy_registration": args.legacy_registration,
        "disaggregation_mode": args.disaggregation_mode,
        # A rank that exits takes this process with it, as a dying rank takes its launcher.
        "hard_exit": True,
        **_model_options(args),
    }
    faults = {name: getattr(args, name) for name in _FAULTS if getattr(args, name) is not None}
    rank_options: dict[int, dict[str, Any]] = {}
    if args.fault_ranks is None:
        options.update(faults)
    else:
        for rank in (int(part) for part in args.fault_ranks.split(",") if part.strip()):
            rank_options[rank] = faults
    return SimGroup(
        args.handshake,
        args.num_engines,
        args.first_engine_index,
        processes=args.processes,
        rank_options=rank_options,
        **options,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``tsfront sim`` until SIGINT/SIGTERM (0) or a rank's death (1)."""
    # What the simulator refuses is a bad command line: one line, exit 2, like every command.
    if not isinstance(logging.getLevelName(args.log_level.upper()), int):
        raise UsageError(
            "tsfront sim",
            f"--log-level={args.log_level!r}: not a logging level; use DEBUG, INFO, WARNING "
            "or ERROR",
        )
    try:
        group = group_from_args(args)
    except (TypeError, ValueError) as exc:
        message = one_line(exc)
        field, sep, rest = message.partition("=")
        if sep and field.isidentifier() and field != "handshake_address":
            # The options are named after the EngineOptions fields (minus the "_s" unit).
            message = f"--{field.removesuffix('_s').replace('_', '-')}={rest}"
        raise UsageError("tsfront sim", message) from None
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda signum, frame: stop.set())
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    group.start()
    try:
        while not stop.wait(_WATCH_S):
            if _any_rank_ended(group):
                logging.getLogger("tsfront.sim").error("a rank died; stopping the group")
                return 1
        return 0
    finally:
        group.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _any_rank_ended(group: SimGroup) -> bool:
    if group.processes:
        return any(code is not None for code in group.exitcodes())
    return any(engine.outcome is not None for engine in group.engines)


COMMAND = Command(
    name="sim",
    help="run simulated TokenSpeed ranks that dial a frontend",
    description="Run simulated TokenSpeed ranks (no GPU) that dial --handshake exactly as "
    "real engines do; serve until SIGINT/SIGTERM. Exits 1 as soon as a rank dies.",
    arguments=arguments,
    run=run,
)
