"""The canonical JSON writer of streamed arguments (`tsfront.text.tools.jsontext.JsonCanon`).

For any JSON object, written by ``json.dumps`` with any spacing and escaping and split into
deltas at random points, the pieces it writes join to exactly ``canonical_arguments`` of the
object (compact, non-ASCII kept, lone surrogates as escapes), and it stops just after the
object's end. For arbitrary text (JSON's characters in any order), what it writes does not
depend on the split, and whatever it accepts is the JSON ``json.loads`` reads; what it refuses
is refused at the character where that became certain.
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tsfront.text.tools.base import canonical_arguments
from tsfront.text.tools.jsontext import (
    DONE,
    ERROR,
    MAX_DEPTH,
    JsonCanon,
    close_object,
    escape_text,
    value_text,
)


def run(text: str, cuts: list[int], top: str = "{") -> tuple[int, str, int | None]:
    """(state, what was written, where it stopped in ``text``) for ``text`` split at
    ``cuts``."""
    canon = JsonCanon(top)
    points = sorted({c % (len(text) + 1) for c in cuts})
    out: list[str] = []
    for a, b in pairwise([0, *points, len(text)]):
        stop = canon.feed(text[a:b], 0)
        out += canon.out
        canon.out.clear()
        if canon.state in (DONE, ERROR):
            return canon.state, "".join(out), a + stop
    canon.finish()
    out += canon.out
    return canon.state, "".join(out), None


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=5), JSON, max_size=5),
    ascii=st.booleans(),
    indent=st.sampled_from([None, 1, "\t", "  "]),
    cuts=st.lists(st.integers(0, 2000), max_size=30),
)
def test_any_object_is_written_canonically_for_any_split(
    value: dict[str, Any], ascii: bool, indent: Any, cuts: list[int]
) -> None:
    text = json.dumps(value, ensure_ascii=ascii, indent=indent)
    state, out, end = run(text + ' trailing "text"', cuts)
    assert state == DONE
    assert out == canonical_arguments(value)
    assert end == len(text)


ALPHABET = '{}[]",:0123456789.eE+-tfnrulas \\\n/u\ud800\udc00é'


@settings(max_examples=1000, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=50), cuts=st.lists(st.integers(0, 60), max_size=10))
def test_any_text_is_read_the_same_whatever_the_split(text: str, cuts: list[int]) -> None:
    state, out, end = run(text, cuts)
    assert (state, out, end) == run(text, [])
    if state == DONE:
        assert end is not None
        assert json.loads(out) == json.loads(text[:end])


CANONICAL = [
    ('{"k": "\\ud800"}', '{"k":"\\ud800"}'),  # a lone surrogate stays its escape
    ('{"k":"\\uDFFF"}', '{"k":"\\udfff"}'),
    ('{"k": "\\ud83d\\ude00"}', '{"k":"😀"}'),  # a pair is the character
    ('{"k": "\\ud83dx\\ud83d\\n"}', '{"k":"\\ud83dx\\ud83d\\n"}'),
    ('{"k": "\\u00e9\\u0000\\/\\b"}', '{"k":"é\\u0000/\\b"}'),
    ('{"a": -0, "b": 1.50, "c": 1E+2, "d": 0.0000001, "e": 10000000000000000000000}',
     '{"a":0,"b":1.5,"c":100.0,"d":1e-07,"e":10000000000000000000000}'),
    ("{ \n}", "{}"),
    ('{"a": [true, false, null, [], {}]}', '{"a":[true,false,null,[],{}]}'),
    ('{"a": 1, "a": 2}', '{"a":1,"a":2}'),  # duplicate keys as written
]  # fmt: skip


@pytest.mark.parametrize(("text", "written"), CANONICAL)
def test_canonical_text(text: str, written: str) -> None:
    for pieces in ([], list(range(len(text)))):
        assert run(text, pieces) == (DONE, written, len(text))


REFUSED = [
    ('{"a": NaN}', '{"a":'),
    ('{"a": Infinity}', '{"a":'),
    ('{"a": 1e999}', '{"a":'),
    ('{"a": ' + "9" * 5000 + "}", '{"a":'),
    ('{"a": 01}', '{"a":'),
    ('{"a": "x\ny"}', '{"a":"x'),  # a raw control character
    ('{"a": "\\x"}', '{"a":"'),
    ("{'a': 1}", "{"),
    ('{"a": 1,}', '{"a":1,'),
    ("[1]", ""),  # arguments are an object
    ('{"a": tru}', '{"a":'),
    ("{" + '"a":[' * MAX_DEPTH + "]" * MAX_DEPTH + "}", None),
]


@pytest.mark.parametrize(("text", "written"), REFUSED)
def test_refused_where_it_becomes_certain(text: str, written: str | None) -> None:
    state, out, end = run(text, [])
    assert state == ERROR
    if written is not None:
        assert out == written
    assert run(text, list(range(len(text)))) == (state, out, end)


def test_a_number_at_the_very_end_completes_a_value() -> None:
    assert run("-12.5e3", [], top="") == (DONE, "-12500.0", None)
    assert run("-12.5e", [], top="")[0] == ERROR


def test_escape_text_and_value_text_match_json_dumps() -> None:
    text = 'a "b" \\ \n\t\x01 é 😀 \ud800'
    assert escape_text(text) == json.dumps(text, ensure_ascii=False)[1:-1].replace(
        "\ud800", "\\ud800"
    )
    assert value_text({"k": [1, 2.5, None, "é"]}) == '{"k":[1,2.5,null,"é"]}'
    assert value_text(float("nan")) is None


@settings(max_examples=500, deadline=None)
@given(value=st.dictionaries(st.text(max_size=5), JSON, max_size=5), data=st.data())
def test_an_object_cut_anywhere_closes_where_it_was_cut(value: dict[str, Any], data: Any) -> None:
    # A call the model broke is sent back in the history as it went out: the beginning of an
    # object's JSON text, cut anywhere. It reads back as an object, whose canonical text
    # starts as the cut text's (what was cut inside, a number or a key, is dropped).
    text = json.dumps(value, ensure_ascii=data.draw(st.booleans()))
    cut = data.draw(st.integers(1, len(text)))
    closed = close_object(text[:cut])
    assert isinstance(closed, dict)
    if cut == len(text):
        assert closed == value
    canon = run(text[:cut], [])[1]  # what the cut text was written as
    written = canonical_arguments(closed)
    assert written is not None
    # The closed object is what had been written, less its closers (and the quote that
    # closes a string cut inside).
    head = written.rstrip("}]")
    assert canon.startswith(head) or canon.startswith(head[:-1])


def test_text_that_breaks_where_it_stands_does_not_close() -> None:
    for text in ("{city: Paris", '{"x": NaN}', "[1]", '{"a": 1} more', "", "x"):
        assert close_object(text) is None
    assert close_object('{"city": "Par') == {"city": "Par"}
    assert close_object('{"a": [1, {"b": "x\\\\"') == {"a": [1, {"b": "x\\"}]}
