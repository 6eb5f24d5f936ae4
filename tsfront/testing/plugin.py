"""The pytest plugin (``tsfront[testing]``; entry point ``pytest11``): tsfront rigs as fixtures.

Installed with tsfront's ``testing`` extra, pytest loads it by itself; ``-p no:tsfront``
turns it off. Fixtures (each stops everything it started when its test ends):

* ``tsfront_model`` (session) — a model folder of the text layer's word-level test
  tokenizer (token ``i`` reads ``w<i>``), made once per session; nothing is downloaded;
* ``tsfront_sim`` — a factory: ``tsfront_sim(handshake_address, ranks=1, **options)`` starts
  a `SimGroup` (``options`` are `EngineOptions` fields: ``step_ms``, ``script``...);
* ``tsfront_engines`` (async) — an `EngineRig`: a real I/O process, simulated ranks and an
  attached `EngineClient` (``.io``, ``.sim``, ``.client``, ``.attach()``);
* ``tsfront_replay`` — `ReplayEngines`: an I/O process and replay engines of pre-encoded
  frames, for measuring a consumer per token;
* ``tsfront_serve`` — `Served`: ``tsfront serve`` in a session of its own on a free port with
  simulated ranks (``.url``); at the end the server must exit 0 and leave no process behind.

The last three take their settings from a marker of their name or an indirect parameter (a
dict; it wins over the marker)::

    @pytest.mark.tsfront_engines(ranks=4, step_ms=0.5)
    async def test_x(tsfront_engines): ...

    @pytest.mark.parametrize("tsfront_serve", [{"workers": 1}, {"workers": 2}], indirect=True)
    def test_y(tsfront_serve): ...

``tsfront_engines`` takes `engine_rig`'s arguments (``ranks`` = 2, ``config``,
``rank_options``, `EngineOptions` fields); ``tsfront_replay`` takes `ReplayEngines`'s (``ranks``
= 1, ``config``); ``tsfront_serve`` takes `start_served`'s (``workers`` = 1, ``ranks`` = 2,
``model`` = the ``tsfront_model`` folder, ``args``, `EngineOptions` fields).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tsfront.sim import SimGroup
from tsfront.testing.engines import EngineRig, engine_rig
from tsfront.testing.replay import ReplayEngines
from tsfront.testing.serve import Served, start_served

_MARKERS = {
    "tsfront_engines": "tsfront_engines(**kw): settings of the tsfront_engines fixture "
    "(ranks, config, rank_options, EngineOptions fields)",
    "tsfront_replay": "tsfront_replay(**kw): settings of the tsfront_replay fixture "
    "(ranks, config)",
    "tsfront_serve": "tsfront_serve(**kw): settings of the tsfront_serve fixture "
    "(workers, ranks, model, args, EngineOptions fields)",
}


def pytest_configure(config: pytest.Config) -> None:
    for help_ in _MARKERS.values():
        config.addinivalue_line("markers", help_)


def settings(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    """A fixture's settings: its marker's keywords, then its indirect parameter's (a dict)."""
    found: dict[str, Any] = {}
    marker = request.node.get_closest_marker(name)
    if marker is not None:
        if marker.args:
            raise pytest.UsageError(f"@pytest.mark.{name} takes keywords only, got {marker.args}")
        found.update(marker.kwargs)
    param = getattr(request, "param", None)
    if param is not None:
        if not isinstance(param, dict):
            raise pytest.UsageError(
                f"indirect parameter of {name} must be a dict of settings, got {param!r}"
            )
        found.update(param)
    return found


@pytest.fixture(scope="session")
def tsfront_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level test model folder (token ``i`` reads ``w<i>``), made once per session."""
    from tsfront.text.testing import make_test_model

    return make_test_model(tmp_path_factory.mktemp("tsfront-model") / "model", "wordlevel")


@pytest.fixture
def tsfront_sim() -> Iterator[Callable[..., SimGroup]]:
    """``tsfront_sim(handshake_address, ranks=1, **options)``: a started `SimGroup`."""
    groups: list[SimGroup] = []

    def start(handshake_address: str, ranks: int = 1, **options: Any) -> SimGroup:
        group = SimGroup(handshake_address, ranks, **options).start()
        groups.append(group)
        return group

    yield start
    for group in reversed(groups):
        group.stop()


@pytest_asyncio.fixture
async def tsfront_engines(request: pytest.FixtureRequest) -> AsyncIterator[EngineRig]:
    """An I/O process, simulated ranks and an attached `EngineClient` (`EngineRig`)."""
    async with engine_rig(**settings(request, "tsfront_engines")) as rig:
        yield rig


@pytest.fixture
def tsfront_replay(request: pytest.FixtureRequest) -> Iterator[ReplayEngines]:
    """An I/O process and replay engines of pre-encoded frames (`ReplayEngines`)."""
    with ReplayEngines(**settings(request, "tsfront_replay")) as engines:
        yield engines


@pytest.fixture
def tsfront_serve(request: pytest.FixtureRequest, tsfront_model: Path) -> Iterator[Served]:
    """``tsfront serve`` with simulated ranks (`Served`; ``.url`` is its base URL)."""
    kw = settings(request, "tsfront_serve")
    model = kw.pop("model", tsfront_model)
    served = start_served(model, **kw)
    try:
        yield served
    finally:
        code, left = served.close()
    assert code == 0, f"tsfront serve exited {code} on SIGTERM"
    assert not left, f"processes of tsfront serve outlived it: {sorted(left)}"
