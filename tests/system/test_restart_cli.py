"""``tsfront io --state-dir``: a crashed command's successor takes the running engine over.

The command is SIGKILLed; its I/O process dies of its parent's death (PR_SET_PDEATHSIG), which
is no decision to stop the group, so the registration stays; a second ``tsfront io`` with the
same options reports every engine registered without any engine handshaking again, serves,
and on SIGINT (a stop on purpose) empties the directory.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.core_fixtures import free_port
from test_cli import ATTACH_SCRIPT, DEADLINE_S, ENV, TSFRONT, Proc, procs, run_tsfront  # noqa: F401

from tsfront.sim import SimGroup, default_token


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_io_state_dir_survives_a_killed_command(procs, tmp_path: Path) -> None:  # noqa: F811
    state = tmp_path / "state"
    private = f"ipc://@tsfront-cli-{secrets.token_hex(8)}"
    handshake = f"tcp://127.0.0.1:{free_port()}"
    args = [
        *TSFRONT,
        "io",
        "--json",
        "--handshake",
        handshake,
        "--input-address",
        f"{private}-in",
        "--output-address",
        f"{private}-out",
        "--num-engines",
        "1",
        "--state-dir",
        str(state),
    ]
    first = Proc(args)
    procs.append(first)
    io_pid = json.loads(first.wait_line(first.out, r".").string)["pid"]
    with SimGroup(handshake, 1) as sim:
        first.wait_line(first.err, r"every engine registered")
        _wait(lambda: (state / "engine-0.json").exists(), "the registration saved")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(DEADLINE_S)
        _wait(lambda: _gone(io_pid), "the I/O process to follow its parent")
        assert (state / "engine-0.json").exists(), "a parent's death is no stop on purpose"

        second = Proc(args)
        procs.append(second)
        address = json.loads(second.wait_line(second.out, r".").string)["address"]
        second.wait_line(second.err, r"every engine registered")
        attach = subprocess.run(
            [sys.executable, "-c", ATTACH_SCRIPT, address],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            env=ENV,
        )
        assert attach.returncode == 0, attach.stderr
        assert json.loads(attach.stdout)["ids"] == [
            default_token("io-attach-1", i) for i in range(4)
        ]
        assert sim.threads_alive() == [True]
        second.proc.send_signal(signal.SIGINT)
        assert second.finish() == 0, second.err_lines
    assert not (state / "engine-0.json").exists(), "a stop on purpose forgets the engines"


def test_io_state_dir_with_an_ephemeral_port_is_one_line(tmp_path: Path) -> None:
    result = run_tsfront(
        "io", "--handshake", "tcp://127.0.0.1:0", "--num-engines", "1", "--state-dir", str(tmp_path)
    )
    assert result.returncode == 2  # a command line that cannot work, as every such refusal
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "state_dir needs fixed addresses" in lines[0], lines
    assert "see 'tsfront io --help'" in lines[0], lines
