"""End-to-end peer fuzz: mutated engine frames at a live engine's output PULL, and garbage at the
handshake and input ROUTERs, while real streams run. The I/O process must stay up (the same
process, still serving) and every live stream must end correctly.

A rogue PUSH connects to rank 0's output PULL, beside the real rank 0, and sends frames made
from real ones — the golden vectors (`tests/data/golden_vectors.json`, TokenSpeed's own bytes)
and `encode_output` of batches naming the requests that are live on rank 0 — then mutated:
integers swapped for -1, 2**31, 2**40, 2**64-1 and the like (counts, tokens, the load tail,
``engine_index``), one bound rid repeated in up to 5,000 rows, a 0-row frame with a load tail
out of the u32 range, wrong types, ragged columns, odd finish reasons, tails cut or extended,
the tag changed; and at the byte level flipped, truncated, spliced, or given a length header
claiming 4 G elements. Meanwhile rogue DEALERs (random, out-of-range and live identities) send
mutated HELLO/READY and registration maps, and garbage, to the handshake and input ROUTERs.

Streams on the fuzzed rank: *witnesses*, whose rids the rogue never names, must deliver exactly
the engine's tokens and end with ``length``; *victims*, whose rids the rogue does name (the
I/O process cannot tell a rogue frame on an engine's PULL from the engine's own), must each end
exactly once, without a stall. Witnesses on rank 1 too. Frames go out in batches; after each
batch a *marker* token for a probe stream (on rank 0) proves the I/O process has ingested the
batch, so a death is pinned to the batch that caused it; the failure lists its frames, saves
them, and replays them through a native `Writer` in a subprocess to name the frame that
crashes it (a death in the Python loop names no frame there: see the I/O process's stderr).

Bound: ``TSFRONT_PEER_FUZZ_BATCHES`` batches (default 500) of 16 output frames, 2 handshake and
2 input frames each (8,000 + 1,000 + 1,000 frames; 4-6 s of fuzz, 7-11 s in all on a 2-core
machine), from ``TSFRONT_PEER_FUZZ_SEED`` (default 1).
``TSFRONT_PEER_FUZZ_SKIP`` drops mutation kinds by name (comma-separated: the keys of
`TREE_MUTATIONS` and `BYTE_MUTATIONS`), to look past a first finding.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq
from support.core_fixtures import DEADLINE, expected_tokens, request, rig, wait_until
from support.hardening import slot_state

from tsfront import StreamError
from tsfront.wire import (
    ENGINE_CORE_DEAD,
    BatchTokenIDOutSlim,
    encode_hello,
    encode_output,
    encode_ready,
    engine_identity,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "golden_vectors.json").read_text())
GOLDEN_OUTPUTS = [
    GOLDEN[k]["decoded"]
    for k in (
        "output_v14",
        "output_v9_aug3",
        "output_v10_aug12",
        "output_v14_logprobs_length",
        "output_validation_abort",
    )
]
GOLDEN_HANDSHAKE = [bytes.fromhex(GOLDEN[k]["hex"]) for k in ("hello", "ready")]
GOLDEN_REGISTRATION = bytes.fromhex(GOLDEN["ready_response"]["hex"])

BATCHES = int(os.environ.get("TSFRONT_PEER_FUZZ_BATCHES", "500"))
SEED = int(os.environ.get("TSFRONT_PEER_FUZZ_SEED", "1"))
SKIP = set(filter(None, os.environ.get("TSFRONT_PEER_FUZZ_SKIP", "").split(",")))
OUTPUT_FRAMES_PER_BATCH = 16

#: Integers a peer can put anywhere: negative, just past i32/u32, far past, the u64 edge.
EXTREMES = (-1, -2, -(2**31) - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, -(2**63), 2**64 - 1)
WRONG = ("x", None, 1.5, b"\x00", {"a": 1}, [[["deep"]]], True, [])
TAG = "BatchTokenIDOutSlim"

# Short: a victim a rogue frame "finished" is still generating on the engine (nobody aborts
# it), and such leftovers must not fill the rank's batch and starve the witnesses.
VICTIM_TOKENS = 60

# Probe tokens are far above any simulated token (< vocab 32,000) and still valid int32 ids.
MARKER_BASE = 1_000_000

# Few slots and long rings: a frame that repeats a bound rid writes (and notifies) once per row
# up to the ring's room, so rows can outnumber the slots many times over.
GEOMETRY = {"max_workers": 1, "slots_per_worker": 32, "ring_capacity": 1024}


# ------------------------------------------------------------------------------ frames


def _row_tree(rids: list[str], rng: random.Random, form: int = 14) -> list:
    """A valid output tree (the decoded array) with one row per rid."""
    ids = [[rng.randrange(3, 32000) for _ in range(rng.randrange(0, 4))] for _ in rids]
    logprobs = rng.random() < 0.3
    tree = [
        TAG,
        list(rids),
        ids,
        [rng.choice(["", "", "", "stop", "length", "abort"]) for _ in rids],
        [3] * len(rids),
        [rng.randrange(0, 100) for _ in rids],
        [0] * len(rids),
        [[-0.5] * len(x) for x in ids] if logprobs else [[] for _ in rids],
        [list(x) for x in ids] if logprobs else [[] for _ in rids],
        0,
        len(rids),
        0,
        1,
        1000,
    ]
    return tree[:form]


def _ints(tree: Any, path: tuple = ()) -> list[tuple]:
    """The paths of every int (not bool) in a tree."""
    if isinstance(tree, bool):
        return []
    if isinstance(tree, int):
        return [path]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in _ints(v, (*path, i))]
    return []


def _set(tree: list, path: tuple, value: Any) -> None:
    for i in path[:-1]:
        tree = tree[i]
    tree[path[-1]] = value


def m_int_extreme(tree: list, rng: random.Random, victims: list[str]) -> list:
    paths = _ints(tree)
    for path in rng.sample(paths, min(len(paths), rng.randrange(1, 4))):
        _set(tree, path, rng.choice(EXTREMES))
    return tree


def m_tail(tree: list, rng: random.Random, victims: list[str]) -> list:
    """A load tail (and engine_index) out of range, often on a 0-row frame."""
    if rng.random() < 0.5:
        tree = [TAG, [], [], [], [], [], [], [], []]
    tree = [*tree, 0, 0, 0, 0, 1000][:14]
    for k in rng.sample(range(9, 14), rng.randrange(1, 4)):
        tree[k] = rng.choice(EXTREMES)
    return tree


def m_repeat_rid(tree: list, rng: random.Random, victims: list[str]) -> list:
    """Bound rids (one to three) repeated in many rows, each row with a token."""
    rids = rng.sample(victims, min(len(victims), rng.randrange(1, 4)))
    n = rng.choice((2, 64, 300, 1000, 5000))
    rows = [rids[i % len(rids)] for i in range(n)]
    return [TAG, rows, [[7]] * n, [""] * n, [3] * n, [1] * n, [0] * n, [[]] * n, [[]] * n]


def m_wrong_type(tree: list, rng: random.Random, victims: list[str]) -> list:
    k = rng.randrange(1, len(tree))
    if isinstance(tree[k], list) and tree[k] and rng.random() < 0.7:
        tree[k][rng.randrange(len(tree[k]))] = rng.choice(WRONG)
    else:
        tree[k] = rng.choice(WRONG)
    return tree


def m_ragged(tree: list, rng: random.Random, victims: list[str]) -> list:
    k = rng.randrange(1, 9)
    if isinstance(tree[k], list) and tree[k] and rng.random() < 0.5:
        tree[k].pop()
    elif isinstance(tree[k], list):
        tree[k].append(tree[k][0] if tree[k] else 0)
    return tree


def m_finish(tree: list, rng: random.Random, victims: list[str]) -> list:
    reasons = tree[3]
    if isinstance(reasons, list) and reasons:
        reasons[rng.randrange(len(reasons))] = rng.choice(
            ["abort", "stop", "length", "nonsense", "", "\x00", "x" * 300, 7, None]
        )
    return tree


def m_form(tree: list, rng: random.Random, victims: list[str]) -> list:
    if rng.random() < 0.5:
        return tree[: rng.randrange(1, len(tree))]
    return tree + [rng.choice(WRONG + EXTREMES) for _ in range(rng.randrange(1, 6))]


def m_tag(tree: list, rng: random.Random, victims: list[str]) -> list:
    tree[0] = rng.choice(["", "BatchTokenIDOut", TAG + "x", 5, None, TAG.lower()])
    return tree


def m_long_row(tree: list, rng: random.Random, victims: list[str]) -> list:
    """Thousands of tokens in one row: through the spill path."""
    if tree[1]:
        k = rng.randrange(len(tree[1]))
        tree[2][k] = [rng.randrange(3, 32000) for _ in range(rng.randrange(100, 5000))]
        tree[7][k], tree[8][k] = [], []
    return tree


TREE_MUTATIONS: dict[str, Callable[[list, random.Random, list[str]], list]] = {
    "int": m_int_extreme,
    "tail": m_tail,
    "repeat": m_repeat_rid,
    "type": m_wrong_type,
    "ragged": m_ragged,
    "finish": m_finish,
    "form": m_form,
    "tag": m_tag,
    "long": m_long_row,
}


def b_flip(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        if b:
            b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
    return bytes(b)


def b_truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(0, max(1, len(data)))]


def b_splice(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(0, len(data) + 1)
    if rng.random() < 0.5:
        return data[:at] + rng.randbytes(rng.randrange(1, 16)) + data[at:]
    end = rng.randrange(at, len(data) + 1)
    return data[:end] + data[at:end] + data[end:]  # a slice repeated


def b_huge_length(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(0, len(data) + 1)
    header = rng.choice((b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xdc\xff\xff"))
    return data[:at] + header + data[at + 1 :]


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "flip": b_flip,
    "truncate": b_truncate,
    "splice": b_splice,
    "huge": b_huge_length,
}


def fuzz_frame(rng: random.Random, victims: list[str]) -> tuple[str, bytes]:
    """One rogue output frame and a name for what was done to it."""
    if rng.random() < 0.3:
        tree = json.loads(json.dumps(rng.choice(GOLDEN_OUTPUTS)))
        if victims and tree[1] and rng.random() < 0.7:
            tree[1] = [rng.choice(victims) for _ in tree[1]]
        how = ["golden"]
    else:
        rows = [rng.choice(victims) for _ in range(rng.randrange(0, 4))] if victims else []
        rows += [f"ghost-{rng.randrange(1000)}" for _ in range(rng.randrange(0, 3))]
        tree = _row_tree(rows, rng, rng.choice((9, 10, 14, 14, 14, 16)))
        how = ["rows"]
    kinds = [k for k in TREE_MUTATIONS if k not in SKIP]
    for kind in rng.sample(kinds, rng.randrange(0, 3)):
        try:
            tree = TREE_MUTATIONS[kind](tree, rng, victims or ["nobody"])
        except (IndexError, TypeError, AttributeError, ValueError):
            continue  # an earlier mutation left no such place: the frame is odd enough
        how.append(kind)
    try:
        data = msgspec.msgpack.encode(tree)
    except (OverflowError, TypeError):
        data = msgspec.msgpack.encode([v if not isinstance(v, int) else 0 for v in tree])
        how.append("unencodable")
    byte_kinds = [k for k in BYTE_MUTATIONS if k not in SKIP]
    if byte_kinds and rng.random() < 0.35:
        kind = rng.choice(byte_kinds)
        data = BYTE_MUTATIONS[kind](data, rng)
        how.append(kind)
    if data == ENGINE_CORE_DEAD:  # the one frame that may end the engine
        data = data[:-1]
    return "+".join(how), data


def handshake_frame(rng: random.Random) -> bytes:
    base = rng.choice([*GOLDEN_HANDSHAKE, encode_hello(), encode_ready(), GOLDEN_REGISTRATION])
    if rng.random() < 0.2:
        return rng.randbytes(rng.randrange(0, 200))
    return rng.choice(list(BYTE_MUTATIONS.values()))(base, rng)


def registration_frame(rng: random.Random) -> bytes:
    tree = msgspec.msgpack.decode(GOLDEN_REGISTRATION)
    key = rng.choice(list(tree))
    tree[key] = rng.choice([*EXTREMES[:-1], *WRONG[:-2]])
    data = msgspec.msgpack.encode(tree)
    if rng.random() < 0.4:
        data = rng.choice(list(BYTE_MUTATIONS.values()))(data, rng)
    return data


def marker_frame(probe: str, k: int) -> bytes:
    return encode_output(
        BatchTokenIDOutSlim(
            rids=[probe],
            output_ids=[[MARKER_BASE + k]],
            finished_reasons=[""],
            prompt_tokens=[3],
            completion_tokens=[1],
            cached_tokens=[0],
            output_token_logprobs_val=[[]],
            output_token_logprobs_idx=[[]],
        )
    )


# ------------------------------------------------------------------------------ diagnosis

REPLAY = """
import json, sys
from tsfront import _native
from tsfront.ipc.region import Geometry, Region
saved = json.load(open(sys.argv[1]))
frames = [bytes.fromhex(h) for h in saved["frames"]]
rids = saved["rids"]
g = Geometry(**saved["geometry"], max_engines=2)
region = Region.create(g)
w = _native.Writer(region.map, g.num_workers, g.slots_per_worker, g.ring_capacity, 2)
for slot, rid in enumerate(rids[: g.slots_per_worker]):
    w.bind(rid.encode(), slot, slot + 1, False, 18, 0)
for i, f in enumerate(frames):
    print("frame", i, flush=True)
    try:
        result = w.ingest(f, 0)
        w.flush_spills()
        w.wake()
    except Exception as exc:
        continue
    if result is not None:
        print("accepted", i, "engine_index and load tail", result[:5], flush=True)
print("survived", flush=True)
"""


def process_state(pid: int) -> str:
    """Whether a process that stopped answering is running (spinning) or sleeping, and where."""

    def sample() -> tuple[str, int]:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[11]) + int(fields[12])

    try:
        state, ticks0 = sample()
        time.sleep(0.5)  # a measurement window, not a synchronisation
        state, ticks = sample()
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read() or "-"
    except OSError as exc:
        return f"gone ({exc.strerror})"
    return f"state {state}, {ticks - ticks0} CPU ticks in 0.5 s, wchan {wchan}"


def pinpoint(batch_file: Path) -> str:
    """Replay a saved batch through a native Writer in a subprocess; which frame kills it."""
    proc = subprocess.run(
        [sys.executable, "-c", REPLAY, str(batch_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    accepted = "; ".join(line for line in lines if line.startswith("accepted"))
    if lines and lines[-1] == "survived":
        return (
            "replayed through a native Writer in a subprocess, no frame of the batch crashes "
            f"it (heap damage may go unnoticed there); it accepted: {accepted or 'none'}"
        )
    last = lines[-1].split()[-1] if lines else "?"
    return f"frame {last} of the batch kills a native Writer (exit {proc.returncode})"


# ------------------------------------------------------------------------------ the test


class Streams:
    """The live streams: witness and victim lanes, the probe, and what went wrong."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.client = r.client
        self.victims: dict[str, Any] = {}
        self.markers: set[int] = set()
        self.probe: str = ""
        self.failures: list[str] = []
        self.counts = {"witness": 0, "victim": 0, "witness_tokens": 0, "probes": 0}
        self.stop = False
        self.serial = 0

    def rid(self, kind: str) -> str:
        self.serial += 1
        return f"{kind}-{self.serial}"

    async def chunks(self, stream: Any):
        """The stream's chunks; a wait over DEADLINE is a failure that names the slot."""
        while True:
            task = asyncio.ensure_future(anext(stream))
            try:
                done, _ = await asyncio.wait({task}, timeout=DEADLINE)
                if not done:
                    att = self.client._att
                    state = slot_state(att.region, att.worker, stream.slot)
                    raise AssertionError(
                        f"{stream.rid}: no chunk for {DEADLINE}s (slot {stream.slot}: {state})"
                    )
            finally:
                if not task.done():
                    task.cancel()
            try:
                chunk = task.result()
            except StopAsyncIteration:
                return
            yield chunk

    async def witness(self, pin: int) -> None:
        rng = random.Random(pin * 7919 + self.serial)
        while not self.stop:
            rid, n = self.rid(f"witness{pin}"), rng.randrange(20, 200)
            try:
                stream = await self.client.generate(request(rid, n, pin=pin))
                got, ends, last = [], 0, None
                async for chunk in self.chunks(stream):
                    got.extend(chunk.output_ids)
                    ends += chunk.finished
                    last = chunk
                if got != expected_tokens(rid, n) or ends != 1 or last.finish_reason != "length":
                    self.failures.append(f"witness {rid}: {len(got)} tokens, {ends} ends, {last}")
            except (StreamError, AssertionError) as exc:
                self.failures.append(f"witness {rid}: {exc!r}")
                return
            self.counts["witness"] += 1
            self.counts["witness_tokens"] += len(got)

    async def victim(self) -> None:
        while not self.stop:
            rid = self.rid("victim")
            try:
                stream = await self.client.generate(request(rid, VICTIM_TOKENS, pin=0))
                self.victims[rid] = stream
                ends = 0
                async for chunk in self.chunks(stream):
                    ends += chunk.finished
                    if self.stop and not chunk.finished:
                        stream.abort()  # the fuzz is over: no need to wait for its end
                        ends = 1
                        break
                if ends != 1:
                    self.failures.append(f"victim {rid}: {ends} ends")
            except (StreamError, AssertionError) as exc:
                self.failures.append(f"victim {rid}: {exc!r}")
                return
            finally:
                self.victims.pop(rid, None)
            self.counts["victim"] += 1

    async def run_probe(self) -> None:
        while not self.stop:
            self.probe = rid = self.rid("probe")
            self.counts["probes"] += 1
            try:
                stream = await self.client.generate(request(rid, 30_000, pin=0))
                async for chunk in stream:  # no deadline: it waits while no marker is due
                    self.markers.update(t - MARKER_BASE for t in chunk.output_ids)
                    if self.stop:
                        stream.abort()
            except StreamError as exc:
                self.failures.append(f"probe {rid}: {exc!r}")
                return

    async def barrier(self, out: zmq.Socket, k: int) -> bool:
        """Send marker ``k`` until the probe has it (True), or the deadline passes."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if self.probe:
                out.send(marker_frame(self.probe, k))
            try:
                await wait_until(lambda: k in self.markers, f"marker {k}", 1.0, 0.001)
                return True
            except AssertionError:
                if not self.r.io.alive():
                    return False
        return False


class Rogues:
    """The rogue sockets: a PUSH on rank 0's output PULL, DEALERs on the handshake and input
    ROUTERs (a random identity, one out of range, and the two live ranks' identities)."""

    def __init__(self, ctx: zmq.Context, io: Any, rng: random.Random) -> None:
        self.out = ctx.socket(zmq.PUSH)
        self.out.connect(io.output_addresses[0])
        self.handshakes: list[zmq.Socket] = []
        self.inputs: list[zmq.Socket] = []
        for ident in (b"\x07", engine_identity(77), engine_identity(0), engine_identity(1)):
            for address, socks in (
                (io.handshake_address, self.handshakes),
                (io.input_address, self.inputs),
            ):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.IDENTITY, ident + rng.randbytes(rng.randrange(0, 2)))
                sock.connect(address)
                socks.append(sock)

    def close(self) -> None:
        for sock in (self.out, *self.handshakes, *self.inputs):
            sock.close(linger=0)


def stalled_batch(
    r: Any, k: int, sent: int, batch: list[tuple[str, bytes]], rids: list[str], tmp_path: Path
) -> str:
    """Why the I/O process stopped at batch ``k``: its fate, the frame that crashes a native
    Writer (if one does), where the batch is saved, and the batch's frames."""
    saved = tmp_path / f"peer-fuzz-batch-{k}.json"
    geometry = {
        "num_workers": GEOMETRY["max_workers"],
        "slots_per_worker": GEOMETRY["slots_per_worker"],
        "ring_capacity": GEOMETRY["ring_capacity"],
    }
    frames = [d.hex() for _, d in batch]
    saved.write_text(json.dumps({"frames": frames, "rids": rids, "geometry": geometry}))
    code = r.io._proc.poll()
    if code is None:
        fate = f"stopped ingesting ({process_state(r.io.pid)})"
    else:
        why = ": a Python exception, see the captured stderr" if code == 1 else ""
        fate = f"died (exit {code}{why})"
    listing = "\n".join(
        f"  {i}: {how} ({len(d)} bytes) {d[:80].hex()}" for i, (how, d) in enumerate(batch)
    )
    return (
        f"after {sent} frames, batch {k} (seed {SEED}): the I/O process {fate}; "
        f"{pinpoint(saved)}; saved in {saved}\n{listing}"
    )


async def fuzz(r: Any, s: Streams, rogues: Rogues, rng: random.Random, tmp_path: Path) -> int:
    """Send every batch, each followed by its marker; the number of output frames sent."""
    sent = 0
    for k in range(BATCHES):
        batch = [fuzz_frame(rng, list(s.victims)) for _ in range(OUTPUT_FRAMES_PER_BATCH)]
        for _how, data in batch:
            rogues.out.send(data)
        for _ in range(2):
            rng.choice(rogues.handshakes).send(handshake_frame(rng))
            rng.choice(rogues.inputs).send(registration_frame(rng))
        sent += len(batch)
        if not await s.barrier(rogues.out, k):
            raise AssertionError(stalled_batch(r, k, sent, batch, [*s.victims, s.probe], tmp_path))
        assert not s.failures, "\n".join(s.failures)
    return sent


async def test_io_process_survives_mutated_peer_frames_while_streams_stay_correct(tmp_path):
    rng = random.Random(SEED)
    ctx = zmq.Context()
    try:
        async with rig(2, config=GEOMETRY) as r:
            pid = r.io.pid
            s = Streams(r)
            tasks = [asyncio.create_task(s.run_probe())]
            tasks += [asyncio.create_task(s.witness(0)) for _ in range(6)]
            tasks += [asyncio.create_task(s.witness(1)) for _ in range(2)]
            tasks += [asyncio.create_task(s.victim()) for _ in range(8)]
            await wait_until(lambda: len(s.victims) == 8 and s.probe, "victims and probe live")
            rogues = Rogues(ctx, r.io, rng)
            t0 = time.monotonic()
            try:
                sent = await fuzz(r, s, rogues, rng, tmp_path)
            except BaseException:
                for task in tasks:
                    task.cancel()
                raise
            finally:
                s.stop = True
                rogues.close()
            seconds = time.monotonic() - t0
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            assert not s.failures, "\n".join(s.failures)
            # Still the same process, still serving both ranks; both ranks still live.
            assert r.io.alive() and r.io.pid == pid
            assert [e.state for e in r.client.load()] == ["live", "live"]
            for pin in (0, 1):
                rid = f"after-fuzz-{pin}"
                stream = await r.client.generate(request(rid, 50, pin=pin))
                got = [t async for chunk in s.chunks(stream) for t in chunk.output_ids]
                assert got == expected_tokens(rid, 50)
            # Requests a rogue frame ended were finished here too: nothing is left held.
            await wait_until(lambda: r.client.metrics()["in_flight"] == 0, "in_flight 0")
            print(
                f"\npeer fuzz: {sent} output frames, {4 * BATCHES} handshake/input frames in "
                f"{seconds:.1f}s; {s.counts}"
            )
    finally:
        ctx.destroy(linger=0)
