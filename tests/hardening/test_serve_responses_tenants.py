"""Stored responses against a hostile tenant: another key's objects, guessed ids, metadata
as a payload, and a store that fails as a stream ends (issue 36, items 1, 9 and 11).

One real server (master, I/O process, responses store process, two workers) with two API
keys, ``A`` and ``B``, on a simulated rank whose every output token ``p`` is ``100 + p`` (the
word-level test model reads it ``w<100 + p>``). Each test is what a client could send, over
HTTP; which worker served a request is read from its engine rid (``w<worker>-…``). The last
test stops the store process (SIGSTOP) and continues it.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from support.serve_fixtures import Served, engine_request, serving

from tsfront.serve.processes.store import STORE_TIMEOUT_S

FIRST = 100
DEADLINE = 30.0
A = "key-of-tenant-a"
B = "key-of-tenant-b"


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


def connect(s: Served, key: str | None) -> httpx.Client:
    """A keep-alive connection (so: one worker) with ``key``'s Authorization."""
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    return httpx.Client(base_url=s.url, headers=headers, timeout=DEADLINE)


def engine_adds(s: Served) -> int:
    return sum(c["adds"] for c in s.group.counters().values())


def worker_of(s: Served, request_id: str) -> str:
    return str(engine_request(s.group, request_id).rid.split("-")[0])


def store_pid(s: Served) -> int:
    found = re.findall(r"responses store process (\d+)$", s.server.stderr(), re.M)
    assert found, s.server.stderr()
    return int(found[-1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tsfront.text.testing import make_test_model

    base = tmp_path_factory.mktemp("tenants")
    model = make_test_model(base / "words", "wordlevel")
    with serving(
        model,
        workers=2,
        ranks=1,
        args=["--api-key", A, "--api-key", B],
        stderr=base / "stderr.txt",
        timeout=90,
        token_fn=token_fn,
    ) as s:
        yield s


_ids = iter(range(1_000_000))


def rid() -> str:
    return f"t{next(_ids)}"


def respond(http: httpx.Client, **body: Any) -> dict[str, Any]:
    body.setdefault("input", "w5")
    body.setdefault("max_output_tokens", 3)
    response = http.post("/v1/responses", json=body, headers={"x-request-id": rid()})
    assert response.status_code == 200, response.text
    return dict(response.json())


def without_ids(response: httpx.Response, rid: str) -> dict[str, Any]:
    """An error body with the id it names and its request id taken out."""
    error = dict(response.json()["error"])
    error.pop("request_id")
    error["message"] = error["message"].replace(rid, "ID")
    return error


# ---------------------------------------------------------------------- item 1: ownership


def test_another_key_gets_the_404_of_an_id_never_stored(served: Served) -> None:
    with connect(served, A) as a, connect(served, B) as b:
        mine = respond(a)
        never = "resp_" + os.urandom(12).hex()
        for method, rid_ in (("GET", never), ("GET", mine["id"])):
            assert b.request(method, f"/v1/responses/{rid_}").status_code == 404
        # Every way B can name A's response is answered as an id that was never stored.
        for method in ("GET", "DELETE"):
            theirs = b.request(method, f"/v1/responses/{mine['id']}")
            missing = b.request(method, f"/v1/responses/{never}")
            assert theirs.status_code == missing.status_code == 404
            assert without_ids(theirs, mine["id"]) == without_ids(missing, never)
            assert without_ids(theirs, mine["id"])["param"] == "response_id"
        adds = engine_adds(served)
        theirs = b.post("/v1/responses", json={"input": "w1", "previous_response_id": mine["id"]})
        missing = b.post("/v1/responses", json={"input": "w1", "previous_response_id": never})
        assert theirs.status_code == missing.status_code == 404
        assert without_ids(theirs, mine["id"]) == without_ids(missing, never)
        assert without_ids(theirs, mine["id"])["param"] == "previous_response_id"
        assert engine_adds(served) == adds  # nothing of A's conversation reached the engine
        # A's response is still A's: B's DELETE removed nothing.
        got = a.get(f"/v1/responses/{mine['id']}")
        assert got.status_code == 200 and got.json() == mine
        assert respond(a, previous_response_id=mine["id"])["previous_response_id"] == mine["id"]
        assert a.delete(f"/v1/responses/{mine['id']}").status_code == 200
        assert a.get(f"/v1/responses/{mine['id']}").status_code == 404


def test_a_keys_stored_responses_are_its_own_on_every_worker(served: Served) -> None:
    # The owner is a handle of the key, the same in every worker: a response A stored through
    # one worker is A's through the other, and never B's.
    with connect(served, A) as a:
        streamed = a.post(
            "/v1/responses", json={"input": "w5", "max_output_tokens": 3, "stream": True}
        )
        assert streamed.status_code == 200
    done = [line for line in streamed.text.splitlines() if '"response.incomplete"' in line]
    stored = msgspec.json.decode(done[-1].removeprefix("data: ").encode())["response"]
    seen: dict[str, int] = {}
    for _ in range(60):
        with connect(served, A) as a, connect(served, B) as b:
            request_id = rid()
            chat = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 1}
            a.post("/v1/chat/completions", headers={"x-request-id": request_id}, json=chat)
            worker = worker_of(served, request_id)
            got = a.get(f"/v1/responses/{stored['id']}")  # the same connection: that worker
            assert got.status_code == 200 and got.json() == stored
            assert b.get(f"/v1/responses/{stored['id']}").status_code == 404
            seen[worker] = seen.get(worker, 0) + 1
        if len(seen) == 2:
            return
    raise AssertionError(f"60 connections all landed on one worker: {seen}")


def test_without_a_key_the_stored_routes_are_refused(served: Served) -> None:
    with connect(served, A) as a, connect(served, None) as anyone:
        mine = respond(a)
        for method in ("GET", "DELETE"):
            assert anyone.request(method, f"/v1/responses/{mine['id']}").status_code == 401
        assert a.get(f"/v1/responses/{mine['id']}").status_code == 200


# The Mersenne Twister behind `random`: its state is 624 words, and each output word is
# the state word "tempered" by an invertible map, so 624 consecutive outputs give the state.
def _untemper(y: int) -> int:
    y ^= y >> 18
    x = y
    for _ in range(3):
        x = y ^ ((x << 15) & 0xEFC60000)
    y = x & 0xFFFFFFFF
    x = y
    for _ in range(5):
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x & 0xFFFFFFFF
    x = y
    for _ in range(3):
        x = y ^ (x >> 11)
    return x & 0xFFFFFFFF


def _next_96_bits(words: list[int]) -> str:
    """The next ``getrandbits(96)`` of the generator that drew ``words`` (624 of them), as the
    24 hex digits of ``.to_bytes(12, "big").hex()``."""
    rng = random.Random()
    rng.setstate((3, (*(_untemper(w) for w in words[-624:]), 624), None))
    return rng.getrandbits(96).to_bytes(12, "big").hex()


def test_the_untempering_predicts_a_mersenne_twister() -> None:
    # The attack's arithmetic, checked on a generator of our own (so the test below can fail).
    rng = random.Random(os.urandom(16))
    words: list[int] = []
    for _ in range(208):
        hex_id = rng.getrandbits(96).to_bytes(12, "big").hex()
        words += [int(hex_id[16:24], 16), int(hex_id[8:16], 16), int(hex_id[0:8], 16)]
    assert _next_96_bits(words) == rng.getrandbits(96).to_bytes(12, "big").hex()


def test_completion_ids_cannot_be_predicted_from_earlier_ones(served: Served) -> None:
    # The attack of issue 36: ~208 ids of one-token completions on one keep-alive connection
    # (one worker) gave its generator's state, and so every id it would make next.
    body = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 1}
    with connect(served, B) as b:
        words: list[int] = []
        ids = []
        for _ in range(209):
            response = b.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
            ids.append(response.json()["id"].removeprefix("chatcmpl-"))
        for hex_id in ids[:208]:
            assert re.fullmatch(r"[0-9a-f]{24}", hex_id)
            words += [int(hex_id[16:24], 16), int(hex_id[8:16], 16), int(hex_id[0:8], 16)]
    assert ids[208] != _next_96_bits(words), "the next id followed from the 208 before it"


# ---------------------------------------------------------------------- item 9: metadata


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({f"k{i}": "v" for i in range(17)}, "17 pairs"),
        ({"k" * 65: "v"}, "65 characters"),
        ({"k": "v" * 513}, "513 characters"),
        ({"k": 1}, "not a string"),
        ({"k": None}, "not a string"),
        ({"k": {"nested": "v"}}, "not a string"),
        (["k", "v"], "must be an object"),
        ({"k": "v" * (8 << 20)}, "characters long"),  # the 8 MB of the attack
    ],
    ids=["17-pairs", "65-char-key", "513-char-value", "number", "null", "object", "list", "8MB"],
)
def test_metadata_beyond_openais_limits_is_a_400(served: Served, metadata: Any, words: str) -> None:
    adds = engine_adds(served)
    with connect(served, A) as a:
        for stream in (False, True):
            response = a.post(
                "/v1/responses", json={"input": "w5", "metadata": metadata, "stream": stream}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "metadata" and words in error["message"], error
            assert error["type"] == "invalid_request_error"
    assert engine_adds(served) == adds


def test_metadata_at_openais_limits_is_kept(served: Served) -> None:
    metadata = {f"{i:02d}".ljust(64, "k"): "v" * 512 for i in range(16)}
    with connect(served, A) as a:
        out = respond(a, metadata=metadata)
        assert out["metadata"] == metadata
        assert a.get(f"/v1/responses/{out['id']}").json()["metadata"] == metadata


# ---------------------------------------------------------------------- item 11: the last put


def _events(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.startswith("data: ")]
    return [msgspec.json.decode(line.removeprefix("data: ").encode()) for line in lines]


def test_a_store_that_fails_at_the_end_of_a_stream_closes_its_items_then_errs(
    served: Served,
) -> None:
    # Last in the module: the store is stopped for the length of one request's put.
    with connect(served, A) as a:
        whole = a.post(
            "/v1/responses", json={"input": "w5", "max_output_tokens": 20, "stream": True}
        )
        pid = store_pid(served)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            failed = a.post(
                "/v1/responses", json={"input": "w5", "max_output_tokens": 20, "stream": True}
            )
            took = time.monotonic() - t0
        finally:
            os.kill(pid, signal.SIGCONT)
    assert whole.status_code == failed.status_code == 200
    assert took < STORE_TIMEOUT_S + 10
    sent, ended = _events(whole.text), _events(failed.text)
    assert [e["sequence_number"] for e in ended] == list(range(len(ended)))  # no gap

    # Everything the stored stream sent, the failed one sent too (the deltas may be cut
    # otherwise), then an error instead of the final response.incomplete: every item it
    # opened is closed first.
    def kinds(events: list[dict[str, Any]]) -> list[str]:
        return [e["type"] for e in events if not e["type"].endswith(".delta")]

    assert kinds(ended[:-1]) == kinds(sent[:-1])
    assert "".join(e["delta"] for e in ended if e["type"] == "response.output_text.delta") == (
        "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
    )
    assert sent[-1]["type"] == "response.incomplete"
    assert ended[-1]["type"] == "error" and ended[-1]["code"] == "service_unavailable_error"
    assert "store" in ended[-1]["message"]
    added = [e["item"] for e in ended if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in ended if e["type"] == "response.output_item.done"]
    assert added and [i["id"] for i in added] == [i["id"] for i in done]
    assert all(i["status"] == "completed" for i in done)
