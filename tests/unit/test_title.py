"""`tsfront.process.title.set_title` in a process of its own: what /proc shows, the cuts, the edges.

Each case runs a short ``python -c`` (a title is the whole process's, not the test's), whose
original command line is the area the title is written into. About 1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASE = """
import json, os
from tsfront.process.title import set_title
shown = set_title(*json.loads(os.environ["TITLE_ARGS"]))
comm = open("/proc/self/comm").read().rstrip("\\n")
cmdline = open("/proc/self/cmdline", "rb").read()
print(json.dumps([shown, comm, cmdline.decode(errors="replace")]))
"""


def argv(pad: int) -> list[str]:
    # ``pad`` more bytes of arguments: a larger area to write the title into. The title
    # itself comes in the environment, so that it does not make the area it is cut to.
    return [sys.executable, "-c", CASE, *(["x" * pad] if pad else [])]


def run(*args: object, pad: int = 0) -> tuple[str, str, str]:
    env = {**os.environ, "TITLE_ARGS": json.dumps(args)}
    done = subprocess.run(
        argv(pad), capture_output=True, text=True, timeout=30, check=True, env=env
    )
    shown, comm, cmdline = json.loads(done.stdout)
    return shown, comm, cmdline


def area(pad: int = 0) -> int:
    """Bytes of the argv area of a `run` process (its arguments, each ended by a NUL)."""
    return sum(len(a.encode()) + 1 for a in argv(pad))


def test_the_title_is_the_whole_command_line_and_the_name_its_short_form() -> None:
    shown, comm, cmdline = run("worker 3", "w3")
    assert shown == "tsfront: worker 3"
    assert cmdline == "tsfront: worker 3\0"  # no other argument, no run of blanks after it
    assert comm == "tsfront: w3"


def test_a_name_is_cut_to_the_kernels_15_bytes() -> None:
    _, comm, _ = run("responses store of a long name")
    assert comm == "tsfront: respon"


def test_a_title_longer_than_the_original_command_line_is_cut_to_it() -> None:
    size = area()
    shown, _, cmdline = run("master", None, "y" * (size + 100))
    assert len(shown) == size - 1 and shown.startswith("tsfront: master yyy")
    assert cmdline == shown + "\0"
    # With room for it, the whole of it.
    shown, _, cmdline = run("master", None, "y" * 100, pad=300)
    assert shown == "tsfront: master " + "y" * 100
    assert cmdline == shown + "\0"


def test_a_title_that_cannot_be_set_leaves_the_process_as_it_was() -> None:
    shown, comm, cmdline = run("a\0b")  # no NUL in a C string
    assert shown == ""
    assert comm == "python3" or not comm.startswith("tsfront")
    assert "tsfront.process.title" in cmdline  # the original -c text
