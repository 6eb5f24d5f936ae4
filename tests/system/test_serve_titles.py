"""Process titles of a real ``tsfront serve`` as ``ps`` and /proc show them (issue 40).

Each process of the server names itself (`tsfront.process.title`): its command line
(/proc/PID/cmdline, ``ps -o args``) and its name (/proc/PID/comm, ``ps -o comm``), read here
from outside, as an operator would; a replaced worker is named as the one it replaces, and
simulated ranks run as processes are named too. About 10 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
from functools import partial

import pytest
from support.core_fixtures import wait_until_blocking

from tsfront.sim import SimGroup
from tsfront.testing.serve import ServeProcess

DEADLINE = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


def title(pid: int) -> tuple[str, str]:
    """``(name, command line)`` of ``pid`` as /proc has them."""
    with open(f"/proc/{pid}/comm") as f:
        comm = f.read().rstrip("\n")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().rstrip(b"\0").replace(b"\0", b" ").decode()
    return comm, cmdline


def ps(pid: int) -> str:
    """What ``ps -o comm=,args=`` prints for ``pid``."""
    done = subprocess.run(
        ["ps", "-o", "comm=,args=", "-p", str(pid)], capture_output=True, text=True, timeout=10
    )
    return done.stdout.strip()


#: Polls with a deadline (the interval is not a synchronisation).
wait_for = partial(wait_until_blocking, timeout=DEADLINE, interval=0.05)


def test_every_process_of_the_server_shows_its_role_in_ps(model_dir: str) -> None:
    server = ServeProcess(
        [model_dir, "--handshake", "tcp://127.0.0.1:0", "--num-engines", "2", "--workers", "2",
         "--port", "0", "--api-key", "secret-key-123"]
    )  # fmt: skip
    group = None
    try:
        handshake = server.wait_line(r"^handshake: (\S+)", DEADLINE).group(1)
        group = SimGroup(handshake, 2, processes=True).start()
        server.wait_line(r"^listening: (http://\S+)", DEADLINE)
        titles = {pid: title(pid) for pid in server.group_pids()}
        master = titles.pop(server.proc.pid)
        assert master[0] == "tsfront: master"
        assert master[1].startswith(f"tsfront: master serve {model_dir} --handshake "), master
        assert "--api-key ***" in master[1] and "secret-key-123" not in master[1], master
        roles = {cmdline: comm for comm, cmdline in titles.values() if comm.startswith("tsfront")}
        assert roles == {
            "tsfront: io": "tsfront: io",
            "tsfront: store": "tsfront: store",
            "tsfront: worker 0": "tsfront: w0",
            "tsfront: worker 1": "tsfront: w1",
        }, titles
        # Anything else in the session is multiprocessing's resource tracker, nothing of ours.
        others = [t for t in titles.values() if not t[0].startswith("tsfront")]
        assert all("resource_tracker" in cmdline for _, cmdline in others), others
        # ps says the same.
        worker = next(pid for pid, t in titles.items() if t[1] == "tsfront: worker 1")
        assert ps(worker).split() == ["tsfront:", "w1", "tsfront:", "worker", "1"]
        # A replaced worker is named as the one it replaces.
        os.kill(worker, signal.SIGKILL)

        def replaced() -> bool:
            now = {pid: title(pid) for pid in server.group_pids() if pid != worker}
            return any(t == ("tsfront: w1", "tsfront: worker 1") for t in now.values())

        wait_for(replaced, "worker 1's replacement, named")
        # Simulated ranks in their own processes are named too.
        for rank, pid in enumerate(group.pids()):
            assert title(pid) == (
                f"tsfront: sim {rank}",
                f"tsfront: sim rank {rank} (engine {rank})",
            )
    finally:
        server.stop()
        if group is not None:
            group.stop()
