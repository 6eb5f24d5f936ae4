"""``tsfront serve``'s request edge: API keys, request ids, CORS, the access log.

Two servers (one worker each, two `SimGroup` ranks): ``keyed`` with ``--api-key k1`` (and
``TSFRONT_API_KEY=k2``), ``--protect-metrics``, ``--allowed-origins https://app.example``,
``--access-log --log-format json``; ``plain`` with no keys or CORS and a text access log. The
access-log lines are read from the server's stdout, with a deadline.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from support.serve_fixtures import Served, serving

from tsfront.serve.edge import gate as gate_module
from tsfront.serve.edge.gate import Gate
from tsfront.serve.edge.settings import EdgeSettings

FIRST = 100
DEADLINE = 15.0
ORIGIN = "https://app.example"


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


def rids(s: Served) -> list[str]:
    return [r.rid for e in s.group.engines for r in e.requests()]


@pytest.fixture(scope="module")
def keyed(model_dir: str) -> Iterator[Served]:
    with serving(
        model_dir,
        args=["--api-key", "k1", "--protect-metrics", "--allowed-origins", ORIGIN,
              "--access-log", "--log-format", "json"],
        env={"TSFRONT_API_KEY": "k2"},
        token_fn=token_fn,
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def plain(model_dir: str) -> Iterator[Served]:
    with serving(model_dir, args=["--access-log"], token_fn=token_fn) as s:
        yield s


# ---------------------------------------------------------------------- keys


def test_openai_client_with_either_key_is_served(keyed: Served) -> None:
    for key in ("k1", "k2"):  # the flag's and TSFRONT_API_KEY's
        client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=key, max_retries=0)
        out = client.completions.create(model="tiny-words", prompt="w5", max_tokens=3)
        assert out.choices[0].text == " w100 w101 w102"


def test_missing_or_wrong_key_is_401_in_openais_shape(keyed: Served) -> None:
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model="tiny-words", prompt="w5", max_tokens=3)
    for headers in ({}, {"authorization": "Bearer k3"}, {"authorization": "Basic k1"}):
        response = httpx.get(f"{keyed.url}/v1/models", headers=headers, timeout=5)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
        assert error["param"] is None and "API key" in error["message"]
        assert error["request_id"] == response.headers["x-request-id"]


def test_health_open_metrics_protected(keyed: Served, plain: Served) -> None:
    assert httpx.get(f"{keyed.url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{keyed.url}/metrics", timeout=5).status_code == 401
    # With the key, /metrics passes the edge (served once the metrics route exists: 200 or 404).
    ok = httpx.get(f"{keyed.url}/metrics", headers={"authorization": "Bearer k1"}, timeout=5)
    assert ok.status_code != 401
    # No keys: everything open.
    assert httpx.get(f"{plain.url}/v1/models", timeout=5).status_code == 200


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(gate_module.hmac, "compare_digest", compare)
    gate = Gate(EdgeSettings(api_keys=("aa", "bb")))
    scope = {"method": "GET", "path": "/v1/models", "headers": [(b"authorization", b"Bearer aa")]}
    assert gate.open(scope).refusal is None
    assert calls == [(b"aa", b"aa"), (b"aa", b"bb")]  # every key, even after a match
    scope["headers"] = [(b"authorization", b"Bearer zz")]
    assert gate.open(scope).refusal.status == 401


# ---------------------------------------------------------------------- request ids


def test_request_id_given_is_echoed_and_ends_the_engine_rid(plain: Served) -> None:
    response = httpx.post(
        f"{plain.url}/v1/completions",
        json={"prompt": "w5", "max_tokens": 2},
        headers={"x-request-id": "my-req.1:a_b"},
        timeout=DEADLINE,
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "my-req.1:a_b"
    assert any(rid.endswith("-my-req.1:a_b") for rid in rids(plain))
    # n=2: two engine rids, both with the id, still distinct.
    httpx.post(
        f"{plain.url}/v1/completions",
        json={"prompt": "w5", "max_tokens": 2, "n": 2},
        headers={"x-request-id": "fan"},
        timeout=DEADLINE,
    )
    fan = [rid for rid in rids(plain) if "-fan-" in rid or rid.endswith("-fan")]
    assert len(fan) == 2 and len(set(fan)) == 2


def test_request_id_generated_when_absent_and_in_error_objects(plain: Served) -> None:
    a = httpx.get(f"{plain.url}/health", timeout=5).headers["x-request-id"]
    b = httpx.get(f"{plain.url}/health", timeout=5).headers["x-request-id"]
    # From `secrets`, whole: a prefix and a counter would tell a client how many requests the
    # others made between two of its own.
    assert re.fullmatch(r"[0-9a-f]{24}", a) and re.fullmatch(r"[0-9a-f]{24}", b)
    assert a[:12] != b[:12] and a[12:] != b[12:]
    bad = httpx.post(
        f"{plain.url}/v1/completions",
        json={"prompt": "w5", "top_p": 7},
        headers={"x-request-id": "err-1"},
        timeout=5,
    )
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "err-1"
    assert bad.json()["error"]["request_id"] == "err-1"
    assert bad.json()["error"]["param"] == "top_p"
    missing = httpx.get(f"{plain.url}/nowhere", headers={"x-request-id": "nf"}, timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["request_id"] == "nf"


@pytest.mark.parametrize("value", ["x" * 129, "has space", "semi;colon", "ü"])
def test_bad_request_id_is_400(plain: Served, value: str) -> None:
    response = httpx.get(f"{plain.url}/health", headers={"x-request-id": value.encode()}, timeout=5)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "x-request-id" and "128" in error["message"]
    assert error["request_id"] == response.headers["x-request-id"] != value


# ---------------------------------------------------------------------- CORS


def test_cors_preflight_and_simple_requests(keyed: Served, plain: Served) -> None:
    pre = httpx.options(
        f"{keyed.url}/v1/chat/completions",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
        timeout=5,
    )
    assert pre.status_code == 204  # no key needed for a preflight
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = pre.headers["access-control-allow-headers"].lower()
    assert {"authorization", "content-type", "x-request-id"} <= {
        h.strip() for h in allowed.split(",")
    }
    simple = httpx.get(
        f"{keyed.url}/v1/models",
        headers={"origin": ORIGIN, "authorization": "Bearer k1"},
        timeout=5,
    )
    assert simple.status_code == 200
    assert simple.headers["access-control-allow-origin"] == ORIGIN
    assert simple.headers["vary"].lower() == "origin"
    assert "x-request-id" in simple.headers["access-control-expose-headers"]
    # A 401 carries the CORS headers too (a browser can read the error).
    denied = httpx.get(f"{keyed.url}/v1/models", headers={"origin": ORIGIN}, timeout=5)
    assert denied.status_code == 401
    assert denied.headers["access-control-allow-origin"] == ORIGIN
    # Another origin: no CORS headers, preflight refused.
    other = httpx.get(f"{keyed.url}/health", headers={"origin": "https://evil.example"}, timeout=5)
    assert "access-control-allow-origin" not in other.headers
    pre_other = httpx.options(
        f"{keyed.url}/v1/completions",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        timeout=5,
    )
    assert pre_other.status_code == 403
    assert "access-control-allow-origin" not in pre_other.headers
    # No --allowed-origins: no CORS at all.
    none = httpx.get(f"{plain.url}/health", headers={"origin": ORIGIN}, timeout=5)
    assert "access-control-allow-origin" not in none.headers
    pre_none = httpx.options(
        f"{plain.url}/v1/completions",
        headers={"origin": ORIGIN, "access-control-request-method": "POST"},
        timeout=5,
    )
    assert pre_none.status_code == 404


# ---------------------------------------------------------------------- access log


def test_access_log_text_lines(plain: Served) -> None:
    httpx.post(
        f"{plain.url}/v1/completions",
        json={"prompt": "w5 w6 w7", "max_tokens": 6},
        headers={"x-request-id": "log-text-1"},
        timeout=DEADLINE,
    )
    line = plain.server.wait_line(r"^log-text-1 ", DEADLINE).string
    m = re.fullmatch(
        r"log-text-1 POST /v1/completions 200 prompt_tokens=3 completion_tokens=6 "
        r"ttft=(\d+\.\d+) duration=(\d+\.\d+) finish=length",
        line,
    )
    assert m, line
    assert 0 < float(m.group(1)) <= float(m.group(2))
    with httpx.stream(
        "POST",
        f"{plain.url}/v1/completions",
        json={"prompt": "w5", "max_tokens": 3000, "stream": True},
        headers={"x-request-id": "log-gone"},
        timeout=DEADLINE,
    ) as response:
        next(line for line in response.iter_lines() if line.startswith("data: "))
    line = plain.server.wait_line(r"^log-gone ", DEADLINE).string
    # The client left mid-stream: 499, and no finish reason came from the engine.
    assert line.startswith("log-gone POST /v1/completions 499 ") and "finish=none" in line, line
    httpx.get(f"{plain.url}/health", headers={"x-request-id": "log-health"}, timeout=5)
    line = plain.server.wait_line(r"^log-health ", DEADLINE).string
    assert line.startswith("log-health GET /health 200 prompt_tokens=- completion_tokens=- ttft=-")


def test_access_log_json_lines(keyed: Served) -> None:
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="k1", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny-words",
        messages=[{"role": "user", "content": "w5"}],
        max_tokens=5,
        stream=True,
        extra_headers={"x-request-id": "log-json-1"},
    )
    assert sum(1 for _ in stream) > 1
    line = keyed.server.wait_line(r'"request_id":"log-json-1"', DEADLINE).string
    entry = json.loads(line)
    assert entry["method"] == "POST" and entry["route"] == "/v1/chat/completions"
    assert entry["status"] == 200 and entry["completion_tokens"] == 5
    assert entry["prompt_tokens"] > 1 and entry["finish_reason"] == "length"
    assert 0 < entry["ttft_s"] <= entry["duration_s"]
    httpx.get(f"{keyed.url}/v1/models", headers={"x-request-id": "log-json-401"}, timeout=5)
    entry = json.loads(keyed.server.wait_line(r'"request_id":"log-json-401"', DEADLINE).string)
    assert entry["status"] == 401 and entry["prompt_tokens"] is None
