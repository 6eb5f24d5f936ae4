"""The push path's native step (``tsfront._native.token_event``) against the Python path.

For any token table and any token sequence the native step must write exactly what the
Python path writes: the table detokenizer's step (`TableDetokenizer.step`), the text as a
JSON string by msgspec, between the event's head and tail, in the HTTP/1.1 chunk uvicorn
would frame it in (``b"%x\\r\\n" % len(body) + body + b"\\r\\n"``), and leave the stream's
pending bytes (an incomplete character) where the Python step finds them, so the two can take
turns on one stream and `flush` ends it the same. Tables and tokens come from hypothesis,
weighted to what breaks escaping and decoding: quotes, backslashes, every control character,
DEL, U+2028, multi-byte characters split over tokens, invalid and overlong sequences,
encoded surrogates; and the real tables of the test models (ByteLevel, Metaspace, byte
fallback, word level) with random ids.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront import _native
from tsfront.serve.openai.formats import ChatFormat, CompletionFormat
from tsfront.text.detok import TableDetokenizer, TokenTable

_JSON = msgspec.json.Encoder()
# TableDetokenizer's handler for byte-fallback decoders (registered by tsfront.text.detok).
ERROR_HANDLERS = ["replace", "tsfront.bytefallback"]

# Pieces that break things: escapes, control characters, characters of 2, 3 and 4 bytes
# whole and cut, invalid lead and continuation bytes, overlongs, encoded surrogates, > U+10FFFF.
_EURO = "€".encode()
_EMOJI = "😀".encode()
SPECIAL = [
    b'"',
    b"\\",
    b'\\"',
    b"\n",
    b"\r\n",
    b"\t",
    b"\x00",
    b"\x1f",
    b"\x7f",
    b"\x08\x0c",
    "é".encode(),
    "\u2028\u2029".encode(),
    _EURO,
    _EURO[:1],
    _EURO[1:],
    _EURO[:2],
    _EURO[2:],
    _EMOJI[:1],
    _EMOJI[1:3],
    _EMOJI[3:],
    _EMOJI[:3],
    _EMOJI,
    b"\xff",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\x80",
    b"\xc2",
    b" hello",
    b"",
]
PIECE = st.one_of(
    st.sampled_from(SPECIAL), st.binary(max_size=5), st.text(max_size=3).map(str.encode)
)


def _python_chunk(detok: TableDetokenizer, tokens: list[int], head: bytes, tail: bytes) -> bytes:
    text = detok.step(tokens)
    if not text:
        return b""
    body = head + _JSON.encode(text) + tail
    return b"%x\r\n" % len(body) + body + b"\r\n"


def _native_chunk(detok: TableDetokenizer, tokens: list[int], head: bytes, tail: bytes) -> bytes:
    state = detok.native_state()
    assert state is not None
    pieces, decoder, errors = state
    out = _native.token_event(pieces, decoder, tokens, head, tail, errors, True)
    return b"" if out is None else out


def _heads() -> list[tuple[bytes, bytes]]:
    completion = CompletionFormat("m", None, 1, False)
    chat = ChatFormat('the "model" \\ é', None, 1, True)
    return [(completion.head(0), completion.tail), (chat.head(3), chat.tail), (b"", b"")]


HEADS = _heads()


def _run(table: TokenTable, steps: list[list[int]], turns: list[bool], shape: int) -> None:
    head, tail = HEADS[shape]
    python = TableDetokenizer(table)
    native = TableDetokenizer(table)
    for tokens, native_turn in zip(steps, turns, strict=False):
        want = _python_chunk(python, tokens, head, tail)
        # The native stream takes some steps with its own Python step (one shared state), and
        # all of them while the first-token rules apply (no native state: as `Pusher` does).
        if native_turn and native.native_state() is not None:
            got = _native_chunk(native, tokens, head, tail)
        else:
            got = _python_chunk(native, tokens, head, tail)
        assert got == want, (tokens, got, want)
        mine, theirs = python.native_state(), native.native_state()
        assert (mine is None) == (theirs is None)
        if mine is not None and theirs is not None:
            assert mine[1].getstate() == theirs[1].getstate()  # the same pending bytes
    assert native.flush() == python.flush()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(PIECE, min_size=1, max_size=24),
    data=st.data(),
    errors=st.sampled_from(ERROR_HANDLERS),
    shape=st.integers(0, len(HEADS) - 1),
)
def test_native_event_bytes_equal_the_python_paths(pieces, data, errors, shape) -> None:
    n = len(pieces)
    ids = st.integers(-2, n + 1)  # ids past either end have no token
    steps = data.draw(st.lists(st.lists(ids, min_size=1, max_size=6), min_size=1, max_size=30))
    turns = data.draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps)))
    table = TokenTable(pieces, None, frozenset(), False, False, errors)
    _run(table, steps, turns, shape)


def test_a_long_piece_and_many_tokens_take_the_gathered_path() -> None:
    # Past the C's stack buffer (512 bytes): the gathered bytes live on the heap.
    pieces = [("é" * 300).encode(), _EMOJI[:2], _EMOJI[2:], b'"\\\n' * 100]
    table = TokenTable(pieces, None, frozenset(), False, False, "replace")
    _run(table, [[0, 1], [2, 0, 3, 3], [1], [1, 2] * 50, [3] * 7], [True] * 5, 0)


def test_a_pending_character_from_the_python_step_is_completed_natively() -> None:
    table = TokenTable([_EMOJI[:1], _EMOJI[1:], b"x"], None, frozenset(), False, False, "replace")
    detok = TableDetokenizer(table)
    assert detok.step([0]) == ""  # held: an incomplete character
    head, tail = HEADS[0]
    assert _native_chunk(detok, [1, 2], head, tail).endswith(
        b'"\xf0\x9f\x98\x80x"' + tail + b"\r\n"
    )
    assert detok.flush() == ""


def test_no_text_is_none_and_leaves_the_character_pending() -> None:
    table = TokenTable([_EURO[:1], _EURO[1:2]], None, frozenset(), False, False, "replace")
    detok = TableDetokenizer(table)
    pieces, decoder, errors = detok.native_state()
    assert _native.token_event(pieces, decoder, [0, 1], b"H", b"T", errors, True) is None
    assert decoder.getstate()[0] == _EURO[:2]
    assert detok.flush() == "\ufffd"  # as a full decode of the cut character shows it


def test_unframed_is_the_event_alone() -> None:
    table = TokenTable([b'a"b'], None, frozenset(), False, False, "replace")
    pieces, decoder, errors = TableDetokenizer(table).native_state()
    assert _native.token_event(pieces, decoder, [0], b"H", b"T", errors, False) == b'H"a\\"b"T'


def test_bad_arguments_are_type_errors() -> None:
    table = TokenTable([b"a"], None, frozenset(), False, False, "replace")
    pieces, decoder, errors = TableDetokenizer(table).native_state()
    with pytest.raises(TypeError):
        _native.token_event(pieces, decoder, (0,), b"H", b"T", errors, True)
    with pytest.raises(TypeError):
        _native.token_event([b"a", "not bytes"], decoder, [1], b"H", b"T", errors, True)
    with pytest.raises(TypeError):
        _native.token_event(pieces, decoder, [0], b"H", b"T", errors)  # type: ignore[call-arg]


@pytest.fixture(scope="module", params=["bytelevel", "metaspace", "unigram", "wordlevel"])
def real_table(request, tmp_path_factory) -> TokenTable:
    from tokenizers import Tokenizer

    from tsfront.text.detok import token_tables
    from tsfront.text.testing import make_test_model

    path = make_test_model(tmp_path_factory.mktemp(request.param) / "m", request.param)
    tables = token_tables(Tokenizer.from_file(str(path / "tokenizer.json")))
    if tables is None:
        pytest.skip(f"{request.param}: not a table detokenizer's decoder")
    return tables[True]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_real_tables_give_the_same_bytes(real_table: TokenTable, data) -> None:
    n = len(real_table.pieces)
    # Byte tokens (the low ids of ByteLevel and byte fallback) often, so characters split.
    ids = st.one_of(st.integers(0, min(n, 300)), st.integers(0, n + 2))
    steps = data.draw(st.lists(st.lists(ids, min_size=1, max_size=4), min_size=1, max_size=40))
    turns = data.draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps)))
    _run(real_table, steps, turns, data.draw(st.integers(0, len(HEADS) - 1)))
