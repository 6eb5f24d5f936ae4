"""The README's "Run with real engines" command lines agree with TokenSpeed's own parsers.

TokenSpeed 0.1.1's ``tokenspeed serve --headless`` argument splitter and its `ServerArgs`
parser (run in the interop venv) read the README's engine command; the values they yield must
be the ones the README's ``tsfront io`` command binds and expects (handshake host and port,
data-parallel size, first engine index), and msgpack mode must be on. About 3 s.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"

PARSE = """
import argparse, json, sys
from tokenspeed.cli._argsplit import split_headless_argv
from tokenspeed.runtime.utils.server_args import ServerArgs

argv = split_headless_argv(sys.argv[1:])
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(argv)
print(json.dumps({name: getattr(args, name) for name in (
    "zmq_msgpack", "data_parallel_address", "data_parallel_rpc_port", "zmq_engine_index",
    "data_parallel_size", "model")}))
"""


def _section_commands() -> tuple[list[str], list[str]]:
    text = README.read_text()
    section = text.split("## Run with real engines", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    lines = [shlex.split(line) for line in block.splitlines() if line.strip()]
    io = next(line for line in lines if line[:2] == ["tsfront", "io"])
    engine = next(line for line in lines if line[:3] == ["tokenspeed", "serve", "--headless"])
    return io, engine


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_readme_engine_command_matches_the_tsfront_command(interop_python: Path) -> None:
    io, engine = _section_commands()
    result = subprocess.run(
        [str(interop_python), "-c", PARSE, *engine[2:]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    host, port = re.fullmatch(r"tcp://(.+):(\d+)", _option(io, "--handshake")).groups()
    assert parsed["zmq_msgpack"] is True
    assert parsed["data_parallel_address"] == host
    assert parsed["data_parallel_rpc_port"] == int(port)
    assert parsed["data_parallel_size"] == int(_option(io, "--num-engines"))
    assert parsed["zmq_engine_index"] == int(_option(io, "--first-engine-index"))
    assert parsed["model"]
