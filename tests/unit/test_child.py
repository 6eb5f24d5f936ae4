"""Every tsfront child process started from a command line goes through
`tsfront.process.child.python_module`, which keeps the working directory off its
``sys.path`` (``-P``).

The behaviour itself (a decoy ``tsfront/`` in the working directory is not imported) is run in
tests/system/test_serve_responses_local.py with the store process."""

from __future__ import annotations

import ast
import pathlib
import sys

from tsfront.process.child import python_module

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tsfront"


def test_the_command_line_is_this_interpreter_with_minus_p() -> None:
    assert python_module("tsfront.io.main") == [sys.executable, "-P", "-m", "tsfront.io.main"]
    assert python_module("tsfront", "serve", "--workers", "2")[3:] == [
        "tsfront",
        "serve",
        "--workers",
        "2",
    ]


def test_no_module_builds_a_python_m_command_line_of_its_own() -> None:
    # A "-m" string anywhere else is a `python -m` command line built by hand, which would
    # put the working directory first on the child's sys.path.
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "process" / "child.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value == "-m":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert found == []
