"""``tsfront bench routing``: what each placement policy does to the engines' prefix caches.

A synthetic multi-turn conversation trace (many sessions; each turn's prompt is the previous
prompt + a reply + a new user message; a few system prompts shared by all sessions) is
replayed, a fixed number of sessions at a time, against simulated ranks whose prefix caches
are as finite as their KV pool (`tsfront.sim`, ``prefix_cache_pages = kv_total_pages``). For
each policy a fresh I/O process and fresh ranks serve the whole trace; the figures are:

- **hit rate**: cached ÷ prompt tokens, summed from the ranks' own ``cached_tokens``;
- **load spread**: the busiest rank's requests ÷ the mean over ranks;
- **routing CPU**: µs per request of `Router.choose` replayed on the same trace in this process
  (with the workers' block hashes for `PREFIX_AFFINITY`, as the I/O process gets them), plus
  what a worker spends hashing a prompt, and what the I/O process would spend hashing the ADD
  payload itself.

Plus the **ideal** (every turn pinned to the rank that serves its session) and, where
``tokenspeed-smg`` is installed (``.smg-venv/bin/smg`` or ``--smg``), the SMG gateway's
``cache_aware`` policy in front of the same simulated ranks on the same trace (prompts sent as
text through a word-level tokenizer whose words are the token ids).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tsfront.bench.smg import find_smg, free_port, handshake_port, launch_command
from tsfront.config import ClientConfig, LoadBalance, Routing

if TYPE_CHECKING:
    from tsfront.sim import SimGroup

POLICIES = (LoadBalance.LEAST_IN_FLIGHT, LoadBalance.ROUND_ROBIN, LoadBalance.PREFIX_AFFINITY)
VOCAB = 32000


@dataclass
class RoutingParams:
    """The trace and the simulated ranks."""

    sessions: int = 160
    min_turns: int = 3
    max_turns: int = 8
    system_prompts: int = 4
    system_tokens: tuple[int, int] = (300, 1200)
    user_tokens: tuple[int, int] = (20, 300)
    reply_tokens: tuple[int, int] = (50, 400)
    concurrency: int = 32
    ranks: int = 4
    page_size: int = 64
    kv_pages: int = 1024  # per rank: its KV pool and its prefix cache's capacity
    max_new_tokens: int = 4
    step_ms: float = 2.0
    seed: int = 1
    smg: str | None = None  # the smg executable; None: look for it; "": do not run it

    @classmethod
    def quick(cls) -> RoutingParams:
        """A small trace: seconds, for the test command."""
        return cls(sessions=24, concurrency=8, max_turns=5, kv_pages=256, smg="")


def make_trace(p: RoutingParams) -> list[list[list[int]]]:
    """Sessions, each a list of turn prompts (token ids)."""
    rng = random.Random(p.seed)

    def tokens(span: tuple[int, int]) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(rng.randint(*span))]

    systems = [tokens(p.system_tokens) for _ in range(p.system_prompts)]
    trace = []
    for _ in range(p.sessions):
        prompt = rng.choice(systems) + tokens(p.user_tokens)
        turns = [prompt]
        for _ in range(rng.randint(p.min_turns, p.max_turns) - 1):
            prompt = prompt + tokens(p.reply_tokens) + tokens(p.user_tokens)
            turns.append(prompt)
        trace.append(turns)
    return trace


# ---------------------------------------------------------------------- tsfront replay


def _sim_options(p: RoutingParams) -> dict:
    return {
        "step_ms": p.step_ms,
        "page_size": p.page_size,
        "kv_total_pages": p.kv_pages,
        "prefix_cache_pages": p.kv_pages,
        "max_model_len": 32768,
    }


def _settled_counters(sim: SimGroup, finished: int, timeout: float = 10.0) -> list[dict]:
    """The ranks' counters once they count ``finished`` requests in all (a rank counts a
    request just after sending its last frame, so the client may see the end first)."""
    deadline = time.monotonic() + timeout
    while True:
        counters = [sim.engine(i).counters() for i in sim.engine_indices]
        if sum(c["finished"] for c in counters) >= finished or time.monotonic() > deadline:
            return counters
        time.sleep(0.01)


def _figures(sim: SimGroup, p: RoutingParams, wall: float, finished: int) -> dict:
    counters = _settled_counters(sim, finished)
    prompt = sum(c["prompt_tokens"] for c in counters)
    cached = sum(c["cached_tokens"] for c in counters)
    requests = [c["finished"] for c in counters]
    mean = sum(requests) / len(requests)
    return {
        "hit_rate": cached / prompt if prompt else 0.0,
        "load_spread": max(requests) / mean if mean else float("nan"),
        "requests_per_rank": requests,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "wall_s": wall,
    }


async def _replay_tsfront(
    trace: list[list[list[int]]], p: RoutingParams, policy: LoadBalance, ideal: bool
) -> dict:
    from tsfront.client.engine_client import EngineClient
    from tsfront.process.ioproc import IOProcess
    from tsfront.sim import SimGroup
    from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

    cfg = ClientConfig(
        handshake_address="tcp://127.0.0.1:0",
        input_address="tcp://127.0.0.1:0",
        output_address="tcp://127.0.0.1:0",
        num_engines=p.ranks,
        routing=Routing.aggregated(policy),
        handshake_timeout=60.0,
    )
    io = await asyncio.to_thread(IOProcess.start, cfg)
    sim = None
    client = None
    try:
        sim = SimGroup(io.handshake_address, p.ranks, **_sim_options(p)).start()
        client = await EngineClient.attach(io.address, timeout=60.0)
        pending = collections.deque(range(len(trace)))

        async def session_runner() -> None:
            while pending:
                s = pending.popleft()
                for t, ids in enumerate(trace[s]):
                    req = TokenizedGenerateReqInput(
                        rid=f"s{s}t{t}",
                        input_ids=ids,
                        stream=True,
                        sampling_params=SamplingParams(
                            max_new_tokens=p.max_new_tokens, ignore_eos=True
                        ),
                        data_parallel_rank=(s % p.ranks) if ideal else None,
                    )
                    async for _chunk in await client.generate(req):
                        pass

        t0 = time.monotonic()
        await asyncio.gather(*(session_runner() for _ in range(p.concurrency)))
        wall = time.monotonic() - t0
        turns = sum(len(s) for s in trace)
        return await asyncio.to_thread(_figures, sim, p, wall, turns)
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(io.stop)  # first: the ranks' goodbyes are no news
        if sim is not None:
            await asyncio.to_thread(sim.stop)


# ---------------------------------------------------------------------- routing CPU


def _interleaved(trace: list[list[list[int]]]) -> list[list[int]]:
    """The trace's prompts in an order like the replay's: turn by turn across sessions."""
    out: list[list[int]] = []
    for t in range(max(len(s) for s in trace)):
        out.extend(s[t] for s in trace if t < len(s))
    return out


def routing_cpu(
    trace: list[list[list[int]]], p: RoutingParams, policy: LoadBalance, repeat: int = 3
) -> dict:
    """µs of `Router.choose` per request on this trace (best of ``repeat``), with
    ``p.concurrency`` requests kept in flight; for `PREFIX_AFFINITY` also the worker's hashing
    and the I/O-side hashing alternative."""
    import zmq

    from tsfront.io.affinity import group_block_tokens, packed_hashes
    from tsfront.io.engines import Engine, EngineState
    from tsfront.io.routing import Router
    from tsfront.wire import (
        EngineRegistration,
        SamplingParams,
        TokenizedGenerateReqInput,
        encode_add,
    )

    prompts = _interleaved(trace)
    payloads = [
        zmq.Frame(
            encode_add(
                TokenizedGenerateReqInput(
                    rid=f"r{i}", input_ids=ids, sampling_params=SamplingParams()
                )
            )
        )
        for i, ids in enumerate(prompts)
    ]
    cfg = ClientConfig(num_engines=p.ranks, routing=Routing.aggregated(policy))
    block = group_block_tokens([p.page_size], cfg.prefix_block_tokens)
    t0 = time.thread_time()
    packed = [packed_hashes(ids, block) for ids in prompts]
    worker_us = (time.thread_time() - t0) / len(prompts) * 1e6
    hashes = [zmq.Frame(h) for h in packed]
    tokens = sum(len(ids) for ids in prompts) / len(prompts)

    def run(with_hashes: bool) -> float:
        router = Router(policy, cfg.load_ttl, cfg)
        reg = EngineRegistration(
            prefix_granularity=p.page_size, kv_cache_size_tokens=p.kv_pages * p.page_size
        )
        engines = [
            Engine(row=i, index=i, state=EngineState.LIVE, registration=reg) for i in range(p.ranks)
        ]
        if router.affinity is not None:
            for e in engines:
                router.affinity.registered(e)
        window: collections.deque = collections.deque()
        # Every engine is live: choose never returns None here (typed so, nothing per call).
        choose = cast("Callable[..., Engine]", router.choose)
        t = time.thread_time()
        for payload, h in zip(payloads, hashes):
            e = choose(engines, payload, h if with_hashes else None)
            e.in_flight += 1
            window.append(e)
            if len(window) > p.concurrency:
                window.popleft().in_flight -= 1
        return (time.thread_time() - t) / len(payloads) * 1e6

    out = {
        "us_per_request": min(run(True) for _ in range(repeat)),
        "mean_prompt_tokens": tokens,
    }
    if policy is LoadBalance.PREFIX_AFFINITY:
        out["worker_hash_us_per_request"] = worker_us
        out["io_hashing_us_per_request"] = min(run(False) for _ in range(repeat))
    return out


# ---------------------------------------------------------------------- SMG


def write_word_model(folder: Path) -> None:
    """A model folder whose tokenizer maps the word ``w<id>`` to token ``id`` (and nothing
    else), so a prompt sent as text reaches the engine as exactly the trace's ids."""
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    }
    files = {
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": "w2",
            "bos_token": None,
            "unk_token": "w0",
            "model_max_length": 32768,
            "clean_up_tokenization_spaces": False,
        },
        "config.json": {
            "model_type": "tsfront-bench-words",
            "vocab_size": VOCAB,
            "max_position_embeddings": 32768,
            "eos_token_id": 2,
        },
    }
    for name, data in files.items():
        (folder / name).write_text(json.dumps(data))


@contextlib.contextmanager
def _smg_gateway(smg: str, p: RoutingParams, folder: Path) -> Iterator[tuple[str, int]]:
    """SMG with ``cache_aware`` bound for ``p.ranks`` engines; (url, handshake port)."""
    worker = f"ipc://{folder}/w0.ipc"
    handshake = handshake_port(smg, worker)
    port = free_port()
    proc = subprocess.Popen(
        launch_command(
            smg,
            port=port,
            worker_url=worker,
            model_dir=str(folder),
            engines=p.ranks,
            policy="cache_aware",
        ),
        stdout=subprocess.DEVNULL,
        stderr=(folder / "smg.log").open("w"),
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{port}", handshake
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _complete(
    url: str, model: str, ids: list[int], max_tokens: int, timeout: float = 120.0
) -> dict:
    body = json.dumps(
        {
            "model": model,
            "prompt": " ".join(f"w{t}" for t in ids),
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def replay_smg(trace: list[list[list[int]]], p: RoutingParams, smg: str) -> dict:
    """The trace through SMG's cache_aware policy, in front of the same simulated ranks."""
    from tsfront.sim import SimGroup

    folder = Path(tempfile.mkdtemp(prefix="tsfront-bench-smg-"))
    sim = None
    try:
        write_word_model(folder)
        with _smg_gateway(smg, p, folder) as (url, handshake):
            sim = SimGroup(f"tcp://127.0.0.1:{handshake}", p.ranks, **_sim_options(p)).start()
            sim.wait_registered(30)
            deadline = time.monotonic() + 60
            while True:  # until the gateway serves (it may register the engines later)
                try:
                    _complete(url, str(folder), [5], 1, timeout=5)
                    break
                except (urllib.error.URLError, OSError):
                    if time.monotonic() > deadline:
                        raise RuntimeError("SMG did not serve within 60 s") from None
                    time.sleep(0.2)
            base = [sim.engine(i).counters() for i in sim.engine_indices]
            pending = collections.deque(range(len(trace)))
            lock = threading.Lock()
            errors: list[str] = []

            def runner() -> None:
                while True:
                    with lock:
                        if not pending:
                            return
                        s = pending.popleft()
                    for ids in trace[s]:
                        try:
                            _complete(url, str(folder), ids, p.max_new_tokens)
                        except Exception as exc:  # counted: the table says how many failed
                            errors.append(repr(exc))

            t0 = time.monotonic()
            threads = [threading.Thread(target=runner) for _ in range(p.concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            turns = sum(len(s) for s in trace)
            figures = _figures(sim, p, wall, turns + sum(b["finished"] for b in base) - len(errors))
            # Take away the warm-up request.
            for key in ("prompt_tokens", "cached_tokens"):
                figures[key] -= sum(b[key] for b in base)
            figures["requests_per_rank"] = [
                r - b["finished"] for r, b in zip(figures["requests_per_rank"], base)
            ]
            prompt, cached = figures["prompt_tokens"], figures["cached_tokens"]
            figures["hit_rate"] = cached / prompt if prompt else 0.0
            req = figures["requests_per_rank"]
            figures["load_spread"] = max(req) / (sum(req) / len(req)) if sum(req) else 0.0
            figures["errors"] = len(errors)
            expected = sum(len(ids) for s in trace for ids in s)
            figures["prompt_tokens_expected"] = expected
            return figures
    except Exception as exc:
        log = folder / "smg.log"
        # Carried to the caller (read with getattr) on whatever was raised.
        exc.smg_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""  # type: ignore[attr-defined]
        raise
    finally:
        if sim is not None:
            sim.stop()
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------- the whole run


def run_routing(p: RoutingParams, *, verbose: bool = True) -> dict:
    """Every policy, the ideal and (if installed) SMG on one trace; the report."""
    trace = make_trace(p)
    turns = sum(len(s) for s in trace)
    tokens = sum(len(ids) for s in trace for ids in s)
    report: dict = {
        "params": dataclasses.asdict(p),
        "trace": {"sessions": len(trace), "requests": turns, "prompt_tokens": tokens},
        "policies": {},
        "skipped": [],
    }

    def say(msg: str) -> None:
        if verbose:
            print(msg, file=sys.stderr, flush=True)

    say(f"trace: {len(trace)} sessions, {turns} requests, {tokens / turns:.0f} tokens a prompt")
    rows = [(policy.value, policy, False) for policy in POLICIES]
    rows.append(("ideal (session pinned)", LoadBalance.LEAST_IN_FLIGHT, True))
    for name, policy, ideal in rows:
        say(f"replaying: {name}")
        figures = asyncio.run(_replay_tsfront(trace, p, policy, ideal))
        if not ideal:
            figures.update(routing_cpu(trace, p, policy))
        report["policies"][name] = figures
    smg = None if p.smg == "" else find_smg(p.smg)
    if p.smg == "":
        report["skipped"].append("SMG: not requested (--no-smg or quick mode)")
    elif smg is None:
        report["skipped"].append(
            "SMG: tokenspeed-smg is not installed (python3 -m venv .smg-venv && "
            ".smg-venv/bin/pip install tokenspeed-smg)"
        )
    else:
        say("replaying: SMG cache_aware")
        # Its engines sometimes never get a handshake from a fresh gateway (seen about one
        # launch in three on the shared test machine, with nothing in its log): one more try,
        # on a new folder (so a new handshake port), before giving up.
        for attempt in (1, 2):
            try:
                report["policies"]["SMG cache_aware"] = replay_smg(trace, p, smg)
                report["smg_attempts"] = attempt
                break
            except Exception as exc:
                say(f"SMG failed: {exc!r}; its log:\n{getattr(exc, 'smg_log', '')}")
                if attempt == 2:
                    report["skipped"].append(f"SMG: failed twice: {exc!r}")
    ideal = report["policies"]["ideal (session pinned)"]["hit_rate"]
    for figures in report["policies"].values():
        figures["hit_vs_ideal"] = figures["hit_rate"] / ideal if ideal else float("nan")
    return report


def print_table(report: dict) -> None:
    """The report as a Markdown table (the one docs/PERFORMANCE.md shows)."""
    t = report["trace"]
    print(
        f"trace: {t['sessions']} sessions, {t['requests']} requests, "
        f"{t['prompt_tokens'] / t['requests']:.0f} prompt tokens a request"
    )
    print()
    print(
        "| policy | hit rate | ÷ ideal | load spread (max/mean) | requests per rank "
        "| routing µs/request |"
    )
    print("|---|---|---|---|---|---|")
    for name, f in report["policies"].items():
        cpu = f.get("us_per_request")
        cpu_text = "—" if cpu is None else f"{cpu:.2f}"
        print(
            f"| {name} | {f['hit_rate']:.3f} | {f['hit_vs_ideal']:.2f} | "
            f"{f['load_spread']:.2f} | {'/'.join(str(r) for r in f['requests_per_rank'])} "
            f"| {cpu_text} |"
        )
    aff = report["policies"].get(LoadBalance.PREFIX_AFFINITY.value)
    if aff is not None:
        print()
        print(
            f"prefix affinity: {aff['us_per_request']:.2f} µs of I/O CPU a request at "
            f"{aff['mean_prompt_tokens']:.0f} prompt tokens (budget "
            f"{5 + 2 * aff['mean_prompt_tokens'] / 1000:.2f}); the worker hashes for "
            f"{aff['worker_hash_us_per_request']:.2f} µs; hashing in the I/O process instead "
            f"would cost {aff['io_hashing_us_per_request']:.2f} µs a request"
        )
    for why in report["skipped"]:
        print(f"skipped: {why}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tsfront bench routing`` (``--quick`` and ``--json`` are the bench's)."""
    g = parser.add_argument_group("routing (tsfront bench routing)")
    g.add_argument("--sessions", type=int, help="routing: conversations in the trace")
    g.add_argument("--routing-concurrency", type=int, help="routing: conversations at once")
    g.add_argument("--kv-pages", type=int, help="routing: KV (and prefix cache) pages per rank")
    g.add_argument("--seed", type=int, help="routing: trace seed")


def run_cli(args: argparse.Namespace) -> int:
    """Run ``tsfront bench routing``."""
    p = RoutingParams.quick() if args.quick else RoutingParams()
    for name, field in (
        ("sessions", "sessions"),
        ("routing_concurrency", "concurrency"),
        ("kv_pages", "kv_pages"),
        ("seed", "seed"),
        ("smg", "smg"),
    ):
        value = getattr(args, name, None)
        if value is not None:
            setattr(p, field, value)
    if getattr(args, "no_smg", False):
        p.smg = ""
    report = run_routing(p, verbose=not args.json)
    if args.json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_table(report)
    return 0
