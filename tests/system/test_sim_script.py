"""Scripted simulator output: a marker in the prompt makes a rank emit given text's tokens.

Through the real I/O process and an ``EngineClient`` (the rig of core_fixtures): a prompt
with the marker streams exactly the scripted text's token ids (a tool-call tag as one added
token, or split over several) and then EOS; any other prompt gets the usual tokens;
``max_new_tokens`` still cuts a scripted answer. The ``tsfront sim`` command takes the script
from a file, and refuses one it cannot use.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import test_sim
from support.core_fixtures import DEADLINE, collect, request, rig
from test_sim import Frontend, rows

from tsfront.sim import Scheduler, SchedulerConfig, default_token
from tsfront.sim.script import Script, ScriptError, load_rules
from tsfront.text import TextModel
from tsfront.text.testing import make_test_model
from tsfront.text.tools import make_tool_parser
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINK = "<think>\nSimple.\n</think>\n\nFour."


@pytest.fixture(scope="module", params=["added", "split"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp(f"script-{request.param}")
    added = ["<tool_call>", "</tool_call>"] if request.param == "added" else []
    return make_test_model(base / "model", "bytelevel", added_tokens=added)


def test_scheduler_takes_a_pure_script_function() -> None:
    script = {(1, 2, 3): [10, 11, 12]}
    sched = Scheduler(SchedulerConfig(eos_token_id=2), script=lambda ids: script.get(tuple(ids)))
    for rid, prompt in (("s", [1, 2, 3]), ("d", [4, 5])):
        sp = SamplingParams(max_new_tokens=10)
        sched.add(TokenizedGenerateReqInput(rid=rid, input_ids=prompt, sampling_params=sp))
    out: dict[str, list[int]] = {"s": [], "d": []}
    reasons: dict[str, str] = {}
    while sched.busy:
        step = sched.step()
        for row in step.rows if step else []:
            out[row.rid] += row.output_ids
            if row.finished_reason:
                reasons[row.rid] = row.finished_reason
    assert out["s"] == [10, 11, 12, 2] and reasons["s"] == "stop"
    assert out["d"] == [default_token("d", i) for i in range(10)] and reasons["d"] == "length"


async def test_a_matching_prompt_streams_exactly_the_scripted_tokens(model_dir: Path) -> None:
    model = TextModel.load(model_dir)
    script = Script([("weather in Paris", CALL), ("Think", THINK)], model_dir)
    eos = model.eos_token_ids[0]
    vocab = model.tokenizer.get_vocab_size(with_added_tokens=True)
    call_ids = model.encode(CALL, add_special_tokens=False)
    if "<tool_call>" in model.tokenizer.get_vocab():
        assert len(model.encode("<tool_call>", add_special_tokens=False)) == 1
    else:
        assert len(model.encode("<tool_call>", add_special_tokens=False)) > 1
    prompt = model.encode("What is the weather in Paris?", add_special_tokens=False)
    other = model.encode("Tell me a story.", add_special_tokens=False)
    async with rig(1, script=script, vocab_size=vocab, eos_token_id=eos) as r:
        stream = await r.client.generate(request("call", 200, prompt=prompt))
        tokens, chunks = await collect(stream, DEADLINE)
        assert tokens == [*call_ids, eos]
        assert chunks[-1].finish_reason == "stop"
        text = model.decode(tokens)
        assert text == CALL
        (call,) = make_tool_parser("hermes").parse(text).calls
        assert (call.name, call.arguments) == ("get_weather", '{"city":"Paris"}')

        stream = await r.client.generate(request("plain", 7, prompt=other))
        tokens, chunks = await collect(stream, DEADLINE)
        assert tokens == [default_token("plain", i, vocab) for i in range(7)]
        assert chunks[-1].finish_reason == "length"

        stream = await r.client.generate(request("cut", 3, prompt=prompt))
        tokens, chunks = await collect(stream, DEADLINE)
        assert tokens == call_ids[:3] and chunks[-1].finish_reason == "length"


def test_script_pickles_without_its_tokenizer(model_dir: Path) -> None:
    script = Script([("", THINK)], model_dir)
    script([1, 2])
    clone = pickle.loads(pickle.dumps(script))
    assert clone.rules == script.rules and clone([5]) == script([5])


def test_bad_script_files_are_refused_saying_why(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for text, why in (
        ("{not json", "cannot read it as JSON"),
        ('{"match": "x"}', "expected a JSON list"),
        ('[{"match": "x"}]', "rule 0 must be"),
    ):
        bad.write_text(text)
        with pytest.raises(ScriptError, match=why):
            load_rules(bad)


def _sim(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tsfront", "sim", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_cli_script_needs_a_model(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("[]")
    proc = _sim("--handshake", "tcp://127.0.0.1:9", "--script", str(tmp_path / "s.json"))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--script needs --model" in err


def test_cli_sim_answers_from_the_script_file(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A spawned interpreter loading a tokenizer on a busy machine: a generous deadline.
    monkeypatch.setattr(test_sim, "DEADLINE_S", 60.0)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps([{"match": "weather", "output": CALL}]))
    model = TextModel.load(model_dir)
    fe = Frontend()
    proc = _sim(
        "--handshake", fe.handshake_address, "--model", str(model_dir),
        "--script", str(script_file), "--step-ms", "1",
    )  # fmt: skip
    try:
        fe.accept(1)
        prompt = model.encode("weather?", add_special_tokens=False)
        fe.add(0, TokenizedGenerateReqInput(
            rid="c1", input_ids=prompt, sampling_params=SamplingParams(max_new_tokens=100),
            stream=True,
        ))  # fmt: skip
        got = rows(fe.collect({"c1"}), "c1")
        tokens = [t for r in got for t in r["ids"]]
        assert tokens == [*model.encode(CALL, add_special_tokens=False), model.eos_token_ids[0]]
        assert got[-1]["reason"] == "stop"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        fe.close()


def test_chunk_tokens_splits_a_stream_into_random_chunks_of_at_most_n() -> None:
    from tsfront.sim.scheduler import SCRIPT_ABORT, grammar_rejection

    sched = Scheduler(SchedulerConfig(eos_token_id=2, chunk_tokens=4))
    for rid in ("a", "b"):
        sp = SamplingParams(max_new_tokens=60)
        sched.add(
            TokenizedGenerateReqInput(rid=rid, input_ids=[5], sampling_params=sp, stream=True)
        )
    sizes: dict[str, list[int]] = {"a": [], "b": []}
    while sched.busy:
        step = sched.step()
        for row in step.rows if step else []:
            sizes[row.rid].append(len(row.output_ids))
    for got in sizes.values():
        assert sum(got) == 60 and max(got) <= 4 and len(set(got)) > 1
    assert sizes["a"] != sizes["b"]
    # A scripted -1 ends the request there with an abort (no token for it).
    sched = Scheduler(SchedulerConfig(eos_token_id=2), script=lambda ids: [7, 8, SCRIPT_ABORT])
    sched.add(TokenizedGenerateReqInput(rid="x", input_ids=[1], sampling_params=SamplingParams()))
    rows_out = []
    while sched.busy:
        step = sched.step()
        rows_out += step.rows if step else []
    assert [t for r in rows_out for t in r.output_ids] == [7, 8]
    assert rows_out[-1].finished_reason == "abort"
    # The grammar compile stand-in.
    assert grammar_rejection(SamplingParams(regex="(")) is not None
    assert grammar_rejection(SamplingParams(json_schema="[1]")) is not None
    assert grammar_rejection(SamplingParams(json_schema='{"type": "object"}')) is None
