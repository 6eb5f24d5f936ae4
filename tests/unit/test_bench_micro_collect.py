"""The micro-benchmarks are collected once each, whether their folder or one of their files is
named on pytest's command line (`tsfront/bench/micro/conftest.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tsfront.bench.micro as micro

MICRO = Path(micro.__file__).parent


def _collected(*paths: Path) -> list[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "::" in line]


def test_a_file_named_on_the_command_line_is_collected_once() -> None:
    one = _collected(MICRO / "bench_core.py")
    assert one and len(one) == len(set(one)), one
    everything = _collected(MICRO)
    assert len(everything) == len(set(everything))
    assert len([n for n in everything if "bench_core.py::" in n]) == len(one)
