"""tsfront.wire.zmtp: the sans-I/O ZMTP 3.x accepting side of a PULL.

Pinned here: the helpers' bytes against literal bytes written from the spec (RFC 23 ZMTP 3.0,
RFC 37 ZMTP 3.1); a valid PUSH's byte stream gives the same messages, replies and state however
it is cut into reads (one piece, every single split point, random chunkings); every lying or
broken peer gets ``error`` saying what was wrong and nothing more is read from it (an oversized
message fails from its header alone); heartbeats exist only for a 3.1 peer; and arbitrary bytes
after a handshake never make ``feed`` raise.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tsfront.wire.zmtp import (
    GREETING,
    READY,
    PullSession,
    RouterSession,
    command,
    frame,
    greeting,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
MAX_MESSAGE = 4096


def prop(name: bytes, value: bytes) -> bytes:
    """A READY property written from the spec: name-length, name, 4-byte size, value."""
    return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value


def ready(*props: tuple[bytes, bytes]) -> bytes:
    return command(b"READY", b"".join(prop(n, v) for n, v in props))


PUSH_READY = ready((b"Socket-Type", b"PUSH"), (b"Identity", b"engine-7"))
HANDSHAKE = greeting(3, 1) + PUSH_READY
TTL = (20).to_bytes(2, "big")  # 2.0 s in deciseconds

# A valid PUSH after its handshake: (bytes, first frames delivered, contexts PONGed back).
TRAFFIC: list[tuple[bytes, list[bytes], list[bytes]]] = [
    (frame(b"a"), [b"a"], []),
    (frame(b""), [b""], []),
    (frame(b"s" * 255), [b"s" * 255], []),  # the largest short frame
    (frame(b"L" * 256), [b"L" * 256], []),  # the smallest long frame
    (frame(b"l" * 1000), [b"l" * 1000], []),
    (command(b"PING", TTL + b"ctx-1"), [], [b"ctx-1"]),
    (frame(b"head", MORE) + frame(b"m" * 300, MORE) + frame(b"tail"), [b"head"], []),
    (command(b"PONG", b"their-ctx"), [], []),
    (command(b"X-FUTURE", b"whatever a later version says"), [], []),
    (command(b"PING", TTL), [], [b""]),
    (frame(b"M" * 400, MORE) + frame(b"rest"), [b"M" * 400], []),
    (command(b"PING", (0).to_bytes(2, "big") + b"0123456789abcdef"), [], [b"0123456789abcdef"]),
    (frame(b"last"), [b"last"], []),
]
STREAM = HANDSHAKE + b"".join(t[0] for t in TRAFFIC)
EXPECTED_MESSAGES = [m for t in TRAFFIC for m in t[1]]
EXPECTED_OUT = GREETING + READY + b"".join(command(b"PONG", c) for t in TRAFFIC for c in t[2])


def fed(chunks: Iterable[bytes], max_message: int = MAX_MESSAGE) -> PullSession:
    s = PullSession(max_message)
    for chunk in chunks:
        s.feed(chunk)
    return s


def handshaken(max_message: int = MAX_MESSAGE) -> PullSession:
    s = fed([HANDSHAKE], max_message)
    assert s.ready and s.error is None
    return s


def assert_valid_stream_result(s: PullSession) -> None:
    assert s.error is None
    assert s.ready is True
    assert list(s.messages) == EXPECTED_MESSAGES
    assert bytes(s.out) == EXPECTED_OUT


# ------------------------------------------------------------------ the bytes, from the spec


def test_the_greeting_is_the_spec_s_64_bytes():
    literal = (
        b"\xff"  # signature: 0xFF
        + b"\x00\x00\x00\x00\x00\x00\x00\x00"  # 8 padding bytes
        + b"\x7f"  # signature end
        + b"\x03\x01"  # version 3.1
        + b"NULL\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"  # mechanism
        + b"\x00"  # as-server: false
        + b"\x00" * 31  # filler
    )
    assert len(literal) == 64
    assert greeting(3, 1, b"NULL") == literal
    assert greeting() == literal
    assert literal == GREETING
    assert greeting(3, 0)[10:12] == b"\x03\x00"
    assert greeting(mechanism=b"CURVE")[12:32] == b"CURVE" + bytes(15)


def test_a_short_frame_is_flags_then_one_size_byte():
    assert frame(b"hi") == b"\x00\x02hi"
    assert frame(b"hi", MORE) == b"\x01\x02hi"
    assert frame(b"") == b"\x00\x00"
    assert frame(b"s" * 255) == b"\x00\xff" + b"s" * 255


def test_a_long_frame_sets_the_long_flag_and_an_8_byte_big_endian_size():
    assert frame(b"L" * 256) == b"\x02\x00\x00\x00\x00\x00\x00\x01\x00" + b"L" * 256
    assert frame(b"L" * 70000, MORE) == b"\x03\x00\x00\x00\x00\x00\x01\x11\x70" + b"L" * 70000


def test_a_command_is_a_command_flagged_frame_of_name_length_name_and_data():
    assert command(b"PING", b"\x00\x14ab") == b"\x04\x09\x04PING\x00\x14ab"
    assert command(b"PONG") == b"\x04\x05\x04PONG"


def test_our_ready_is_a_null_mechanism_ready_of_a_pull():
    literal = b"\x04\x1a\x05READY\x0bSocket-Type\x00\x00\x00\x04PULL"
    assert literal == READY
    assert ready((b"Socket-Type", b"PULL")) == literal


def test_the_peer_stream_built_by_hand_equals_the_one_built_by_the_helpers():
    by_hand = (
        b"\xff"  # signature, 8 padding bytes, signature end
        + bytes(8)
        + b"\x7f\x03\x01"  # ... and version 3.1
        + b"NULL"  # mechanism, padded to 20 bytes
        + bytes(16)
        + b"\x00"  # as-server: false
        + bytes(31)  # filler
        # READY: Socket-Type PUSH, Identity engine-7 (6 + 20 + 21 = 47 = 0x2f bytes)
        + b"\x04\x2f\x05READY"
        + b"\x0bSocket-Type\x00\x00\x00\x04PUSH"
        + b"\x08Identity\x00\x00\x00\x08engine-7"
        + b"\x00\x01a"  # a one-frame message
        + b"\x01\x04head\x00\x04tail"  # two frames: MORE, then the last
        + b"\x02\x00\x00\x00\x00\x00\x00\x01\x2c"
        + b"x" * 300  # a long frame
        + b"\x04\x0a\x04PING\x00\x14ctx"  # PING, TTL 2.0 s, context "ctx"
    )
    helpers = (
        HANDSHAKE
        + frame(b"a")
        + frame(b"head", MORE)
        + frame(b"tail")
        + frame(b"x" * 300)
        + command(b"PING", TTL + b"ctx")
    )
    assert by_hand == helpers
    s = fed([by_hand])
    assert s.error is None and s.ready
    assert list(s.messages) == [b"a", b"head", b"x" * 300]
    assert s.peer_properties == {b"Socket-Type": b"PUSH", b"Identity": b"engine-7"}
    assert bytes(s.out) == GREETING + READY + b"\x04\x08\x04PONGctx"


# ------------------------------------------------------------------ a valid peer, however cut


def test_a_new_session_says_only_its_greeting():
    s = PullSession(MAX_MESSAGE)
    assert bytes(s.out) == GREETING
    assert not s.ready and s.error is None and not s.messages


def test_our_ready_goes_out_only_once_the_peer_s_whole_greeting_arrived():
    s = PullSession(MAX_MESSAGE)
    s.feed(greeting()[:63])
    assert bytes(s.out) == GREETING and s.error is None
    s.feed(greeting()[63:])
    assert bytes(s.out) == GREETING + READY
    assert not s.ready
    s.feed(PUSH_READY[:-1])
    assert not s.ready
    s.feed(PUSH_READY[-1:])
    assert s.ready and s.error is None


def test_a_stream_in_one_piece_gives_every_message_and_a_pong_per_ping():
    s = fed([STREAM])
    assert_valid_stream_result(s)
    assert s.heartbeats is True
    assert s.peer_properties == {b"Socket-Type": b"PUSH", b"Identity": b"engine-7"}


def test_a_stream_split_at_every_point_gives_the_same_messages():
    for i in range(len(STREAM) + 1):
        s = fed([STREAM[:i], STREAM[i:]])
        assert s.error is None, i
        assert list(s.messages) == EXPECTED_MESSAGES, i
        assert bytes(s.out) == EXPECTED_OUT, i
        assert s.ready is True, i


@FAST
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_a_stream_read_into_one_reused_buffer_keeps_nothing_of_it(cuts):
    """As the output port reads: every piece lands in the same buffer, handed over as a
    memoryview and overwritten before the next; the messages must be the session's copies."""
    points = [0, *sorted(cuts), len(STREAM)]
    buffer = bytearray(len(STREAM))
    view = memoryview(buffer)
    s = PullSession(MAX_MESSAGE)
    for a, b in pairwise(points):
        n = b - a
        view[:n] = STREAM[a:b]
        s.feed(view[:n])
        view[:] = b"\xee" * len(buffer)  # the next read overwrites it
    assert_valid_stream_result(s)
    assert all(type(m) is bytes for m in s.messages)


def test_a_stream_fed_one_byte_at_a_time_gives_the_same_messages():
    assert_valid_stream_result(fed(STREAM[i : i + 1] for i in range(len(STREAM))))


@FAST
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_a_stream_in_any_chunking_gives_the_same_messages(cuts):
    points = [0, *sorted(cuts), len(STREAM)]
    assert_valid_stream_result(fed(STREAM[a:b] for a, b in pairwise(points)))


def test_a_message_of_exactly_max_message_bytes_is_delivered():
    s = handshaken(1000)
    s.feed(frame(b"x" * 1000) + frame(b"a" * 600, MORE) + frame(b"b" * 400))
    assert s.error is None
    assert list(s.messages) == [b"x" * 1000, b"a" * 600]


def test_the_size_budget_starts_afresh_with_each_message():
    s = handshaken(1000)
    for i in range(5):
        s.feed(frame(b"%d" % i + b"a" * 599, MORE) + frame(b"b" * 400))
    s.feed(frame(b"x" * 1000))
    assert s.error is None
    assert list(s.messages) == [b"%d" % i + b"a" * 599 for i in range(5)] + [b"x" * 1000]


def test_a_command_of_exactly_65536_bytes_is_accepted():
    big = command(b"X-BIG", bytes(65536 - 6))
    assert big[:9] == b"\x06" + (65536).to_bytes(8, "big")
    s = handshaken()
    s.feed(big + frame(b"after"))
    assert s.error is None
    assert list(s.messages) == [b"after"]


def test_a_long_frame_header_for_a_small_body_is_accepted():
    s = handshaken()
    s.feed(b"\x02" + (3).to_bytes(8, "big") + b"abc")
    assert s.error is None
    assert list(s.messages) == [b"abc"]


# ------------------------------------------------------------------ lying and broken peers


def long_header(flags: int, size: int) -> bytes:
    return bytes([flags | LONG]) + size.to_bytes(8, "big")


AFTER = frame(b"after-1") + command(b"PING", TTL + b"late") + frame(b"after-2")
"""Valid bytes a broken peer sends next: none of them may be read."""

BROKEN: list[tuple[str, bytes, str, bool]] = [
    # (case id, everything the peer sent, words the error must hold, ready after it)
    ("http", b"GET / HTTP/1.1\r\n\r\n", "not a ZMTP", False),
    ("zmtp-2", greeting(2, 0), "ZMTP 2.0 peer", False),
    ("zmtp-1-signature", b"\xff" + bytes(8) + b"\x00" + bytes(54), "not a ZMTP", False),
    ("plain", greeting(mechanism=b"PLAIN"), "b'PLAIN'", False),
    ("curve", greeting(mechanism=b"CURVE"), "b'CURVE'", False),
    ("message-before-ready", greeting() + frame(b"early"), "a message before the READY", False),
    ("other-command-first", greeting() + command(b"PING", TTL), "expected READY", False),
    ("pull", greeting() + ready((b"Socket-Type", b"PULL")), "socket type b'PULL'", False),
    ("dealer", greeting() + ready((b"Socket-Type", b"DEALER")), "socket type b'DEALER'", False),
    ("no-socket-type", greeting() + ready((b"Identity", b"x")), "socket type None", False),
    ("lower-case-push", greeting() + ready((b"Socket-Type", b"push")), "b'push'", False),
    (
        "value-past-the-end",
        greeting() + command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x09PUSH"),
        "malformed READY properties",
        False,
    ),
    (
        "size-field-cut-short",
        greeting() + command(b"READY", prop(b"Socket-Type", b"PUSH") + b"\x08Identity\x00\x00"),
        "malformed READY properties",
        False,
    ),
    (
        "name-past-the-end",
        greeting() + command(b"READY", prop(b"Socket-Type", b"PUSH") + b"\x20Identity"),
        "malformed READY properties",
        False,
    ),
    (
        "error-instead-of-ready",
        greeting() + command(b"ERROR", b"\x0dno such thing"),
        "refused the handshake: no such thing",
        False,
    ),
    ("reserved-0x08", HANDSHAKE + b"\x08\x01x", "reserved flag bits set (0x08)", True),
    ("reserved-0x80", HANDSHAKE + b"\x80\x01x", "reserved flag bits set (0x80)", True),
    ("reserved-0x10-more", HANDSHAKE + b"\x11\x01x", "reserved flag bits set (0x11)", True),
    ("reserved-before-ready", greeting() + b"\x08\x01x", "reserved flag bits set (0x08)", False),
    (
        "huge-long-frame",
        HANDSHAKE + long_header(0, 2**62),
        f"a message larger than {MAX_MESSAGE} bytes",
        True,
    ),
    (
        "huge-frame-with-more",
        HANDSHAKE + long_header(MORE, 2**64 - 1),
        f"a message larger than {MAX_MESSAGE} bytes",
        True,
    ),
    (
        "parts-over-the-limit",
        HANDSHAKE + frame(b"a" * 3000, MORE) + frame(b"b" * 1000, MORE) + frame(b"c" * 97),
        f"a message larger than {MAX_MESSAGE} bytes",
        True,
    ),
    (
        "one-byte-over-the-limit",
        HANDSHAKE + frame(b"x" * (MAX_MESSAGE + 1)),
        f"a message larger than {MAX_MESSAGE} bytes",
        True,
    ),
    (
        "huge-command",
        HANDSHAKE + long_header(COMMAND, 65537),
        "a command larger than 65536 bytes",
        True,
    ),
    (
        "huge-ready",
        greeting() + long_header(COMMAND, 2**40),
        "a command larger than 65536 bytes",
        False,
    ),
    ("ping-without-ttl", HANDSHAKE + command(b"PING", b"\x00"), "malformed PING", True),
    ("ping-empty", HANDSHAKE + command(b"PING"), "malformed PING", True),
    ("ping-context-17", HANDSHAKE + command(b"PING", TTL + bytes(17)), "malformed PING", True),
    (
        "error-command",
        HANDSHAKE + command(b"ERROR", b"\x0cshutting off"),
        "the peer sent ERROR: shutting off",
        True,
    ),
    ("error-without-reason", HANDSHAKE + command(b"ERROR"), "ERROR: (no reason)", True),
    ("name-past-the-frame", HANDSHAKE + b"\x04\x05\x09PING", "malformed command frame", True),
    ("empty-command-frame", HANDSHAKE + b"\x04\x00", "malformed command frame", True),
]


@pytest.mark.parametrize(
    ("sent", "words", "is_ready"),
    [pytest.param(sent, words, is_ready, id=name) for name, sent, words, is_ready in BROKEN],
)
def test_a_broken_peer_gets_an_error_saying_why_and_nothing_more_is_read(sent, words, is_ready):
    s = fed([sent])
    assert s.error is not None
    assert words in s.error
    assert s.ready is is_ready
    out, messages = bytes(s.out), list(s.messages)
    assert messages == []
    # Valid frames after the breach, in the same read or later ones, change nothing.
    for more in (AFTER, HANDSHAKE + AFTER, AFTER[:5], AFTER[5:]):
        s.feed(more)
    assert bytes(s.out) == out
    assert list(s.messages) == messages
    assert s.error is not None and words in s.error
    assert s.ready is is_ready
    # The same bytes with the valid frames in the same read: the same verdict, nothing more.
    t = fed([sent + AFTER])
    assert (t.error, t.ready, bytes(t.out), list(t.messages)) == (s.error, is_ready, out, [])


@pytest.mark.parametrize(
    "sent",
    [pytest.param(sent, id=name) for name, sent, _, _ in BROKEN],
)
def test_a_broken_peer_gets_the_same_error_however_its_bytes_are_cut(sent):
    whole = fed([sent])
    bytewise = fed(sent[i : i + 1] for i in range(len(sent)))
    assert bytewise.error == whole.error
    assert bytewise.ready is whole.ready
    assert bytes(bytewise.out) == bytes(whole.out)
    assert list(bytewise.messages) == list(whole.messages)


def test_our_ready_is_not_sent_to_a_peer_whose_greeting_is_refused():
    for sent in (b"GET / HTTP/1.1\r\n\r\n", greeting(2, 0), greeting(mechanism=b"PLAIN")):
        assert bytes(fed([sent]).out) == GREETING


def test_an_http_request_is_refused_once_its_first_ten_bytes_arrive():
    s = PullSession(MAX_MESSAGE)
    s.feed(b"GET / HTT")
    assert s.error is None
    s.feed(b"P/1.1\r\n\r\n")
    assert s.error is not None and "not a ZMTP" in s.error


def test_messages_delivered_before_a_breach_stay_and_none_after_it_are_added():
    s = handshaken()
    s.feed(frame(b"one") + frame(b"two") + b"\x80\x01x" + frame(b"three"))
    assert s.error is not None and "reserved flag bits" in s.error
    assert list(s.messages) == [b"one", b"two"]


def test_a_huge_long_frame_fails_from_its_header_alone():
    s = handshaken()
    header = long_header(0, 2**62)
    for b in header[:-1]:
        s.feed(bytes([b]))
        assert s.error is None  # not even the whole 9-byte header yet
    s.feed(header[-1:])  # no body byte sent
    assert s.error == f"a message larger than {MAX_MESSAGE} bytes"
    assert not s.messages


def test_a_multipart_message_fails_at_the_frame_that_takes_it_over_the_limit():
    s = handshaken(1000)
    s.feed(frame(b"a" * 600, MORE))
    assert s.error is None
    s.feed(frame(b"b" * 400, MORE))  # exactly at the limit: still fine
    assert s.error is None
    s.feed(b"\x00\x01")  # one more byte's header: over it, before the byte arrives
    assert s.error == "a message larger than 1000 bytes"
    assert not s.messages


def test_a_command_frame_whose_name_runs_past_it_is_refused_during_the_handshake_too():
    s = fed([greeting() + b"\x04\x05\x09READY" + frame(b"x")])
    assert s.error is not None
    assert not s.ready
    assert not s.messages


# ------------------------------------------------------------------ versions and heartbeats


def test_a_zmtp_3_0_peer_completes_the_handshake_without_heartbeats():
    s = fed([greeting(3, 0) + PUSH_READY + frame(b"hello")])
    assert s.error is None and s.ready
    assert s.heartbeats is False
    assert list(s.messages) == [b"hello"]
    before = bytes(s.out)
    assert before == GREETING + READY
    s.ping(2.0)
    assert bytes(s.out) == before


def test_a_zmtp_3_1_peer_is_pinged_with_the_ttl_in_deciseconds():
    s = handshaken()
    assert s.heartbeats is True
    before = bytes(s.out)
    s.ping(2.0)
    assert bytes(s.out) == before + command(b"PING", (20).to_bytes(2, "big"))
    assert bytes(s.out)[len(before) :] == b"\x04\x07\x04PING\x00\x14"


def test_a_ping_ttl_is_clamped_to_two_bytes():
    s = handshaken()
    before = bytes(s.out)
    s.ping(1e9)
    s.ping(-5.0)
    assert bytes(s.out) == before + command(b"PING", b"\xff\xff") + command(b"PING", b"\x00\x00")


def test_no_ping_is_queued_before_the_peer_is_ready():
    s = PullSession(MAX_MESSAGE)
    s.ping(2.0)
    assert bytes(s.out) == GREETING
    s.feed(greeting())
    s.ping(2.0)
    assert bytes(s.out) == GREETING + READY
    assert not s.ready


def test_no_ping_is_queued_to_a_refused_peer():
    s = fed([greeting() + ready((b"Socket-Type", b"PULL"))])
    s.ping(2.0)
    assert bytes(s.out) == GREETING + READY


# ------------------------------------------------------------------ anything at all


@FAST
@given(st.binary(max_size=600), st.integers(min_value=0, max_value=600))
def test_arbitrary_bytes_after_a_handshake_never_raise(junk, cut):
    s = handshaken(256)
    s.feed(junk[:cut])
    s.feed(junk[cut:])
    assert s.error is not None or all(type(m) is bytes for m in s.messages)
    assert all(len(m) <= 256 for m in s.messages)
    if s.error is not None:
        frozen = (bytes(s.out), list(s.messages))
        s.feed(AFTER)
        assert (bytes(s.out), list(s.messages)) == frozen


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_bytes_from_the_start_never_raise(junk):
    s = fed([junk])
    assert s.error is not None or all(type(m) is bytes for m in s.messages)
    assert bytes(s.out).startswith(GREETING)


@pytest.mark.parametrize("size", [200, 255, 256, 5000])
def test_a_message_over_a_small_limit_is_refused_whole_and_in_pieces(size):
    """A whole message read straight from what arrived (the one-copy path, taken once the
    handshake is done and nothing is held) keeps the limit as the frame-by-frame path does,
    short frames included."""
    message = frame(b"x" * size)
    for cut in (len(message), len(message) - size // 2, 1):
        s = PullSession(100)
        s.feed(HANDSHAKE)
        assert s.ready
        s.feed(message[:cut])
        s.feed(message[cut:])
        assert s.error == "a message larger than 100 bytes"
        assert not s.messages


# ------------------------------------------------------------------ the ROUTER side


DEALER_READY = ready((b"Socket-Type", b"DEALER"), (b"Identity", b"\x01\x00"))
ROUTER_STREAM = (
    greeting(3, 1)
    + DEALER_READY
    + frame(b"registration")
    + command(b"PING", TTL + b"c")
    + frame(b"a", MORE)
    + frame(b"b" * 300, MORE)
    + frame(b"")
)


def test_our_router_ready_names_a_router_and_no_identity():
    assert RouterSession(MAX_MESSAGE).our_ready == ready((b"Socket-Type", b"ROUTER"))


@pytest.mark.parametrize("cut", range(len(ROUTER_STREAM) + 1))
def test_a_dealer_stream_cut_anywhere_gives_its_identity_and_every_frame_of_each_message(cut):
    s = RouterSession(MAX_MESSAGE)
    s.feed(ROUTER_STREAM[:cut])
    s.feed(ROUTER_STREAM[cut:])
    assert s.error is None and s.ready and s.identity == b"\x01\x00"
    assert list(s.messages) == [[b"registration"], [b"a", b"b" * 300, b""]]
    assert bytes(s.out) == GREETING + ready((b"Socket-Type", b"ROUTER")) + command(b"PONG", b"c")


def test_a_dealer_without_an_identity_is_ready_with_an_empty_one():
    s = RouterSession(MAX_MESSAGE)
    s.feed(greeting(3, 1) + ready((b"Socket-Type", b"DEALER")))
    assert s.ready and s.identity == b""


@pytest.mark.parametrize(
    ("kind", "identity", "words"),
    [
        (b"PUSH", b"x", "only a DEALER"),
        (b"ROUTER", b"x", "only a DEALER"),
        (b"DEALER", b"i" * 256, "identity longer than 255"),
    ],
)
def test_a_router_session_refuses_other_socket_types_and_long_identities(kind, identity, words):
    s = RouterSession(MAX_MESSAGE)
    s.feed(greeting(3, 1) + ready((b"Socket-Type", kind), (b"Identity", identity)) + frame(b"m"))
    assert s.error is not None and words in s.error
    assert not s.ready and not s.messages


@pytest.mark.parametrize("size", [0, 1, 254, 255, 256, 70_000])
def test_a_message_sent_is_two_frames_read_back_by_a_session_as_sent(size):
    s = RouterSession(1 << 20)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    s.send(b"\x01", payload)
    s.send(b"K" * 300, memoryview(payload))
    sent = bytes(s.out[len(GREETING) :])
    # Read back by a session of our own as a DEALER would see it (a PULL keeps first frames).
    assert sent.startswith(frame(b"\x01", MORE))
    back = RouterSession(1 << 20)
    back.feed(greeting(3, 1) + DEALER_READY + sent)
    assert back.error is None
    assert list(back.messages) == [[b"\x01", payload], [b"K" * 300, payload]]


@pytest.mark.parametrize("kind", [PullSession, RouterSession])
def test_a_peer_that_pings_and_never_reads_cannot_grow_what_we_hold(kind):
    s = kind(MAX_MESSAGE)
    peer = b"PUSH" if kind is PullSession else b"DEALER"
    s.feed(greeting(3, 1) + ready((b"Socket-Type", peer)))
    assert s.ready
    s.feed(command(b"PING", TTL + b"x" * 16) * 100_000)  # 2.2 MB of PINGs, nothing read back
    assert s.error is None
    assert len(s.out) < (1 << 16) + 64
