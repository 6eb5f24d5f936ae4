"""``tsfront bench serve``: the HTTP server's CPU per streamed token, side by side in one run.

For each target — ``tsfront serve`` at each worker count, the other HTTP stacks the server
was chosen against (``--stacks``), and the SMG gateway when installed — the run starts the
target in a session of its own, simulated ranks (``tsfront sim``, their own process: not
counted) that dial it, and a streamed load in another process (`tsfront.bench.serveload`:
not counted). It reads the CPU time of every process in the target's session before and after
the measured load (each thread's time on a CPU in ns, ``/proc/PID/task/*/schedstat``; a
process whose ``/proc/PID/stat`` total, in 10 ms clock ticks, grew by more than that, is
counted by the ticks instead: a thread of it ended in the window, and only the ticks kept its
time), and reports:

* ``cpu_us_per_token`` — that CPU over the streamed tokens (one token per chunk: the
  engines' stream interval is 1), summed over the whole process tree (master, I/O process,
  workers; SMG's one process);
* ``tokens_per_s`` — streamed tokens over the load's wall time;
* ``ttft_p50_ms`` / ``ttft_p99_ms`` — time to the first token of each request.

With ``--repeat N`` every target runs once a round, N rounds; ``ratios`` are the ratios of
the targets' medians, ``ratios_by_round`` the same ratios within each round, with their median
and range (`ratios_by_round`).

The model is the text layer's word-level test model (token ``i`` reads ``w<i>``), written to
a temporary folder; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

from tsfront.bench.cpu import TICK_NS, cpu_ns
from tsfront.bench.smg import find_smg, free_port, handshake_port, launch_command
from tsfront.process.child import python_module

__all__ = ["PRESETS", "ServeParams", "run_serve"]

_TICK_S = TICK_NS / 1e9
_READY_S = 120.0


@dataclass
class ServeParams:
    """What one ``bench serve`` run measures."""

    workers: tuple[int, ...] = (1, 2)
    engines: int = 2
    step_ms: float = 2.0
    concurrency: int = 64
    max_tokens: int = 64
    requests: int = 1024
    warmup_requests: int = 64
    stacks: tuple[str, ...] = ()
    floor_events: int = 32_000  # loopback sends for the send floor (tsfront.bench.floor)
    smg: str | None = None  # None: look for it; "": do not measure it
    repeat: int = 1
    #: "completions" (the word-level model, one short prompt) or "agentic"
    #: (`tsfront.bench.agentic`: a real tokenizer, tools, multi-turn history).
    workload: str = "completions"
    system_tokens: int = 4000  # agentic: the system prompt's size in tokens
    turns: int = 12  # agentic: requests per conversation
    cold: bool = False  # agentic: every conversation its own system prompt, one request
    smg_cache: bool = True  # agentic: SMG with its tokenizer cache (L0 + L1) on

    @classmethod
    def quick(cls) -> ServeParams:
        """A run of a few seconds per target."""
        return cls(requests=256, warmup_requests=32, floor_events=8_000)

    def preset(self, name: str) -> ServeParams:
        """This run with the workload of preset ``name`` (`PRESETS`)."""
        for key, value in PRESETS[name].items():
            setattr(self, key, value)
        return self


#: The three workloads of the per-request / per-token table (docs/PERFORMANCE.md):
#: ``short`` is the per-request cost (agent turns, classification: 2 tokens a request),
#: ``mixed`` a short chat answer, ``long`` the per-token cost at real batch sizes (256
#: streams over two ranks: 128 rows a frame every 20 ms).
#: The agent presets (`tsfront.bench.agentic`): ``agentic`` 8 conversations sharing a ~4k-token
#: system prompt, ``agentic-16k`` 4 sharing a ~16k-token one (SMG's tokenizer cache on, as a
#: production user runs it); ``agentic-cold`` first turns only, each conversation its own
#: ~4k-token system prompt (SMG's cache off: nothing to hit), for the cost per prompt token.
PRESETS: dict[str, dict[str, Any]] = {
    "short": {"concurrency": 64, "max_tokens": 2, "step_ms": 2.0, "requests": 4096},
    "mixed": {"concurrency": 64, "max_tokens": 64, "step_ms": 2.0, "requests": 1024},
    "long": {"concurrency": 256, "max_tokens": 512, "step_ms": 20.0, "requests": 512},
    "agentic": {
        "workload": "agentic", "concurrency": 8, "max_tokens": 256, "step_ms": 2.0,
        "requests": 192, "warmup_requests": 24, "system_tokens": 4000, "turns": 12,
    },
    "agentic-16k": {
        "workload": "agentic", "concurrency": 4, "max_tokens": 256, "step_ms": 2.0,
        "requests": 96, "warmup_requests": 12, "system_tokens": 16000, "turns": 12,
    },
    "agentic-cold": {
        "workload": "agentic", "concurrency": 8, "max_tokens": 256, "step_ms": 2.0,
        "requests": 96, "warmup_requests": 16, "system_tokens": 4000, "cold": True,
        "smg_cache": False,
    },
}  # fmt: skip


@dataclass
class Figures:
    """One target's measurement."""

    target: str
    cpu_us_per_token: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tokens: int
    requests: int
    errors: int
    cpu_s: float
    processes: int
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------- processes


class ProcessCPU(NamedTuple):
    """A process's CPU seconds at one moment, by the two clocks, and its role."""

    ticks: float  # utime + stime of /proc/PID/stat: every thread, ended ones too; 10 ms steps
    exact: float  # its live threads' time on a CPU (schedstat: ns resolution)
    role: str


def used_cpu(before: ProcessCPU | None, after: ProcessCPU) -> tuple[float, bool]:
    """The CPU seconds a process used between two readings (None: it started in between), and
    whether the exact clock gave them: the ticks do when they grew by more than the exact
    clock (two ticks' slack and 5 %), which a thread that ended in the window causes."""
    ticks = after.ticks - (before.ticks if before else 0.0)
    exact = after.exact - (before.exact if before else 0.0)
    if ticks - exact > max(2 * _TICK_S, 0.05 * ticks):
        return ticks, False
    return exact, True


def session_cpu(session: int) -> dict[int, ProcessCPU]:
    """The CPU of every live process in ``session``, with its role."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) != session:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            exact = cpu_ns(entry) / 1e9
        except OSError:
            continue  # it ended while being read
        ticks = (int(fields[11]) + int(fields[12])) * _TICK_S
        found[int(entry)] = ProcessCPU(ticks, exact, _role(cmdline))
    return found


def _role(cmdline: str) -> str:
    # tsfront's processes by their titles (tsfront.process.title), the others by their command
    # lines.
    if cmdline.startswith("tsfront: io") or "tsfront.io.main" in cmdline:
        return "I/O process"
    if cmdline.startswith("tsfront: worker ") or "spawn_main" in cmdline:
        return "worker"
    if cmdline.startswith("tsfront: store"):
        return "responses store"
    if "resource_tracker" in cmdline:
        return "resource tracker"
    if "smg" in cmdline:
        return "smg"
    return "master"


class _Proc:
    """A child in a session of its own, its stdout lines readable with a deadline."""

    def __init__(
        self,
        cmd: list[str],
        env: dict | None = None,
        stdout: int | IO[Any] | None = subprocess.PIPE,
    ) -> None:
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "TSFRONT_LOG": "ERROR", **(env or {})},
            start_new_session=True,
            text=True,
        )

    def line(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        import selectors

        stdout = cast("IO[str]", self.proc.stdout)  # line() is for a child with stdout=PIPE
        sel = selectors.DefaultSelector()
        sel.register(stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    continue
                raw = stdout.readline()
                if not raw:
                    break
                match = re.search(pattern, raw)
                if match:
                    return match
        finally:
            sel.close()
        raise RuntimeError(f"{self.cmd[:4]}... printed no {pattern!r} (exit {self.proc.poll()})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


def _sim(handshake: str, p: ServeParams, model: str) -> _Proc:
    command = python_module(
        "tsfront",
        "sim",
        "--handshake",
        handshake,
        "--num-engines",
        str(p.engines),
        "--step-ms",
        str(p.step_ms),
        "--processes",
        "--log-level",
        "ERROR",
    )
    if p.workload == "agentic":  # the answers of the script: tool calls and text
        command += ["--model", model, "--script", str(Path(model) / "script.json")]
    return _Proc(command, stdout=subprocess.DEVNULL)


def _wait_http(url: str, model: str, timeout: float) -> None:
    """Until one small completion succeeds (the engines registered and the server serves)."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": model, "prompt": "w5", "max_tokens": 2}).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                url + "/v1/completions", body, {"content-type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not serve a completion within {timeout:g}s")


#: The I/O loop's turn counters on a tsfront server's /metrics page (docs/METRICS.md).
_TURNS = re.compile(rb"^tsfront:io_(native_)?turns_total (\S+)$", re.M)


def _io_turns(url: str) -> tuple[float, float] | None:
    """(turns, native turns) of a tsfront server's I/O loop so far, from its /metrics page;
    None for a server without them (SMG)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            page = r.read()
    except (urllib.error.URLError, OSError):
        return None
    found = {bool(m.group(1)): float(m.group(2)) for m in _TURNS.finditer(page)}
    return (found[False], found[True]) if len(found) == 2 else None


@contextlib.contextmanager
def _tsfront(model: str, p: ServeParams, workers: int, stack: str) -> Iterator[tuple[str, int]]:
    env = None
    if stack in ("uvicorn", "pull", "python", "uncached", "pyturn"):
        cmd = python_module("tsfront", "serve", "--workers", str(workers))
        if stack == "uncached":
            # Every prompt encoded whole, as before the encode cache (and its worker's
            # tokenizer thread pool back): what the cache and that lever save.
            cmd += ["--encode-cache-mb", "0"]
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
        if stack == "pull":
            # The server without its hot path (every event through the response's task).
            env = {**os.environ, "TSFRONT_SERVE_PUSH": "0"}
        elif stack == "python":
            # The hot path without its native step (every pushed event through ASGI send).
            env = {**os.environ, "TSFRONT_SERVE_NATIVE": "0"}
        elif stack == "pyturn":
            # The I/O process's every turn in Python (TSFRONT_NATIVE_TURN=0): what the native
            # turn (native/turn.c) saves.
            env = {**os.environ, "TSFRONT_NATIVE_TURN": "0"}
    else:
        cmd = python_module("tsfront.bench.stacks", "--stack", stack)
    cmd += [
        "--model",
        model,
        "--handshake",
        "tcp://127.0.0.1:0",
        "--num-engines",
        str(p.engines),
        "--port",
        "0",
        "--handshake-timeout",
        "60",
    ]
    if p.workload == "agentic":
        from tsfront.bench.agentic import TOOL_PARSERS

        cmd += ["--tool-call-parser", TOOL_PARSERS["tsfront"]]
    server = _Proc(cmd, env=env)
    sim = None
    try:
        handshake = server.line(r"^handshake: (\S+)", _READY_S).group(1)
        sim = _sim(handshake, p, model)
        url = server.line(r"^listening: (http://\S+)", _READY_S).group(1)
        _wait_http(url, "model", _READY_S)
        yield url, server.proc.pid
    finally:
        server.stop()
        if sim is not None:
            sim.stop()


@contextlib.contextmanager
def _smg(smg: str, model: str, p: ServeParams) -> Iterator[tuple[str, int]]:
    folder = tempfile.mkdtemp(prefix="tsfront-smg-")
    worker = f"ipc://{folder}/w0.ipc"
    handshake = handshake_port(smg, worker)
    port = free_port()
    command = launch_command(
        smg, port=port, worker_url=worker, model_dir=model, engines=p.engines, log_level="error"
    )
    if p.workload == "agentic":
        from tsfront.bench.agentic import TOOL_PARSERS

        command += ["--tool-call-parser", TOOL_PARSERS["smg"]]
        if p.smg_cache:
            command += ["--tokenizer-cache-enable-l0", "--tokenizer-cache-enable-l1"]
    server = _Proc(command, stdout=subprocess.DEVNULL)
    sim = _sim(f"tcp://127.0.0.1:{handshake}", p, model)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(url, model, _READY_S)
        yield url, server.proc.pid
    finally:
        server.stop()
        sim.stop()
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------- measuring


def _load(url: str, model: str, p: ServeParams, requests: int, first: int = 0) -> dict:
    if p.workload == "agentic":
        return _agent_load(url, model, p, requests, first)
    out = subprocess.run(
        python_module(
            "tsfront.bench.serveload",
            "--url",
            url,
            "--model",
            model,
            "--concurrency",
            str(p.concurrency),
            "--requests",
            str(requests),
            "--max-tokens",
            str(p.max_tokens),
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout)


def _agent_load(url: str, model: str, p: ServeParams, requests: int, first: int) -> dict:
    """The agent load (`tsfront.bench.agentload`); ``tokens`` are the completion tokens."""
    command = python_module(
        "tsfront.bench.agentload",
        "--url", url, "--model", model, "--tokenizer", str(_agentic_tokenizer()),
        "--concurrency", str(p.concurrency), "--requests", str(requests),
        "--turns", str(p.turns), "--system-tokens", str(p.system_tokens),
        "--max-tokens", str(p.max_tokens), "--first-conversation", str(first),
    )  # fmt: skip
    if p.cold:
        command.append("--cold")
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=1200)
    load = json.loads(out.stdout)
    load["tokens"] = load["completion_tokens"]
    load["events"] = load["requests"]
    load["ttft"] = load["ttft"] + load["ttft_call"]
    return load


def _agentic_tokenizer() -> Path:
    from tsfront.bench.realtok import deepseek_tokenizer

    return deepseek_tokenizer()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _measure(target: str, url: str, session: int, model: str, p: ServeParams) -> Figures:
    _load(url, model, p, p.warmup_requests)
    turns_before = _io_turns(url)
    before = session_cpu(session)
    # Conversations the warm-up did not have (the shared system prompt is the same).
    load = _load(url, model, p, p.requests, first=1_000_000)
    after = session_cpu(session)
    turns_after = _io_turns(url)
    turns: dict[str, float] = {}
    if turns_before is not None and turns_after is not None and load["requests"]:
        # The I/O loop's turns per request, and how many of them were native (the page read
        # after the CPU reading: its own request is not in the figures above).
        turns = {
            "io_turns_per_request": (turns_after[0] - turns_before[0]) / load["requests"],
            "io_native_turns_per_request": (turns_after[1] - turns_before[1]) / load["requests"],
        }
    tokens = load["tokens"]
    by_role: dict[str, float] = {}
    by_ticks: list[str] = []
    for pid, now in after.items():
        used, exact = used_cpu(before.get(pid), now)
        by_role[now.role] = by_role.get(now.role, 0.0) + used
        if not exact:
            by_ticks.append(now.role)
    cpu = sum(by_role.values())
    processes = len(after)
    return Figures(
        target=target,
        cpu_us_per_token=cpu / tokens * 1e6 if tokens else float("nan"),
        tokens_per_s=tokens / load["elapsed"] if load["elapsed"] else 0.0,
        ttft_p50_ms=_percentile(load["ttft"], 0.5) * 1e3,
        ttft_p99_ms=_percentile(load["ttft"], 0.99) * 1e3,
        tokens=tokens,
        requests=load["requests"],
        errors=load["errors"],
        cpu_s=cpu,
        processes=processes,
        note=load.get("error", ""),
        extra={
            "cpu_us_per_request": (
                cpu / load["requests"] * 1e6 if load["requests"] else float("nan")
            ),
            "events": load["events"],
            "tokens_per_event": tokens / max(1, load["events"]),
            **_agent_figures(load, cpu),
            **turns,
            # Processes counted by clock ticks, not exactly (a thread of theirs ended).
            "cpu_by_ticks": sorted(by_ticks),
            "us_per_token_by_process": {
                role: used / tokens * 1e6 if tokens else float("nan")
                for role, used in sorted(by_role.items())
            },
        },
    )


def _agent_figures(load: dict, cpu: float) -> dict:
    """The agent load's own figures: CPU per 1,000 prompt tokens, the mean prompt, TTFT by
    kind of answer."""
    if "prompt_tokens" not in load:
        return {}
    prompt = load["prompt_tokens"]
    return {
        "cpu_ms_per_1k_prompt_tokens": cpu / prompt * 1e6 if prompt else float("nan"),
        "mean_prompt_tokens": prompt / max(1, load["requests"]),
        "tool_calls": load["tool_calls"],
        "ttft_text_p50_ms": _percentile(load["ttft"], 0.5) * 1e3,
        "ttft_call_p50_ms": _percentile(load["ttft_call"], 0.5) * 1e3,
        "ttft_call_p99_ms": _percentile(load["ttft_call"], 0.99) * 1e3,
    }


def run_serve(p: ServeParams, *, verbose: bool = True) -> dict:
    """Run every target; returns ``{"targets": [...], "ratios": {...}, "ratios_by_round":
    {...}, "skipped": [...]}`` (each target's ``extra["round"]`` is its round, from 1)."""
    from tsfront.text.testing import make_test_model

    say = (lambda m: print(m, file=sys.stderr, flush=True)) if verbose else (lambda m: None)
    results: list[Figures] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tsfront-bench-serve-") as tmp:
        if p.workload == "agentic":
            from tsfront.bench.agentic import make_agentic_model

            model = str(make_agentic_model(Path(tmp) / "model", _agentic_tokenizer()))
        else:
            model = str(make_test_model(Path(tmp) / "model", "wordlevel"))
        targets: list[tuple[str, tuple[str, int] | None]] = []  # None: SMG
        for w in p.workers:
            targets.append((f"tsfront serve W={w}", ("uvicorn", w)))
        for stack in p.stacks:
            targets.append((f"tsfront {stack} W=1", (stack, 1)))
        smg = None if p.smg == "" else find_smg(p.smg)
        if p.smg == "":
            skipped.append("SMG: --no-smg")
        elif smg is None:
            skipped.append("SMG: not installed (pip install tokenspeed-smg into .smg-venv)")
        else:
            targets.append(("SMG gateway", None))
        floors = [_floor(p, say)]
        for round_no in range(1, p.repeat + 1):
            for name, how in targets:
                say(f"bench serve: {name} ...")
                try:
                    if how is None:
                        with _smg(cast(str, smg), model, p) as (url, session):  # found
                            fig = _measure(name, url, session, model, p)
                    else:
                        stack, w = how
                        with _tsfront(model, p, w, stack) as (url, session):
                            fig = _measure(name, url, session, "model", p)
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    skipped.append(f"{name}: {exc}")
                    say(f"bench serve: {name} failed: {exc}")
                    continue
                say(
                    f"bench serve: {name}: {fig.cpu_us_per_token:.1f} us CPU/token, "
                    f"{fig.extra['cpu_us_per_request']:.0f} us CPU/request, "
                    f"{fig.tokens_per_s:.0f} tok/s, TTFT p50 {fig.ttft_p50_ms:.1f} ms "
                    f"p99 {fig.ttft_p99_ms:.1f} ms, "
                    f"{fig.extra['tokens_per_event']:.2f} tokens/event "
                    f"({fig.errors} errors); by process, us/token: "
                    + ", ".join(
                        f"{k} {v:.1f}" for k, v in fig.extra["us_per_token_by_process"].items()
                    )
                    + (
                        f"; {fig.extra['cpu_ms_per_1k_prompt_tokens']:.2f} ms CPU per 1,000 "
                        f"prompt tokens, mean prompt {fig.extra['mean_prompt_tokens']:.0f} "
                        f"tokens, TTFT p50 text {fig.extra['ttft_text_p50_ms']:.1f} ms / tool "
                        f"call {fig.extra['ttft_call_p50_ms']:.1f} ms"
                        if "mean_prompt_tokens" in fig.extra
                        else ""
                    )
                )
                fig.extra["round"] = round_no
                results.append(fig)
        floors.append(_floor(p, say))
    report = {"targets": [asdict(f) for f in results], "skipped": skipped}
    report["ratios"] = median_ratios(results)
    report["ratios_by_round"] = ratios_by_round(results)
    report["floor"] = {
        "us_per_event": statistics.median(f["us_per_event"] for f in floors),
        "runs": floors,
    }
    return report


def _floor(p: ServeParams, say: Callable[[str], None]) -> dict:
    # Before and after the targets: the machine's state moves during a run.
    from tsfront.bench.floor import measure_floor

    fig = measure_floor(p.concurrency, p.floor_events, p.step_ms)
    say(
        f"bench serve: send floor: {fig['us_per_event']:.1f} us CPU per event "
        f"({fig['connections']} loopback clients)"
    )
    return fig


_W2_OVER_W1 = "W=2 / W=1 (CPU per token)"


def _pair_ratios(per_target: dict[str, float]) -> dict[str, float]:
    """The ratios of one set of figures (target → CPU per token): each target against SMG,
    then W=2 against W=1; a ratio whose two sides are not both there is left out."""
    ratios = {}
    smg = per_target.get("SMG gateway")
    for name, value in per_target.items():
        if smg and name != "SMG gateway":
            ratios[f"{name} / SMG (CPU per token)"] = value / smg
    one, two = per_target.get("tsfront serve W=1"), per_target.get("tsfront serve W=2")
    if one and two:
        ratios[_W2_OVER_W1] = two / one
    return ratios


def median_ratios(results: list[Figures]) -> dict:
    """CPU-per-token ratios of the targets' medians (against SMG; W=2 against W=1)."""
    by: dict[str, list[float]] = {}
    for f in results:
        by.setdefault(f.target, []).append(f.cpu_us_per_token)
    # Medians over --repeat runs: the machine is shared, single runs are noisy.
    ratios: dict[str, float] = _pair_ratios({k: statistics.median(v) for k, v in by.items()})
    w2_over_w1 = ratios.pop(_W2_OVER_W1, None)  # printed after the I/O process's share
    # The I/O process's share of tsfront's figure (what the one shared process costs).
    io = [
        f.extra["us_per_token_by_process"]["I/O process"]
        for f in results
        if f.target == "tsfront serve W=1" and "I/O process" in f.extra["us_per_token_by_process"]
    ]
    if io:
        ratios["tsfront serve W=1: I/O process µs per token (median)"] = statistics.median(io)
    if w2_over_w1 is not None:
        ratios[_W2_OVER_W1] = w2_over_w1
    return ratios


def ratios_by_round(results: list[Figures]) -> dict[str, dict]:
    """The same ratios taken round by round (each ``--repeat`` round's targets ran one after
    the other, so they shared the machine's state), with their median and range: on a noisy
    machine a ratio's spread across rounds says how far to trust it, which the ratio of the
    medians (`median_ratios`) hides. Only rounds that measured both sides of a ratio count."""
    rounds: dict[int, dict[str, float]] = {}
    for f in results:
        rounds.setdefault(f.extra.get("round", 1), {})[f.target] = f.cpu_us_per_token
    by: dict[str, list[float]] = {}
    for _, per_target in sorted(rounds.items()):
        for name, ratio in _pair_ratios(per_target).items():
            by.setdefault(name, []).append(ratio)
    return {
        name: {
            "by_round": values,
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
        for name, values in by.items()
    }


def print_table(report: dict) -> None:
    """The report as a Markdown table on stdout."""
    print(
        "| target | CPU µs / streamed token | CPU µs / request | of which I/O process, "
        "µs / token | tokens/s | TTFT p50 ms | TTFT p99 ms | tokens | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in report["targets"]:
        io = t["extra"]["us_per_token_by_process"].get("I/O process")
        print(
            f"| {t['target']} | {t['cpu_us_per_token']:.1f} | "
            f"{t['extra']['cpu_us_per_request']:.0f} | "
            f"{'—' if io is None else f'{io:.1f}'} | {t['tokens_per_s']:.0f} | "
            f"{t['ttft_p50_ms']:.1f} | {t['ttft_p99_ms']:.1f} | {t['tokens']} | {t['errors']} |"
        )
    for name, value in report["ratios"].items():
        print(f"- {name}: {value:.2f}")
    for name, spread in report.get("ratios_by_round", {}).items():
        if len(spread["by_round"]) > 1:
            rounds = ", ".join(f"{v:.2f}" for v in spread["by_round"])
            print(
                f"- {name}, round by round: {rounds} (median {spread['median']:.2f}, "
                f"range {spread['min']:.2f} to {spread['max']:.2f})"
            )
    floor = report.get("floor")
    if floor:
        print(
            f"- send floor (one loopback TCP send per event, tsfront.bench.floor): "
            f"{floor['us_per_event']:.1f} µs CPU per event"
        )
    for why in report["skipped"]:
        print(f"- skipped: {why}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench serve`` options (added to the bench parser)."""
    g = parser.add_argument_group("bench serve")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="a workload of docs/PERFORMANCE.md's table: short (64 streams of 2 tokens, 2 ms "
        "steps: the per-request cost), mixed (64 x 64 tokens, 2 ms), long (256 x 512 tokens, "
        "20 ms: the per-token cost); the flags below override its values",
    )
    g.add_argument("--concurrency", type=int, help="streams in flight (64)")
    g.add_argument("--max-tokens", type=int, help="tokens per request (64)")
    g.add_argument("--requests", type=int, help="measured requests per target (1024)")
    g.add_argument("--step-ms", type=float, help="simulated engine step (2)")
    g.add_argument(
        "--stacks",
        help="also measure these HTTP stacks at W=1, comma-separated: granian,aiohttp; "
        "'pull' is tsfront serve without its push path (TSFRONT_SERVE_PUSH=0), 'python' "
        "without the push path's native step (TSFRONT_SERVE_NATIVE=0), 'uncached' without "
        "its encode cache (--encode-cache-mb 0) and with the tokenizer's thread pool, 'pyturn' "
        "with the I/O process's every turn in Python (TSFRONT_NATIVE_TURN=0)",
    )
    g.add_argument("--repeat", type=int, help="measure every target this many times (1)")


def params_from(args: argparse.Namespace) -> ServeParams:
    """`ServeParams` from the command line."""
    p = ServeParams.quick() if args.quick else ServeParams()
    if getattr(args, "preset", None):
        p.preset(args.preset)
        if args.quick:
            p.requests = max(p.concurrency, p.requests // 8)
    for name in ("concurrency", "max_tokens", "requests", "step_ms", "repeat", "smg"):
        value = getattr(args, name, None)
        if value is not None:
            setattr(p, name, value)
    if getattr(args, "no_smg", False):
        p.smg = ""
    if getattr(args, "workers", None):
        p.workers = tuple(args.workers)
    if getattr(args, "stacks", None):
        p.stacks = tuple(s for s in args.stacks.split(",") if s)
    return p


#: What ``bench serve`` imports, in itself or in the processes it starts (all in the bench
#: extra): the load generator's HTTP client, and ``tsfront serve``'s stack.
BENCH_SERVE_MODULES = ("aiohttp", "uvicorn", "httptools", "tokenizers", "jinja2")


def require_modules(p: ServeParams) -> None:
    """Refuse to start (exit 2 with the ``pip install`` line) when a module the run needs is
    missing: a target that cannot start is otherwise only a "skipped" line of the report."""
    from tsfront.errors import MissingExtra

    wanted = [*BENCH_SERVE_MODULES, *(s for s in p.stacks if s == "granian")]
    MissingExtra.check("tsfront bench serve", wanted, "bench")


def run_cli(args: argparse.Namespace) -> int:
    """``tsfront bench serve``: run and print (JSON with ``--json``, else a table)."""
    p = params_from(args)
    require_modules(p)
    # SIGTERM unwinds like Ctrl-C, so every server and engine group started is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    report = run_serve(p, verbose=not args.json)
    report["params"] = asdict(p)
    if getattr(args, "out", None):
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if args.json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        print_table(report)
    return 0
