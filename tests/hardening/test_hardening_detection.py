"""Detection: a rank that dies without a word, or is cut off by the network, is noticed.

SIGKILL (no ``ENGINE_CORE_DEAD``): the kernel closes the rank's sockets, so its output PULL's
monitor sees ``EVENT_DISCONNECTED`` at once. A network partition (a rank in its own network
namespace joined by a veth pair whose link is set down) closes nothing: only the ZMTP
heartbeat on the output PULL (1 s interval, 3 s timeout) notices. Either way exactly that
rank's streams end with `EngineDied(engine_index=…)` and a concurrent stream on a healthy rank
completes with every token. Measured times are printed (``-s``) and recorded in
docs/RELIABILITY.md.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest
from support.core_fixtures import DEADLINE, FOREVER, collect, expected_tokens, next_chunk, request
from support.hardening import io_rig, wait_state

from tsfront import EngineDied


async def _expect_engine_died(stream, index: int, timeout: float) -> float:
    """Read ``stream`` until it raises; the monotonic time at which it did."""
    with pytest.raises(EngineDied) as info:
        await collect(stream, timeout)
    assert info.value.engine_index == index
    return time.monotonic()


async def test_sigkilled_rank_is_detected_at_once_and_fails_only_its_streams():
    async with io_rig(3) as r:
        client = await r.attach()
        victims = [await client.generate(request(f"victim-{i}", FOREVER, pin=1)) for i in (0, 1)]
        healthy_rid = "healthy"
        healthy = await client.generate(request(healthy_rid, 1500, pin=0))
        other = await client.generate(request("other", FOREVER, pin=2))
        firsts = [await next_chunk(s) for s in (*victims, healthy, other)]
        healthy_task = asyncio.create_task(collect(healthy, 30))

        t0 = time.monotonic()
        r.ranks[1].kill()
        ends = await asyncio.gather(*(_expect_engine_died(s, 1, DEADLINE) for s in victims))
        detection = max(ends) - t0
        print(f"\nSIGKILL detection: {detection * 1000:.1f} ms")
        assert detection < 3.0
        assert client.load()[1].state == "dead"

        tokens, chunks = await healthy_task
        assert firsts[2].output_ids + tokens == expected_tokens(healthy_rid, 1500)
        assert chunks[-1].finish_reason == "length"
        assert not other.finished
        assert client.load()[2].state == "live"
        assert client.load()[0].state == "live"
        other.abort()


# ------------------------------------------------------------------------ network partition

_NS_HOST = "169.254.77.1"
_NS_PEER = "169.254.77.2"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


@pytest.fixture
def netns():
    """A network namespace joined to this one by a veth pair on link-local addresses we own."""
    if shutil.which("ip") is None:
        pytest.skip("the ip tool (iproute2) is not installed")
    tag = f"{os.getpid() % 100000}"
    ns, host_if, peer_if = f"tsfh{tag}", f"tsfh{tag}a", f"tsfh{tag}b"
    probe = _ip("netns", "add", ns, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {probe.stderr.strip()}")
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", ns)
        _ip("addr", "add", f"{_NS_HOST}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{_NS_PEER}/30", "dev", peer_if)
        _ip("netns", "exec", ns, "ip", "link", "set", peer_if, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield ns, host_if, peer_if
    finally:
        _ip("link", "del", host_if, check=False)
        _ip("netns", "del", ns, check=False)


async def test_partitioned_rank_is_detected_by_heartbeat(netns):
    ns, _host_if, peer_if = netns
    addr = f"tcp://{_NS_HOST}:0"
    async with io_rig(
        2, start_ranks=False, handshake_address=addr, input_address=addr, output_address=addr
    ) as r:
        r.start_rank(0)
        r.start_rank(1, prefix=["ip", "netns", "exec", ns])
        client = await r.attach(timeout=30)
        victim = await client.generate(request("cut-off", FOREVER, pin=1))
        healthy = await client.generate(request("healthy", 2500, pin=0))
        await next_chunk(victim)
        await next_chunk(healthy)
        healthy_task = asyncio.create_task(collect(healthy, 30))

        t0 = time.monotonic()
        # Engine side down: the peer loses carrier; nothing is closed, no RST is ever sent.
        _ip("netns", "exec", ns, "ip", "link", "set", peer_if, "down")
        end = await _expect_engine_died(victim, 1, 10)
        detection = end - t0
        print(f"\npartition detection: {detection * 1000:.1f} ms")
        # Heartbeat: a PING at most 1 s after the cut, then 2 s without a reply (defaults).
        assert 1.5 <= detection < 4.0
        assert client.load()[1].state == "dead"
        assert client.load()[0].state == "live"
        _tokens, chunks = await healthy_task
        assert chunks[-1].finish_reason == "length"
        assert chunks[-1].completion_tokens == 2500


async def test_heartbeat_timeout_knob_shortens_partition_detection(netns):
    ns, _host_if, peer_if = netns
    addr = f"tcp://{_NS_HOST}:0"
    async with io_rig(
        1,
        start_ranks=False,
        handshake_address=addr,
        input_address=addr,
        output_address=addr,
        heartbeat_interval=0.2,
        heartbeat_timeout=0.6,
    ) as r:
        r.start_rank(0, prefix=["ip", "netns", "exec", ns])
        client = await r.attach(timeout=30)
        await wait_state(client, 0, "live")
        victim = await client.generate(request("cut-off-fast", FOREVER, pin=0))
        await next_chunk(victim)
        t0 = time.monotonic()
        _ip("netns", "exec", ns, "ip", "link", "set", peer_if, "down")
        detection = await _expect_engine_died(victim, 0, 10) - t0
        print(f"\npartition detection (0.2 s / 0.6 s heartbeat): {detection * 1000:.1f} ms")
        assert detection < 1.5
