"""``tsfront serve`` as a real process group for the serve tests: the library's rig.

`ServeProcess` and `serve_children` are `tsfront.testing.serve`'s (the pytest plugin's
``tsfront_serve`` fixture is built on them): the command in its own session, its stdout lines
waited for with a deadline, SIGTERM then SIGKILL of whatever is left of the session.

`session_shm` and `shm_left` tell the server's own /dev/shm entries from the machine's: other
processes (other test runs, other servers) make and remove entries there all the time.

`post_stream` and `read_chunked` are a raw HTTP/1.1 client for the tests that need what a
library client hides: a small receive window (a slow reader), a client that stops reading.

`serving` is `start_served` as a context: the server and its ranks stopped at the end, the
server's exit status 0. `start_scripted` is the rig of the tests whose one simulated rank
answers by a script (a marker in the prompt -> a model's text): `ScriptedServe` is that server
with the model it serves, the request each HTTP request became at the rank
(`ScriptedServe.engine_request`) and the prompt it rendered (`ScriptedServe.prompt_of`).
`start_together` starts several servers at once (their interpreters and model loads overlap).
`CHAT_TEMPLATE` is their Qwen-style chat template, with tool calls as Hermes writes them, and
`ONE_CALL`, `LONG_CALL` and `THOUGHT` what their scripts have the model write;
`sse_events` reads a streamed answer's named events off the wire; `weather_agent` is an
openai-agents agent with one Python tool, served by a test's server.

`Front` is any HTTP server in front of simulated ranks (``tsfront serve``, or another server
hosting tsfront's app): what reached the ranks, what ``/health`` says is in flight, waits with
a deadline, and the clients that leave (mid-stream, before the first token, many at once).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx

from support.tool_outputs import hermes
from tsfront.sim import SimGroup
from tsfront.sim.script import Script
from tsfront.testing.serve import (
    Served,
    ServeProcess,
    serve_children,
    session_pids,
    start_served,
)
from tsfront.text import TextModel

__all__ = [
    "CHAT_TEMPLATE",
    "CHAT_TEMPLATE_TURNS",
    "LONG_ARGS",
    "LONG_CALL",
    "ONE_CALL",
    "THOUGHT",
    "Front",
    "ScriptedServe",
    "ServeProcess",
    "Served",
    "dechunk",
    "engine_request",
    "post_stream",
    "read_chunked",
    "serve_children",
    "serving",
    "session_shm",
    "shm_left",
    "sse_events",
    "start_scripted",
    "start_served",
    "start_together",
    "weather_agent",
]

#: The turns of the scripted tests' chat template (Qwen's shape): the tools as JSON, each turn's
#: reasoning in ``<think>``, its calls as Hermes writes them, a tool result with its call's id;
#: up to the generation prompt's opening, whose end (``{% endif %}``) a test may extend. A script
#: rule that matches only a correctly rendered prompt proves the rendering.
CHAT_TEMPLATE_TURNS = """\
{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>
{% endif %}
{%- if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments | tojson }}}</tool_call>{% endfor %}
{%- if message.role == "tool" %} (result of {{ message.tool_call_id }}){% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
"""
#: `CHAT_TEMPLATE_TURNS` with the generation prompt closed.
CHAT_TEMPLATE = CHAT_TEMPLATE_TURNS + "{% endif %}"
#: A Hermes call of ``get_weather`` for Paris, as a scripted model writes it.
ONE_CALL = hermes([("get_weather", {"city": "Paris"})])
#: A call whose arguments are long: 120 words in one string (to see arguments stream).
LONG_ARGS = " ".join(f"w{i}" for i in range(120))
LONG_CALL = hermes([("get_weather", {"city": LONG_ARGS})])
#: A Qwen3 thought, then the answer.
THOUGHT = "<think>\nThe user wants 2 + 2.\n</think>\n\nFour."


@contextmanager
def serving(model: str | os.PathLike[str], **options: Any) -> Iterator[Served]:
    """`start_served` of ``model`` with ``options``; at the end, the server stopped (it must
    exit with status 0) and its ranks."""
    s = start_served(model, **options)
    try:
        yield s
    finally:
        code, _ = s.close()
    assert code == 0


def engine_request(group: SimGroup, request_id: str) -> Any:
    """The ADD the ranks of ``group`` got for the HTTP request ``request_id`` (its engine rid
    ends with ``-<x-request-id>``); exactly one."""
    found = [r for e in group.engines for r in e.requests() if r.rid.endswith(f"-{request_id}")]
    assert len(found) == 1, [r.rid for e in group.engines for r in e.requests()]
    return found[0]


def weather_agent(url: str, model: str, calls: list[str], *, responses: bool = False) -> Any:
    """An openai-agents `Agent` whose model is ``model`` at ``url`` (its Chat Completions, or
    with ``responses`` its Responses API), with one Python tool: ``get_weather``, which records
    the city it is asked for in ``calls`` and answers ``22 C and sunny in <city>``."""
    import agents  # openai-agents (the test extra): only the tests of an agent import it
    from openai import AsyncOpenAI

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"22 C and sunny in {city}"

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    kind = agents.OpenAIResponsesModel if responses else agents.OpenAIChatCompletionsModel
    return agents.Agent(
        name="weather",
        instructions="Answer with the tools.",
        tools=[get_weather],
        model=kind(model=model, openai_client=client),
    )


class ScriptedServe:
    """``tsfront serve`` (`Served`) against one simulated rank that answers by a script, and the
    model it serves (to read what reached the rank)."""

    def __init__(self, served: Served, model: TextModel) -> None:
        self.served = served
        self.server, self.group, self.url = served.server, served.group, served.url
        self.model = model

    @classmethod
    def start(
        cls,
        folder: Path,
        script: Script,
        *,
        workers: int = 1,
        args: Sequence[str] = (),
        stderr: Path | None = None,
        **sim_options: Any,
    ) -> Self:
        """`start_scripted`, as this class (a test's subclass adds its clients in __init__)."""
        model = TextModel.load(folder)
        return cls(start_scripted(folder, model, script, workers, args, stderr, sim_options), model)

    def engine_request(self, request_id: str) -> Any:
        """The ADD the rank got for the HTTP request ``request_id`` (`engine_request`)."""
        return engine_request(self.group, request_id)

    def prompt_of(self, request_id: str) -> str:
        """The prompt the rank got for the HTTP request ``request_id``, as text."""
        ids = self.engine_request(request_id).input_ids
        return self.model.decode(ids, skip_special_tokens=False)

    def close(self) -> None:
        """Stop the server (it must exit with status 0), then its rank."""
        code, _ = self.served.close()
        assert code == 0


def start_scripted(
    folder: Path,
    model: TextModel,
    script: Script,
    workers: int = 1,
    args: Sequence[str] = (),
    stderr: Path | None = None,
    sim_options: dict[str, Any] | None = None,
) -> Served:
    """``tsfront serve`` of ``folder`` (``model``) with ``workers`` workers and ``args``, against
    one rank answering by ``script``: the model's vocabulary and EOS, output in chunks of 1 to
    4 tokens a step every 0.5 ms unless ``sim_options`` (`EngineOptions` fields) say otherwise."""
    options = {
        "vocab_size": model.tokenizer.get_vocab_size(with_added_tokens=True),
        "eos_token_id": model.eos_token_ids[0],
        "chunk_tokens": 4,
        "step_ms": 0.5,
        **(sim_options or {}),
    }
    return start_served(
        folder,
        workers=workers,
        ranks=1,
        args=args,
        stderr=stderr,
        timeout=90,  # a loaded 2-core machine starting several servers at once
        script=script,
        **options,
    )


T = TypeVar("T")


@contextmanager
def start_together(
    starts: dict[str, Callable[[], T]], close: Callable[[T], None]
) -> Iterator[dict[str, T]]:
    """Each of ``starts`` called on its own thread (the servers' interpreters and model loads
    overlap); the started ones by name, each ``close``d at the end, also when one failed."""
    started: dict[str, T] = {}
    errors: list[BaseException] = []

    def start(name: str) -> None:
        try:
            started[name] = starts[name]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(name,)) for name in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield started
    finally:
        for s in started.values():
            close(s)


def sse_events(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout: float
) -> list[tuple[str, dict[str, Any]]]:
    """``POST url`` of ``body`` answered 200 with named server-sent events: each ``(event,
    data)``, the data parsed, read to the end of the body."""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200, response.read()
        lines = [line for line in response.iter_lines() if line]
    pairs = []
    for event, data in zip(lines[::2], lines[1::2], strict=True):
        assert event.startswith("event: ") and data.startswith("data: "), (event, data)
        pairs.append((event[7:], json.loads(data[6:])))
    return pairs


def session_shm(session: int) -> set[int]:
    """Inodes of the /dev/shm files the live processes of ``session`` have mapped.

    By inode, not by name: a mapping shows the name the file had when it was mapped (glibc's
    ``sem_open`` maps a temporary ``sem.XXXXXX`` and then links it as ``sem.mp-...``)."""
    inodes = set()
    for pid in session_pids(session):
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.readlines()
        except OSError:
            continue  # exited meanwhile
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                inodes.add(int(fields[4]))
    return inodes


def shm_left(inodes: set[int]) -> set[str]:
    """The /dev/shm entries that are still there among the files ``inodes`` name."""
    with os.scandir("/dev/shm") as entries:
        return {e.name for e in entries if e.inode() in inodes}


def post_stream(url: str, body: dict, *, rcvbuf: int, timeout: float) -> socket.socket:
    """A connection whose receive buffer is ``rcvbuf`` bytes, with ``POST /v1/completions``
    of ``body`` sent on it (the response is left unread)."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


def read_chunked(sock: socket.socket, *, read: int, within: float) -> tuple[bytes, bytes]:
    """Read ``read`` bytes at a time until the chunked body's end, then close the socket:
    ``(head, body)`` with the body de-chunked. Fails if it has not ended ``within`` seconds."""
    data = bytearray()
    deadline = time.monotonic() + within
    while not data.endswith(b"0\r\n\r\n"):
        assert time.monotonic() < deadline, "the response never ended"
        chunk = sock.recv(read)
        assert chunk, "the server closed the connection early"
        data += chunk
    sock.close()
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    return head, dechunk(rest)


def dechunk(raw: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data (up to its last chunk)."""
    out = bytearray()
    while raw:
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += raw[:n]
        raw = raw[n + 2 :]
    return bytes(out)


class Front:
    """An HTTP server at ``url`` in front of the simulated ranks ``group`` (two, in-process),
    whose every output token ``p`` is ``first + p`` (the word-level test model reads it
    ``w<first + p>``)."""

    def __init__(self, url: str, group: SimGroup, *, first: int, deadline: float) -> None:
        self.url = url
        self.group = group
        self.first = first
        self.deadline = deadline

    def aborts(self) -> int:
        return sum(c["aborts"] for c in self.group.counters().values())

    def adds(self) -> int:
        return sum(c["adds"] for c in self.group.counters().values())

    def in_flight(self) -> int:
        body = httpx.get(f"{self.url}/health", timeout=5).json()
        return sum(e["in_flight"] for e in body["engines"])

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.deadline if timeout is None else timeout)
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.01)

    def leave_mid_stream(self) -> None:
        """A streamed completion whose client closes its connection after the first event:
        its ABORT reaches an engine and nothing stays in flight."""
        before = self.aborts()
        with httpx.stream(
            "POST",
            f"{self.url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 3000, "stream": True},
            timeout=self.deadline,
        ) as response:
            assert response.status_code == 200
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["text"].startswith(f" w{self.first}")
        # The connection is closed here, mid-stream.
        self.wait("the disconnect's ABORT at the engine", lambda: self.aborts() > before)
        self.wait("no request in flight", lambda: self.in_flight() == 0)

    def leave_before_first_token(self) -> None:
        """With the ranks frozen, a streamed completion whose client closes its connection
        while the request waits for its first output (nothing is being sent that could fail:
        only the server's word of the lost connection can end it): it leaves the in-flight
        count at once, and its ABORT reaches an engine once the ranks step again."""
        before = self.aborts()
        host, port = self.url.removeprefix("http://").rsplit(":", 1)
        body = json.dumps({"prompt": "w5", "max_tokens": 50, "stream": True}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        engines = [self.group.engine(r) for r in range(2)]
        for engine in engines:
            engine.stall()
        try:
            sock = socket.create_connection((host, int(port)), timeout=self.deadline)
            sock.sendall(head + body)
            self.wait("the request in flight", lambda: self.in_flight() == 1)
            sock.close()
            self.wait("the disconnect to free it, the ranks frozen", lambda: self.in_flight() == 0)
        finally:
            for engine in engines:
                engine.resume()
        self.wait("the disconnect's ABORT at the engine", lambda: self.aborts() > before)

    def leave_together(self, n: int) -> None:
        """``n`` streamed completions, each on its own connection, all past their first event,
        whose clients then close their connections at once: every one's ABORT reaches an
        engine, nothing stays in flight, and the server answers the next request."""
        before = self.aborts()
        body = {"prompt": "w5", "max_tokens": 3000, "stream": True}
        socks = [
            post_stream(self.url, body, rcvbuf=1 << 16, timeout=self.deadline) for _ in range(n)
        ]
        try:
            for sock in socks:
                seen = b""
                while b"data: " not in seen:
                    chunk = sock.recv(65536)
                    assert chunk, "the server closed a stream before its first event"
                    seen += chunk
            self.wait(f"{n} requests in flight", lambda: self.in_flight() >= n)
        finally:
            for sock in socks:
                sock.close()
        self.wait(f"{n} ABORTs at the engines", lambda: self.aborts() >= before + n)
        self.wait("no request in flight", lambda: self.in_flight() == 0)
        answer = httpx.post(
            f"{self.url}/v1/completions",
            json={"prompt": "w5", "max_tokens": 2},
            timeout=self.deadline,
        )
        assert answer.status_code == 200, answer.text
