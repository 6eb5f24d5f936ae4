"""Fixtures for the interop tests: the ``.interop-venv`` interpreter, a raw frontend, the harness.

The harness runs TokenSpeed's own engine code, so it lives in a separate venv
(``scripts/interop-venv``); these tests run from tsfront's main venv and start
it as a subprocess. A missing venv is a failure, never a skip: CI must not go
green without having talked to the real engine code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness_process import Harness, spawn_harness
from raw_frontend import RawFrontend

REPO = Path(__file__).resolve().parents[2]
INTEROP_PYTHON = REPO / ".interop-venv" / "bin" / "python"


@pytest.fixture(scope="session")
def interop_python() -> Path:
    """The interop venv's interpreter; fails with the fix if it was never built."""
    if not INTEROP_PYTHON.exists():
        pytest.fail(
            f"{INTEROP_PYTHON} is missing: run scripts/interop-venv first "
            "(scripts/test does it before pytest)",
            pytrace=False,
        )
    return INTEROP_PYTHON


@pytest.fixture
def frontend() -> Iterator[RawFrontend]:
    """A bound raw frontend, closed in teardown."""
    fe = RawFrontend()
    yield fe
    fe.close()


@pytest.fixture
def start_harness(
    interop_python: Path, frontend: RawFrontend, tmp_path: Path
) -> Iterator[Callable[..., Harness]]:
    """Factory: ``start_harness(num_engines, first_index, *extra_args)`` → a ready Harness.

    Every started harness is terminated and reaped in teardown.
    """
    started: list[Harness] = []

    def start(num_engines: int = 1, first_index: int = 0, *extra: str) -> Harness:
        log_path = tmp_path / f"harness{len(started)}.jsonl"
        handshake = RawFrontend.endpoint(frontend.handshake)
        harness = spawn_harness(
            interop_python, handshake, log_path, num_engines, first_index, *extra
        )
        started.append(harness)
        return harness

    yield start
    for harness in started:
        harness.stop()


@pytest.fixture
def spawn_engine_harness(interop_python: Path, tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Factory: ``spawn_engine_harness(handshake, num_engines, first_index, *extra)`` → a ready
    Harness dialling ``handshake`` (e.g. a tsfront I/O process's bound handshake address).

    Unlike ``start_harness`` it needs no raw frontend; every harness it started is terminated
    and reaped in teardown.
    """
    started: list[Harness] = []

    def start(handshake: str, num_engines: int = 1, first_index: int = 0, *extra: str) -> Harness:
        log_path = tmp_path / f"engine-harness{len(started)}.jsonl"
        harness = spawn_harness(
            interop_python, handshake, log_path, num_engines, first_index, *extra
        )
        started.append(harness)
        return harness

    yield start
    for harness in started:
        harness.stop()
