"""Benchmarks of the text layer: detokenization plus stop matching per streamed token.

One stream of 2000 tokens of mixed-script text (tsfront's test tokenizers, made on the fly)
fed one token at a time, as a worker does at one token per chunk, through a detokenizer and a
:class:`StopMatcher` with two stop strings that never match but whose first characters occur
(so text is held back and released). Goal: ≤ 2 µs per token.

Run the side-by-side table (every algorithm in one run, best of rounds, ratios):
``.venv/bin/python tsfront/bench/micro/bench_text.py``; under pytest-benchmark:
``.venv/bin/python -m pytest tsfront/bench/micro -k text`` (a round is one stream of 2000 tokens, so
µs per token is the round time in ms divided by 2).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tsfront.text import StopMatcher, TextModel
from tsfront.text.testing import make_test_model, mixed_text

TOKENS = 2000
STOPS = ["\n\nUser:", "<|stop|>"]
# (tokenizer, algorithm): every algorithm that applies to each tokenizer.
CASES = [
    (kind, algorithm)
    for kind in ("bytelevel", "metaspace", "unigram")
    for algorithm in ("table", "decode_stream", "offsets")
]
KINDS = ("bytelevel", "metaspace", "unigram")


def stream_chunks(model: TextModel) -> list[list[int]]:
    """TOKENS one-token chunks of mixed-script text, cut on whole characters.

    A cut inside a character split over byte-fallback tokens would make the full decode
    replace the whole run of byte tokens (characters a stream has already sent included), so
    the window starts and ends where the full decode has no replacement character."""
    ids: list[int] = []
    seed = 0
    while len(ids) < 2 * TOKENS:
        ids += model.encode(mixed_text(seed, 200), add_special_tokens=False)
        seed += 1
    for start in range(len(ids) - TOKENS):
        window = ids[start : start + TOKENS]
        if "\ufffd" not in model.decode(window):
            return [[t] for t in window]
    raise AssertionError("no window of whole characters in the benchmark text")


def streamer(model: TextModel, algorithm: str, chunks: list[list[int]], stop: bool) -> Callable:
    """A function that streams every chunk through a fresh detokenizer (and stop matcher)."""

    def run() -> str:
        detok = model.detokenizer(None, True, algorithm=algorithm)
        if not stop:
            step = detok.step
            for chunk in chunks:
                step(chunk)
            return detok.flush()
        matcher = StopMatcher(STOPS)
        step, feed = detok.step, matcher.feed
        for chunk in chunks:
            _, matched = feed(step(chunk))
            if matched:
                raise AssertionError("a benchmark stop string matched")
        return feed(detok.flush())[0] + matcher.flush()

    return run


def load(kind: str, base: Path) -> TextModel:
    return TextModel.load(make_test_model(base / kind, kind))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TextModel]:
    base = tmp_path_factory.mktemp("bench-text")
    return {kind: load(kind, base) for kind in KINDS}


@pytest.mark.parametrize(("kind", "algorithm"), CASES)
def test_detokenize_and_stop_match_per_token(
    benchmark, models: dict[str, TextModel], kind: str, algorithm: str
) -> None:
    model = models[kind]
    chunks = stream_chunks(model)
    benchmark(streamer(model, algorithm, chunks, stop=True))
    # Untimed: the streamed text is the full decode (the stop strings never match).
    detok = model.detokenizer(None, True, algorithm=algorithm)
    text = "".join(detok.step(c) for c in chunks) + detok.flush()
    assert text == model.decode([c[0] for c in chunks])
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["us_per_token"] = benchmark.stats.stats.min / TOKENS * 1e6


def test_stop_matching_alone_per_token(benchmark, models: dict[str, TextModel]) -> None:
    model = models["bytelevel"]
    detok = model.detokenizer()
    deltas = [detok.step(c) for c in stream_chunks(model)]

    def run() -> None:
        feed = StopMatcher(STOPS).feed
        for d in deltas:
            feed(d)

    benchmark(run)
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["us_per_token"] = benchmark.stats.stats.min / TOKENS * 1e6


def best_us_per_token(run: Callable, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / TOKENS * 1e6


def main(rounds: int = 50) -> None:
    """Print every case side by side, interleaved round by round so load affects all alike."""
    with tempfile.TemporaryDirectory() as tmp:
        models = {kind: load(kind, Path(tmp)) for kind in KINDS}
        rows = []
        for kind, algorithm in CASES:
            model = models[kind]
            chunks = stream_chunks(model)
            rows.append(
                (
                    kind,
                    algorithm,
                    streamer(model, algorithm, chunks, stop=False),
                    streamer(model, algorithm, chunks, stop=True),
                )
            )
        detok = models["bytelevel"].detokenizer()
        deltas = [detok.step(c) for c in stream_chunks(models["bytelevel"])]

        def stop_only() -> None:
            feed = StopMatcher(STOPS).feed
            for d in deltas:
                feed(d)

        results: dict[tuple[str, str], list[float]] = {}
        stop_best = float("inf")
        for _ in range(rounds):
            for kind, algorithm, detok_only, with_stop in rows:
                a = best_us_per_token(detok_only, 1)
                b = best_us_per_token(with_stop, 1)
                cur = results.setdefault((kind, algorithm), [float("inf"), float("inf")])
                cur[0], cur[1] = min(cur[0], a), min(cur[1], b)
            stop_best = min(stop_best, best_us_per_token(stop_only, 1))
    print(f"{TOKENS} tokens streamed one per step, best of {rounds} rounds, µs per token")
    print(f"{'tokenizer':<10} {'algorithm':<14} {'detok':>7} {'detok+stop':>11} {'vs DS':>7}")
    for kind in KINDS:
        ref = results[(kind, "decode_stream")][1]
        for (k, algorithm), (a, b) in results.items():
            if k == kind:
                print(f"{k:<10} {algorithm:<14} {a:>7.2f} {b:>11.2f} {b / ref:>6.2f}x")
    print(f"stop matching alone (2 stop strings): {stop_best:.2f} µs per token")


if __name__ == "__main__":
    main()
