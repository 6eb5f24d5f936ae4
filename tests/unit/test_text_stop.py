"""The stop-string matcher: streamed answers equal the answer computed on the whole text.

Property tests split a text at arbitrary points into deltas and compare what the matcher emits
with a reference that looks at the whole string at once (the stop string complete first wins;
among those ending at the same offset the longest). About 2 s.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsfront.text import StopMatcher, StopSet, TextError

# A small alphabet so that stop strings occur, overlap and share prefixes often; multi-code-
# unit characters included to catch any byte/char confusion.
ALPHABET = "ab\n é😀"
texts = st.text(alphabet=ALPHABET, max_size=60)
stops = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4)


def reference(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """What the whole text yields: the emitted text and the matched stop string."""
    best: tuple[int, int, str] | None = None
    for s in stop:
        i = text.find(s)
        if i >= 0:
            key = (i + len(s), -len(s), s)
            if best is None or key < best:
                best = key
    if best is None:
        return text, None
    end, neg_len, s = best
    return text[: end if include else end + neg_len], s


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def run(matcher: StopMatcher, deltas: list[str]) -> tuple[list[str], bool]:
    emitted: list[str] = []
    matched = False
    for d in deltas:
        out, matched = matcher.feed(d)
        emitted.append(out)
        if matched:
            break
    if not matched:
        emitted.append(matcher.flush())
    return emitted, matched


@settings(max_examples=600, deadline=None)
@given(texts, stops, st.lists(st.integers(min_value=0), max_size=20), st.booleans())
def test_streamed_output_equals_the_whole_text_answer(
    text: str, stop: list[str], cuts: list[int], include: bool
) -> None:
    matcher = StopMatcher(stop, include_stop_str_in_output=include)
    emitted, matched = run(matcher, split(text, cuts))
    want, want_stop = reference(text, stop, include)
    assert "".join(emitted) == want
    assert matcher.matched == want_stop
    assert matched == (want_stop is not None)


@settings(max_examples=600, deadline=None)
@given(texts, stops, st.lists(st.integers(min_value=0), max_size=20))
def test_no_emitted_prefix_ever_contains_a_stop_string(
    text: str, stop: list[str], cuts: list[int]
) -> None:
    """Without include_stop_str_in_output a client never sees any stop string, in any delta
    or across deltas; nothing held back is longer than the longest stop string less one."""
    matcher = StopMatcher(stop)
    longest = max(len(s) for s in stop)
    shown = ""
    for d in split(text, cuts):
        out, matched = matcher.feed(d)
        shown += out
        assert not any(s in shown for s in stop)
        assert len(matcher.pending) < longest
        if matched:
            break
    else:
        shown += matcher.flush()
        assert not any(s in shown for s in stop)


@settings(max_examples=300, deadline=None)
@given(texts, stops, st.booleans())
def test_one_character_at_a_time_matches_the_moment_the_stop_string_is_complete(
    text: str, stop: list[str], include: bool
) -> None:
    """The caller learns of the match on the very delta that completes the stop string, so
    it aborts the engine request without waiting for more tokens."""
    matcher = StopMatcher(stop, include_stop_str_in_output=include)
    _, want_stop = reference(text, stop, include)
    for n, ch in enumerate(text, 1):
        _, matched = matcher.feed(ch)
        complete = any(s in text[:n] for s in stop)
        assert matched == complete
        if matched:
            break
    assert matcher.matched == want_stop


def test_after_a_match_every_feed_is_empty_and_matched() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abc ST") == ("abc ", False)
    assert matcher.feed("OP and more") == ("", True)
    assert matcher.matched == "STOP"
    assert matcher.feed("later") == ("", True)
    assert matcher.flush() == ""


def test_include_stop_str_in_output_emits_the_stop_string_and_no_more() -> None:
    matcher = StopMatcher(["</answer>"], include_stop_str_in_output=True)
    assert matcher.feed("42</ans") == ("42", False)
    assert matcher.feed("wer> trailing") == ("</answer>", True)


def test_the_stop_string_complete_first_wins_over_an_earlier_longer_one() -> None:
    matcher = StopMatcher(["abcd", "c"])
    assert matcher.feed("abc") == ("ab", True)
    assert matcher.matched == "c"


def test_of_two_ending_together_the_longer_wins() -> None:
    matcher = StopMatcher(["b", "ab"])
    assert matcher.feed("xab") == ("x", True)
    assert matcher.matched == "ab"


def test_a_held_prefix_that_turns_out_not_to_be_a_stop_string_is_emitted() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("line\n") == ("line", False)
    assert matcher.feed("next") == ("\nnext", False)
    assert matcher.flush() == ""
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("end\n") == ("end", False)
    assert matcher.flush() == "\n"


def test_no_stop_strings_pass_text_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert matcher.flush() == ""


def test_bad_stop_strings_are_refused_with_a_typed_error() -> None:
    with pytest.raises(TextError, match="empty"):
        StopMatcher(["ok", ""])
    with pytest.raises(TextError, match="must be str"):
        StopMatcher([3])  # type: ignore[list-item]


def test_a_single_string_is_one_stop_string() -> None:
    matcher = StopMatcher("ab")  # type: ignore[arg-type]
    assert matcher.stops == ("ab",)


def test_feed_scans_only_new_text() -> None:
    """A long stream fed a character at a time holds back at most len(longest) - 1
    characters, so each feed works on a bounded buffer whatever came before."""
    matcher = StopMatcher(["<|stop|>", "\n\nUser:"])
    for _ in range(20000):
        matcher.feed("<|sto")
        assert len(matcher.pending) <= 6
        matcher.feed("p?\n\nUser")
        assert len(matcher.pending) <= 6
    assert matcher.matched is None


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace", "unigram"])
def test_detokenized_stream_stops_where_the_full_text_does(
    tmp_path_factory: pytest.TempPathFactory, kind: str
) -> None:
    """Detokenizer and matcher together, as a worker runs them: stop strings of several
    scripts, split across tokens (and across the bytes of a character), end the stream at the
    same place as in the full decode, and the matching chunk is the one that completes them."""
    from support.text_fixtures import mixed_text, model_dir

    from tsfront.text import TextModel

    model = TextModel.load(model_dir(tmp_path_factory.getbasetemp() / "stop-models", kind))
    ids = model.encode(mixed_text(11, 400), add_special_tokens=False)
    full = model.decode(ids)
    for stop in ([full[300:303]], [full[500:502], "\n\n"], ["🦜-never", full[-40:-37]]):
        want, matched_stop = reference(full, stop, include=False)
        assert matched_stop is not None
        detok, matcher = model.detokenizer(), StopMatcher(stop)
        shown, matched, used = "", False, 0
        for t in ids:
            used += 1
            text, matched = matcher.feed(detok.step([t]))
            shown += text
            if matched:
                break
        assert matched and shown == want
        # The chunk that matched is the first whose decoded text holds the stop string.
        assert matched_stop in model.decode(ids[:used])
        assert matched_stop not in model.decode(ids[: used - 1]).rstrip("\ufffd")


# ---------------------------------------------------------------------- the compiled set

long_stops = st.lists(st.text(alphabet="ab", min_size=1, max_size=12), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="abc", max_size=80),
    long_stops,
    st.lists(st.lists(st.integers(min_value=0), max_size=30), min_size=1, max_size=4),
    st.booleans(),
)
def test_one_stop_set_shared_by_many_choices_matches_each_as_the_whole_text(
    text: str, stop: list[str], splits: list[list[int]], include: bool
) -> None:
    """One `StopSet` serves every choice of a request: each matcher, fed its own split of
    the text (interleaved with the others), ends where the whole-text reference does. A
    two-letter alphabet and long, overlapping stop strings exercise the failure links."""
    stop_set = StopSet(stop)
    matchers = [stop_set.matcher(include) for _ in splits]
    deltas = [split(text, cuts) for cuts in splits]
    shown = ["" for _ in splits]
    done = [False for _ in splits]
    for step in range(max(len(d) for d in deltas)):
        for k, m in enumerate(matchers):
            if done[k] or step >= len(deltas[k]):
                continue
            out, matched = m.feed(deltas[k][step])
            shown[k] += out
            done[k] = matched
    want, want_stop = reference(text, stop, include)
    for k, m in enumerate(matchers):
        if not done[k]:
            shown[k] += m.flush()
        assert shown[k] == want
        assert m.matched == want_stop


def test_long_stop_strings_cost_memory_linear_in_their_length() -> None:
    """Four stop strings of 5,000 characters: the old matcher kept every proper prefix of
    each (4 x 12.5 M characters, ~50 MB, quadratic); the automaton has one node per
    character. Fed the longest prefix that never completes, one character at a time, the
    matcher holds it back and releases it when it breaks."""
    import tracemalloc

    stops = [str(k) + ("ab" * 2500)[:4998] + "z" for k in range(4)]
    tracemalloc.start()
    try:
        matcher = StopMatcher(stops)
        text = stops[0][:-1]
        shown = "".join(matcher.feed(c)[0] for c in text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shown == "" and matcher.pending == text  # all of it could still become a stop
    assert peak < 16_000_000, f"{peak / 1e6:.1f} MB"
    out, matched = matcher.feed("!")
    assert (out, matched) == (text + "!", False) and matcher.pending == ""


def test_a_stream_longer_than_the_stop_strings_keeps_nothing_already_released() -> None:
    matcher = StopMatcher(["abcabd"])
    out = "".join(matcher.feed(c)[0] for c in "abcabcabcab")
    assert out == "abcabc" and matcher.pending == "abcab"
    assert matcher.feed("d") == ("", True)  # "abcabc" + the stop string
