"""The context limit `EngineClient` checks a request against, from a real shared region.

Each engine's limit is kept per registration list (the attachment replaces the list when an
engine registers again) and each rank's state is read from the region's engine table per
request: a rank that dies or comes back, and a re-registration with another context, are seen
by the next request.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

from tsfront.client.engine_client import EngineClient
from tsfront.client.info import EngineInfo
from tsfront.errors import EngineUnavailable
from tsfront.ipc.region import E_STATE, ENGINE_DEAD, ENGINE_LIVE, ENGINE_STALLED, Geometry, Region

GEOMETRY = Geometry(num_workers=1, slots_per_worker=4, ring_capacity=64, max_engines=8)


def engine(rank: int, model: int | None, cache: int | None = None) -> EngineInfo:
    return EngineInfo(index=rank, rank=rank, max_model_len=model, kv_cache_size_tokens=cache)


@pytest.fixture
def rig() -> Iterator[tuple[EngineClient, types.SimpleNamespace, Region]]:
    region = Region.create(GEOMETRY)
    att = types.SimpleNamespace(
        engines=[engine(0, 4096), engine(1, 8192, 2048), engine(2, None)],
        config=types.SimpleNamespace(num_engines=3, first_engine_index=0),
        region=region,
    )
    region.engines[:3, E_STATE] = ENGINE_LIVE
    try:
        yield EngineClient(att, None), att, region  # type: ignore[arg-type]
    finally:
        region.close()


def test_the_least_limit_of_the_serving_ranks(rig: tuple) -> None:
    client, _, region = rig
    assert client._context_limit(None) == 2048 and client.context_limit == 2048
    region.engines[1, E_STATE] = ENGINE_STALLED  # stalled: still takes requests
    assert client._context_limit(None) == 2048
    region.engines[1, E_STATE] = ENGINE_DEAD
    assert client._context_limit(None) == 4096
    assert client.context_limit == 2048  # every registered engine, live or not
    region.engines[0, E_STATE] = ENGINE_DEAD
    assert client._context_limit(None) is None  # rank 2 reports none
    region.engines[2, E_STATE] = ENGINE_DEAD
    with pytest.raises(EngineUnavailable, match="no engine of the group is live"):
        client._context_limit(None)
    region.engines[1, E_STATE] = ENGINE_LIVE
    assert client._context_limit(None) == 2048


def test_a_pinned_request_gets_its_rank_s_limit(rig: tuple) -> None:
    client, _, region = rig
    assert [client._context_limit(r) for r in range(3)] == [4096, 2048, None]
    region.engines[0, E_STATE] = ENGINE_DEAD
    with pytest.raises(EngineUnavailable, match="is not live"):
        client._context_limit(0)
    with pytest.raises(EngineUnavailable, match=r"ranks 0\.\.2"):
        client._context_limit(3)


def test_a_re_registration_with_another_context_is_seen(rig: tuple) -> None:
    client, att, _ = rig
    assert client._context_limit(None) == 2048
    # As the attachment does on EngineUpdate: a new list with the engine's new registration.
    att.engines = [att.engines[0], engine(1, 8192, 16384), att.engines[2]]
    assert client._context_limit(None) == 4096 and client._context_limit(1) == 8192
    assert client.context_limit == 4096
