"""``tsfront serve`` end to end with the official ``openai`` client, on simulated ranks.

One server per module (master, I/O process, two uvicorn workers, as a process group of its
own) against two in-process `SimGroup` ranks whose ``token_fn`` makes output token ``p`` of
every request ``FIRST + p``; the model folder is the text layer's word-level test tokenizer,
where token ``i`` reads ``w<i>``, so every text is known in advance: `expected_text`. The
sim's logs and counters show what reached the engines (aborts included). Every wait has a
deadline. About 20 s in all, most of it the three servers' start.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest
from support.serve_fixtures import Front, ServeProcess, session_shm, shm_left
from support.serve_fixtures import start_served as serve_rig

from tsfront.sim import SimGroup
from tsfront.sim.scheduler import default_logprob

FIRST = 100
DEADLINE = 15.0
CONTEXT = 4096


def token_fn(rid: str, position: int) -> int:
    return FIRST + position


def expected_text(tokens: int, start: int = 0) -> str:
    return "".join(f" w{FIRST + p}" for p in range(start, tokens))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tsfront.text.testing import make_test_model

    return str(make_test_model(tmp_path_factory.mktemp("model") / "tiny-words", "wordlevel"))


class Served(Front):
    def __init__(self, server: ServeProcess, group: SimGroup, url: str) -> None:
        super().__init__(url, group, first=FIRST, deadline=DEADLINE)
        self.server = server
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def start_served(model_dir: str, workers: int, context: int = CONTEXT, **sim: object) -> Served:
    # The library's rig (tsfront.testing, the plugin's tsfront_serve fixture): the server in a
    # session of its own, two in-process ranks dialing its handshake.
    s = serve_rig(
        model_dir, workers=workers, ranks=2, token_fn=token_fn, max_model_len=context, **sim
    )
    return Served(s.server, s.group, s.url)


@pytest.fixture(scope="module")
def served(model_dir: str) -> Iterator[Served]:
    s = start_served(model_dir, workers=2)
    yield s
    assert s.server.stop() == 0
    s.group.stop()


# ---------------------------------------------------------------------- completions


def test_completion_text_and_usage(served: Served) -> None:
    out = served.client.completions.create(model="tiny-words", prompt="w5 w6 w7", max_tokens=6)
    assert out.object == "text_completion"
    assert out.choices[0].text == expected_text(6)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == 3
    assert out.usage.completion_tokens == 6
    assert out.usage.total_tokens == 9
    assert out.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_prompt_as_token_ids(served: Served) -> None:
    out = served.client.completions.create(model="tiny-words", prompt=[5, 6, 7, 8], max_tokens=3)
    assert out.choices[0].text == expected_text(3)
    assert out.usage.prompt_tokens == 4


def test_completion_streamed_with_usage(served: Served) -> None:
    stream = served.client.completions.create(
        model="tiny-words",
        prompt="w5 w6",
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finish, usage = [], None, None
    for event in stream:
        if event.choices:
            texts.append(event.choices[0].text)
            finish = event.choices[0].finish_reason or finish
        if event.usage is not None:
            usage = event.usage
    assert "".join(texts) == expected_text(20)
    assert finish == "length"
    assert usage.completion_tokens == 20 and usage.prompt_tokens == 2
    assert len(texts) > 1  # streamed, not one blob


def test_stop_string_split_across_tokens_ends_and_aborts(served: Served) -> None:
    # " w100 w101 w102 w103 ...": "2 w10" starts inside token 102 and ends inside token 103.
    before = served.aborts()
    out = served.client.completions.create(
        model="tiny-words", prompt="w5", max_tokens=500, stop=["2 w10", "never"]
    )
    assert out.choices[0].text == " w100 w101 w10"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens < 500
    served.wait("the stop string's ABORT at the engine", lambda: served.aborts() > before)


def test_stop_string_streamed_never_shows_part_of_it(served: Served) -> None:
    before = served.aborts()
    stream = served.client.completions.create(
        model="tiny-words", prompt="w5", max_tokens=500, stop="w104 w105", stream=True
    )
    events = [e.choices[0] for e in stream]
    text = "".join(c.text for c in events)
    assert text == " w100 w101 w102 w103 "
    assert events[-1].finish_reason == "stop"
    assert all("w104" not in c.text for c in events)
    served.wait("the stop string's ABORT at the engine", lambda: served.aborts() > before)


def test_include_stop_str_in_output(served: Served) -> None:
    out = served.client.completions.create(
        model="tiny-words",
        prompt="w5",
        max_tokens=50,
        stop=["w102"],
        extra_body={"include_stop_str_in_output": True},
    )
    assert out.choices[0].text == " w100 w101 w102"


def test_n2_fans_out_into_two_engine_requests(served: Served) -> None:
    adds = served.adds()
    out = served.client.completions.create(model="tiny-words", prompt="w5 w6", max_tokens=4, n=2)
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert all(c.text == expected_text(4) for c in out.choices)
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens == 2
    assert served.adds() - adds == 2


def test_n2_streamed(served: Served) -> None:
    stream = served.client.completions.create(
        model="tiny-words", prompt="w5", max_tokens=7, n=2, stream=True
    )
    texts = {0: "", 1: ""}
    finished = set()
    for event in stream:
        choice = event.choices[0]
        texts[choice.index] += choice.text
        if choice.finish_reason:
            finished.add(choice.index)
    assert texts == {0: expected_text(7), 1: expected_text(7)}
    assert finished == {0, 1}


def test_logprobs_of_the_sampled_tokens(served: Served) -> None:
    out = served.client.completions.create(
        model="tiny-words", prompt="w5", max_tokens=5, logprobs=0
    )
    lp = out.choices[0].logprobs
    assert lp.tokens == [f" w{FIRST + p}" for p in range(5)]  # as it shows in the stream
    assert lp.token_logprobs == [default_logprob(FIRST + p) for p in range(5)]
    chat = served.client.chat.completions.create(
        model="tiny-words",
        messages=[{"role": "user", "content": "w5"}],
        max_tokens=3,
        logprobs=True,
    )
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [" w100", " w101", " w102"]
    assert [bytes(c.bytes) for c in content] == [b" w100", b" w101", b" w102"]
    assert [c.logprob for c in content] == [default_logprob(FIRST + p) for p in range(3)]


def test_logprobs_streamed(served: Served) -> None:
    stream = served.client.chat.completions.create(
        model="tiny-words",
        messages=[{"role": "user", "content": "w5"}],
        max_tokens=4,
        logprobs=True,
        stream=True,
    )
    got = []
    for event in stream:
        if event.choices and event.choices[0].logprobs:
            got.extend((c.token, c.logprob) for c in event.choices[0].logprobs.content)
    assert got == [(f" w{FIRST + p}", default_logprob(FIRST + p)) for p in range(4)]


# ---------------------------------------------------------------------- chat


def test_chat_completion(served: Served) -> None:
    out = served.client.chat.completions.create(
        model="tiny-words",
        messages=[{"role": "system", "content": "w9"}, {"role": "user", "content": "w5 w6"}],
        max_completion_tokens=5,
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content.lstrip(" ") == expected_text(5).lstrip(" ")
    assert out.choices[0].finish_reason == "length"
    # The ChatML template wraps both messages and opens the assistant's turn.
    assert out.usage.prompt_tokens > 3


def test_chat_streamed(served: Served) -> None:
    stream = served.client.chat.completions.create(
        model="tiny-words",
        messages=[{"role": "user", "content": [{"type": "text", "text": "w5"}]}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    roles, text, finish, usage = [], "", None, None
    for event in stream:
        if event.choices:
            delta = event.choices[0].delta
            roles.append(delta.role)
            text += delta.content or ""
            finish = event.choices[0].finish_reason or finish
        if event.usage:
            usage = event.usage
    assert roles[0] == "assistant"
    assert text.lstrip(" ") == expected_text(10).lstrip(" ")
    assert finish == "length"
    assert usage.completion_tokens == 10


# ---------------------------------------------------------------------- disconnects


def test_client_disconnect_aborts_the_engine_request(served: Served) -> None:
    served.leave_mid_stream()


def test_many_clients_leaving_at_once_abort_every_engine_request(served: Served) -> None:
    # 64 connections over the two workers, lost together: each protocol tells every request.
    served.leave_together(64)


def test_client_leaving_before_the_first_token_aborts_the_engine_request(served: Served) -> None:
    # Only the protocol's word of the lost connection can end it (nothing is being sent).
    served.leave_before_first_token()


# ---------------------------------------------------------------------- refusals


def post(served: Served, path: str, body: object) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{served.url}{path}", content=data, timeout=DEADLINE)


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "words"),
    [
        ("/v1/completions", b"{not json", 400, None, "not valid JSON"),
        ("/v1/completions", {"prompt": "w5", "max_tokens": "x"}, 400, None, "$.max_tokens"),
        ("/v1/completions", {"max_tokens": 3}, 400, None, "prompt"),
        ("/v1/completions", {"prompt": "w5", "top_p": 7}, 400, "top_p", "top_p=7.0"),
        ("/v1/completions", {"prompt": "w5", "top_k": 0}, 400, "top_k", "top_k=0"),
        ("/v1/completions", {"prompt": "w5", "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        ("/v1/completions", {"prompt": "w5", "n": 0}, 400, "n", "n=0"),
        ("/v1/completions", {"prompt": "w5", "logprobs": 3}, 400, "logprobs", "logprobs=0"),
        ("/v1/completions", {"prompt": "w5", "echo": True}, 400, "echo", "echo"),
        ("/v1/completions", {"prompt": "w5", "stop": [""]}, 400, "stop", "empty"),
        ("/v1/completions", {"prompt": "", "max_tokens": 3}, 400, "prompt", "no tokens"),
        ("/v1/completions", {"prompt": [5, -1]}, 400, "prompt", "non-negative"),
        (
            "/v1/completions",
            {"prompt": [5] * CONTEXT, "max_tokens": 10},
            400,
            "prompt",
            "at most",
        ),
        ("/v1/completions", {"prompt": "w5", "model": "gpt-9"}, 404, "model", "gpt-9"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages", "empty"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "assistant", "content": "w5"}]},
            400,
            "messages",
            "must not start with an assistant",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w5"}], "top_logprobs": 2},
            400,
            "top_logprobs",
            "sampled token",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "w5"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            400,
            "tools",
            "start tsfront serve with --tool-call-parser",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages",
            "only text",
        ),
    ],
)
def test_bad_request_gets_its_status_and_message(
    served: Served, path: str, body: object, status: int, param: str | None, words: str
) -> None:
    response = post(served, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"]
    assert error["param"] == param
    assert error["type"] in ("invalid_request_error",)


def test_openai_client_raises_bad_request(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="top_p"):
        served.client.completions.create(model="tiny-words", prompt="w5", top_p=2.0)


def test_routes_models_health_and_unknown(served: Served) -> None:
    models = served.client.models.list()
    assert [m.id for m in models.data] == ["tiny-words"]
    health = httpx.get(f"{served.url}/health", timeout=5)
    assert health.status_code == 200
    assert [e["state"] for e in health.json()["engines"]] == ["live", "live"]
    assert httpx.get(f"{served.url}/v1/nothing", timeout=5).status_code == 404
    assert httpx.get(f"{served.url}/v1/completions", timeout=5).status_code == 404


# ---------------------------------------------------------------------- no engine, shutdown


def test_engine_death_mid_response_closes_its_items_as_incomplete_then_errs(
    model_dir: str,
) -> None:
    # /v1/responses: a client that tracks the items it was shown (output_item.added) sees each
    # one end (output_item.done, "incomplete": the death cut it) before the error event, with
    # no gap in the sequence numbers; as the store's failure ends a stream.
    s = start_served(model_dir, workers=1)
    try:
        with httpx.stream(
            "POST",
            f"{s.url}/v1/responses",
            json={"input": "w5", "max_output_tokens": 3000, "stream": True},
            timeout=DEADLINE,
        ) as response:
            assert response.status_code == 200
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            events = []
            for line in lines:
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "response.output_text.delta":
                    break
            s.group.stop()  # the ranks send ENGINE_CORE_DEAD mid-stream
            events += [json.loads(line[6:]) for line in lines]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "error" and "died" in events[-1]["message"]
        added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
        done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
        assert added and [i["id"] for i in done] == added
        assert [i["status"] for i in done] == ["incomplete"] * len(added)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        (closed,) = [e for e in events if e["type"] == "response.output_text.done"]
        assert closed["text"] == text and text  # what was streamed, whole
        assert events[-2]["type"] == "response.output_item.done"
    finally:
        s.server.stop()
        s.group.stop()


def test_engine_death_ends_streams_then_503_with_retry_after_and_clean_stop(model_dir: str) -> None:
    s = start_served(model_dir, workers=1)
    try:
        pids = s.server.group_pids()
        assert len(pids) >= 3  # master, I/O process, worker
        with httpx.stream(
            "POST",
            f"{s.url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 3000, "stream": True},
            timeout=DEADLINE,
        ) as response:
            lines = (line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(next(lines)[6:])["choices"][0]["text"].startswith(" w100")
            s.group.stop()  # both ranks send ENGINE_CORE_DEAD mid-stream
            rest = [line[6:] for line in lines]
        # The stream ends with an error event naming the dead engine, then [DONE].
        assert rest[-1] == "[DONE]"
        error = json.loads(rest[-2])["error"]
        assert "died" in error["message"] and error["type"] == "server_error"
        s.wait(
            "/health to report no live engine",
            lambda: httpx.get(f"{s.url}/health", timeout=5).status_code == 503,
        )
        response = post(s, "/v1/completions", {"prompt": "w5", "max_tokens": 3})
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "no engine" in response.json()["error"]["message"]
        # A clean stop: the master exits 0 on SIGTERM and every process of its session (I/O
        # process, workers, multiprocessing's resource tracker, which leaves when the master's
        # pipe closes) exits by itself, with no SIGKILL from the test, and no /dev/shm file
        # the server's processes had mapped is left. Its own files only: other processes on
        # the machine (another server, another test run) add /dev/shm entries meanwhile. The
        # master's spawn-context queue holds named semaphores, so there are files to watch.
        shm = session_shm(s.server.proc.pid)
        assert shm
        s.server.proc.send_signal(signal.SIGTERM)
        assert s.server.proc.wait(15) == 0
        s.wait(
            "every process of the server's session to exit", lambda: not s.server.group_pids(), 10
        )
        assert shm_left(shm) == set()
    finally:
        s.server.stop()
        s.group.stop()


def test_attach_to_a_running_io_process(model_dir: str) -> None:
    """``--attach``: the server starts no I/O process; the engines belong to ``tsfront io``."""
    import subprocess
    import sys

    io = subprocess.Popen(
        [sys.executable, "-m", "tsfront", "io", "--handshake", "tcp://127.0.0.1:0",
         "--num-engines", "2", "--no-monitor", "--json"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    group = server = None
    try:
        info = json.loads(io.stdout.readline())
        group = SimGroup(info["handshake_address"], 2, token_fn=token_fn).start()
        server = ServeProcess(
            ["--model", model_dir, "--attach", info["address"], "--workers", "1", "--port", "0"]
        )
        url = server.wait_line(r"^listening: (http://\S+)", 60).group(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        out = client.completions.create(model="tiny-words", prompt="w5", max_tokens=4)
        assert out.choices[0].text == expected_text(4)
        assert server.stop() == 0
        assert io.poll() is None  # the I/O process (and its engines) outlive the server
    finally:
        if server is not None:
            server.stop()
        io.terminate()
        io.wait(10)
        if group is not None:
            group.stop()
