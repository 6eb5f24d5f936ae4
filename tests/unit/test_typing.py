"""Type checkers see tsfront's hints: the package ships ``py.typed`` (PEP 561).

mypy checks small user programs against the installed package, found the way an installed
package is found (on the interpreter's path, not as source given to mypy), so the PEP 561
rules apply: a correct program passes, a wrong one is reported, and the same package without
its ``py.typed`` is not analysed at all. About 15 s (three mypy runs sharing one cache).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tsfront

PACKAGE = Path(tsfront.__file__).parent

GOOD = """
import asyncio

from tsfront import ClientConfig, EngineClient, LoadBalance, OutputChunk, Routing, StreamError
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput


async def main() -> list[int]:
    config = ClientConfig(
        handshake_address="tcp://127.0.0.1:30500",
        num_engines=1,
        routing=Routing.aggregated(LoadBalance.LEAST_IN_FLIGHT),
    )
    client = await EngineClient.connect(config)
    stream = await client.generate(
        TokenizedGenerateReqInput(
            rid="r1", input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=4)
        )
    )
    ids: list[int] = []
    try:
        async for chunk in stream:
            c: OutputChunk = chunk
            ids.extend(c.output_ids)
    except StreamError as exc:
        print(exc.rid, exc.engine_index)
    limits = [e.context_limit for e in client.engines()]
    print(limits, [load.in_flight for load in client.load()])
    await client.close()
    return ids


print(asyncio.run(main()))
"""

# A str where an int is declared, and an unknown keyword: both only visible through our hints.
BAD = """
from tsfront import ClientConfig

port: int = ClientConfig().handshake_address
ClientConfig(num_engine=2)
"""


def _mypy(tmp_path: Path, site: Path, program: str, name: str) -> subprocess.CompletedProcess:
    source = tmp_path / f"{name}.py"
    source.write_text(program)
    # The package is put on the interpreter's path (as site-packages would hold it), so mypy
    # finds it through its installed-package search, where py.typed decides everything.
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--strict", "--no-error-summary"),
            *("--cache-dir", str(tmp_path / "cache"), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "tsfront").symlink_to(PACKAGE, target_is_directory=True)
    return site


def test_py_typed_ships_with_the_package() -> None:
    assert (PACKAGE / "py.typed").is_file()


def test_mypy_accepts_a_correct_user_program(tmp_path: Path, installed: Path) -> None:
    result = _mypy(tmp_path, installed, GOOD, "good")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_reports_a_type_error_in_a_user_program(tmp_path: Path, installed: Path) -> None:
    result = _mypy(tmp_path, installed, BAD, "bad")
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'expression has type "str", variable has type "int"' in result.stdout
    assert 'Unexpected keyword argument "num_engine"' in result.stdout


def test_without_py_typed_mypy_would_not_read_the_hints(tmp_path: Path) -> None:
    site = tmp_path / "untyped"
    shutil.copytree(PACKAGE, site / "tsfront", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "tsfront" / "py.typed").unlink()
    result = _mypy(tmp_path, site, BAD, "bad")
    assert "missing library stubs or py.typed marker" in result.stdout, result.stdout
