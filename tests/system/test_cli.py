"""The ``tsfront`` command: demo, generate, io, sim, errors and help, as real subprocesses.

Every command runs in its own session (process group) so teardown can kill whatever is left,
and the demo test checks that nothing is. Waits read lines with deadlines; no sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tsfront.sim import SimGroup, default_token

DEADLINE_S = 30.0
TSFRONT = [sys.executable, "-m", "tsfront"]
LOCAL = ["--handshake", "tcp://127.0.0.1:0", "--num-engines", "1"]
TIMEOUT = ["--handshake-timeout", "0.5"]
ENV = {k: v for k, v in os.environ.items() if k != "TSFRONT_LOG"}


class Proc:
    """A command in its own process group, with stdout/stderr read into line queues."""

    def __init__(self, args: list[str], **kwargs) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=kwargs.pop("env", ENV),
            start_new_session=True,
            **kwargs,
        )
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: queue.Queue[str | None] = queue.Queue()
        self.out_lines: list[str] = []
        self.err_lines: list[str] = []
        for stream, q, keep in (
            (self.proc.stdout, self.out, self.out_lines),
            (self.proc.stderr, self.err, self.err_lines),
        ):
            threading.Thread(target=self._pump, args=(stream, q, keep), daemon=True).start()

    @staticmethod
    def _pump(stream, q, keep) -> None:
        for raw in stream:
            line = raw.decode().rstrip("\n")
            keep.append(line)
            q.put(line)
        q.put(None)

    def wait_line(self, q: queue.Queue, pattern: str, timeout: float = DEADLINE_S) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no line matching {pattern!r}; stderr: {self.err_lines}")
            try:
                line = q.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"exited ({self.proc.wait()}) before {pattern!r}")
            match = re.search(pattern, line)
            if match:
                return match

    def finish(self, timeout: float = DEADLINE_S) -> int:
        """Wait for the exit and for both pipes to be read to the end."""
        code = self.proc.wait(timeout)
        for q in (self.out, self.err):
            while q.get(timeout=timeout) is not None:
                pass
        return code

    def kill_group(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.kill_group()


def run_tsfront(*args: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TSFRONT, *args], capture_output=True, text=True, timeout=timeout, env=ENV
    )


def group_empty(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        threading.Event().wait(0.05)  # polling a condition with a deadline
    return False


# ---------------------------------------------------------------------- demo


def test_demo_runs_and_cleans_up(procs) -> None:
    started = time.monotonic()
    p = Proc([*TSFRONT, "demo"])
    procs.append(p)
    assert p.finish() == 0, p.err_lines
    assert time.monotonic() - started < 20
    out = p.out_lines
    token_lines = [line for line in out if line.startswith("[worker ")]
    workers = {re.match(r"\[worker (\d+) (\S+)\]", line).group(1) for line in token_lines}
    rids = {re.match(r"\[worker (\d+) (\S+)\]", line).group(2) for line in token_lines}
    assert workers == {"0", "1"}
    assert len(rids) == 4
    assert sum("<- length" in line for line in token_lines) == 4
    summary = [line for line in out if line.startswith("summary:")]
    assert summary and "4/4 requests" in summary[0] and "tokens/s" in summary[0]
    assert any(line.strip().startswith("rank 0 (engine 0)") for line in out)
    assert any(line.strip().startswith("rank 1 (engine 1)") for line in out)
    assert any("requests_total 2" in line for line in out)
    # Two real worker processes, distinct from the demo itself.
    pids = {int(m.group(1)) for line in out if (m := re.search(r"worker \d \(pid (\d+)\)", line))}
    assert len(pids) == 2 and p.proc.pid not in pids
    assert group_empty(p.proc.pid, 10), "the demo left processes behind"


def test_demo_with_sim_processes_quiet(procs) -> None:
    p = Proc([*TSFRONT, "demo", "--sim-processes", "--quiet", "--requests", "3"])
    procs.append(p)
    assert p.finish() == 0, p.err_lines
    assert not any(line.startswith("[worker ") for line in p.out_lines)
    assert any(line.startswith("summary: 3/3 requests") for line in p.out_lines)
    assert group_empty(p.proc.pid, 10)


# ---------------------------------------------------------------------- generate


def test_generate_json_against_sim_processes(procs, tmp_path: Path) -> None:
    rid_stop = "cli-stop"
    stop_at = default_token(rid_stop, 3)
    lines = [
        {"rid": "cli-a", "input_ids": [1, 2, 3], "max_new_tokens": 5},
        {"rid": "cli-b", "input_ids": [4, 5], "sampling_params": {"max_new_tokens": 7}},
        {"rid": rid_stop, "input_ids": [9], "max_new_tokens": 50, "stop_token_ids": [stop_at]},
        {"rid": "cli-c", "input_ids": [7, 7, 7]},
    ]
    file = tmp_path / "requests.jsonl"
    file.write_text("\n".join(json.dumps(obj) for obj in lines) + "\n\n")
    gen = Proc(
        [
            *TSFRONT,
            "generate",
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            "2",
            "--handshake-timeout",
            "20",
            "--requests",
            str(file),
            "--max-new-tokens",
            "4",
            "--json",
        ]
    )
    procs.append(gen)
    address = gen.wait_line(gen.err, r"handshake bound at (tcp://\S+);").group(1)
    sim = Proc([*TSFRONT, "sim", "--handshake", address, "--num-engines", "2", "--processes"])
    procs.append(sim)
    assert gen.finish() == 0, gen.err_lines
    chunks = [json.loads(line) for line in gen.out_lines]
    by_rid: dict[str, list[dict]] = {}
    for chunk in chunks:
        assert set(chunk) >= {"rid", "output_ids", "finish_reason", "engine_index"}
        by_rid.setdefault(chunk["rid"], []).append(chunk)
    assert set(by_rid) == {"cli-a", "cli-b", rid_stop, "cli-c"}
    want = {"cli-a": 5, "cli-b": 7, rid_stop: 4, "cli-c": 4}
    engines = set()
    for rid, got in by_rid.items():
        ids = [t for c in got for t in c["output_ids"]]
        assert ids == [default_token(rid, i) for i in range(want[rid])], rid
        assert [c["finish_reason"] for c in got[:-1]] == [None] * (len(got) - 1)
        assert got[-1]["finish_reason"] == ("stop" if rid == rid_stop else "length")
        assert got[-1]["completion_tokens"] == want[rid]
        engines.add(got[-1]["engine_index"])
    assert engines == {0, 1}, "least-in-flight spreads four requests over both ranks"
    assert any(line.startswith("tsfront generate: done: 4/4 finished") for line in gen.err_lines)


def test_generate_one_request_plain_output(procs) -> None:
    gen = Proc(
        [
            *TSFRONT,
            "generate",
            "--handshake",
            "tcp://127.0.0.1:0",
            "--num-engines",
            "1",
            "--first-engine-index",
            "3",
            "--input-ids",
            "5,6,7",
            "--max-new-tokens",
            "3",
        ]
    )
    procs.append(gen)
    address = gen.wait_line(gen.err, r"handshake bound at (tcp://\S+);").group(1)
    with SimGroup(address, 1, first_engine_index=3):
        assert gen.finish() == 0, gen.err_lines
    assert gen.out_lines, gen.err_lines
    rid = gen.out_lines[0].split(":")[0]
    tokens = [
        int(t) for line in gen.out_lines for t in line.split(":", 1)[1].split() if t.isdigit()
    ]
    assert tokens == [default_token(rid, i) for i in range(3)]
    assert "[finished: length;" in gen.out_lines[-1] and "engine 3]" in gen.out_lines[-1]


# ---------------------------------------------------------------------- io

ATTACH_SCRIPT = """
import asyncio, json, sys
from tsfront import EngineClient
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

async def main():
    client = await EngineClient.attach(sys.argv[1])
    stream = await client.generate(TokenizedGenerateReqInput(
        rid="io-attach-1", input_ids=[1, 2], stream=True,
        sampling_params=SamplingParams(max_new_tokens=4)))
    ids = [t async for chunk in stream for t in chunk.output_ids]
    print(json.dumps({"ids": ids, "engines": [e.index for e in client.engines()]}))
    await client.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("as_json", [True, False])
def test_io_prints_an_address_another_process_attaches_to(procs, as_json: bool) -> None:
    args = [*TSFRONT, "io", "--handshake", "tcp://127.0.0.1:0", "--num-engines", "2"]
    io = Proc(args + (["--json"] if as_json else []))
    procs.append(io)
    first = io.wait_line(io.out, r".").string
    if as_json:
        info = json.loads(first)
        address, handshake = info["address"], info["handshake_address"]
        assert len(info["output_addresses"]) == 2 and info["pid"] > 0
    else:
        address = first
        handshake = io.wait_line(io.err, r"engines dial (tcp://\S+) ").group(1)
    assert address.startswith("unix:") and " " not in address
    with SimGroup(handshake, 2):
        io.wait_line(io.err, r"every engine registered")
        attach = subprocess.run(
            [sys.executable, "-c", ATTACH_SCRIPT, address],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=ENV,
        )
        assert attach.returncode == 0, attach.stderr
        result = json.loads(attach.stdout)
        assert result["ids"] == [default_token("io-attach-1", i) for i in range(4)]
        assert result["engines"] == [0, 1]
        io.proc.send_signal(signal.SIGINT)
        assert io.finish() == 0, io.err_lines
    assert len(io.out_lines) == 1, "the attach address is the only stdout line"


def test_io_handshake_timeout_is_an_error(procs) -> None:
    io = Proc([*TSFRONT, "io", "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1", *TIMEOUT])
    procs.append(io)
    assert io.finish() == 1
    errors = [line for line in io.err_lines if line.startswith("tsfront: error: ")]
    assert len(errors) == 1 and "did not register" in errors[0]


# ---------------------------------------------------------------------- errors and help


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        ([], 2, "COMMAND"),
        (["bogus"], 2, "invalid choice"),
        (["generate", "--num-engines", "2", "--input-ids", "1"], 2, "--handshake"),
        (["generate", "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1"], 2, "--input-ids"),
        (
            ["generate", "--handshake", "tcp://h:1", "--num-engines", "x", "--input-ids", "1"],
            2,
            "x",
        ),
        (
            ["generate", "--handshake", "ipc://x", "--num-engines", "1", "--input-ids", "1"],
            2,
            "over TCP",
        ),
        (
            ["generate", *LOCAL, "--input-ids", "1,zz"],
            2,
            "--input-ids",
        ),
        (
            ["generate", *LOCAL, "--requests", "/nonexistent/requests.jsonl"],
            1,
            "No such file",
        ),
        (
            ["generate", *LOCAL, "--quiet", "--input-ids", "1", *TIMEOUT],
            1,
            "did not register",
        ),
        (["sim", "--handshake", "tcp://127.0.0.1:1", "--num-engines", "0"], 2, "num_engines"),
        (["demo", "--workers", "0"], 2, "--workers"),
        (["io", *LOCAL, "--max-workers", "0"], 2, "--max-workers"),
        (["io", *LOCAL, "--slots-per-worker", "0"], 2, "--slots-per-worker"),
        (["io", *LOCAL, "--handshake-timeout", "0"], 2, "--handshake-timeout"),
    ],
)
def test_errors_are_one_line(args: list[str], code: int, needle: str) -> None:
    result = run_tsfront(*args)
    assert result.returncode == code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tsfront: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_address_in_use_is_one_line() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_tsfront("io", "--handshake", f"tcp://127.0.0.1:{port}", "--num-engines", "1")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tsfront: error: I/O process could not start")


def test_bad_requests_file_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text('{"input_ids": [1]}\n{"input_ids": [1], "stop": ["x"], "colour": 1}\n')
    result = run_tsfront(
        "generate",
        "--handshake",
        "tcp://127.0.0.1:0",
        "--num-engines",
        "1",
        "--requests",
        str(file),
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"tsfront: error: {file}:2: unknown key(s) colour; use input_ids, rid, "
        "data_parallel_rank, sampling_params or a SamplingParams field"
    ]


@pytest.mark.parametrize(
    ("command", "needles"),
    [
        ([], ["demo", "generate", "io", "sim"]),
        (["demo"], ["--requests", "--workers", "--sim-processes"]),
        (
            ["generate"],
            [
                *("--handshake", "--num-engines", "--first-engine-index", "--input-ids"),
                *("--max-new-tokens", "--stop-token-ids", "--requests", "--json"),
                *("--handshake-timeout", "input_ids"),
            ],
        ),
        (["io"], ["--handshake", "--num-engines", "--json", "--max-workers", "SIGINT"]),
        (["sim"], ["--handshake", "--num-engines", "--processes", "--step-ms", "--fault-ranks"]),
    ],
)
def test_help(command: list[str], needles: list[str]) -> None:
    result = run_tsfront(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: tsfront {' '.join(command)}".rstrip())
    for needle in needles:
        assert needle in result.stdout, needle
