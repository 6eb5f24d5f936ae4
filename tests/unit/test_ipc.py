"""The shared protocol (`tsfront.ipc`): its numbers agree with the C, its messages are typed."""

from __future__ import annotations

import types

import msgspec
import pytest

from tsfront import _native
from tsfront.ipc import codes
from tsfront.ipc.control import (
    Attach,
    Attached,
    ControlError,
    EngineEntry,
    Engines,
    EngineUpdate,
    Failed,
    ToIO,
    ToWorker,
    Unframer,
    frame,
)
from tsfront.ipc.submit import (
    TICKET_SERIAL_MASK,
    TICKET_SHIFT,
    next_serial,
    ticket_base,
    ticket_of_attach,
)
from tsfront.wire import EngineRegistration


def test_every_shared_number_is_the_c_extensions() -> None:
    assert codes.mismatches(_native) == []
    for name in codes.SHARED_WITH_NATIVE:
        assert getattr(_native, name) == getattr(codes, name), name
    # The table's row is the C's row size in u32 words.
    assert codes.ENGINE_WORDS * 4 == _native.ENGINE_BYTES


def test_a_drift_in_the_c_fails_at_import() -> None:
    drifted = types.SimpleNamespace(**{n: getattr(_native, n) for n in codes.SHARED_WITH_NATIVE})
    drifted.FIN_DEADLINE = 99
    del drifted.E_STATE
    wrong = codes.mismatches(drifted)
    assert len(wrong) == 2
    assert any(w.startswith("FIN_DEADLINE: 22 here, 99") for w in wrong), wrong
    assert any(w.startswith("E_STATE: 0 here, missing") for w in wrong), wrong
    with pytest.raises(ImportError, match="FIN_DEADLINE"):
        codes.check_native(drifted)


def _roundtrip(message: object, kind: object) -> object:
    buffer = bytearray(frame(message))
    (out,) = Unframer(kind).split(buffer)
    assert not buffer
    return out


def test_control_messages_round_trip_as_maps_keyed_by_op() -> None:
    reg = EngineRegistration(max_model_len=4096, prefix_granularity=64)
    entry = EngineEntry(index=3, rank=1, role="decode", output_address="ipc://@o", registration=reg)
    messages: list[object] = [
        Attached(1, 7, ticket_base(7), (2, 8, 64, 4, 4096), "ipc://@s", {"a": 1}, {"b": [1]}),
        Engines([entry, EngineEntry(index=4, rank=2)]),
        EngineUpdate(entry),
        Failed(kind="timeout", error="engines [1] did not register"),
    ]
    for message in messages:
        assert _roundtrip(message, ToWorker) == message
    assert _roundtrip(Attach(pid=42), ToIO) == Attach(pid=42)
    # On the wire each is a plain map with its "op" (what a peer of another build reads).
    assert msgspec.msgpack.decode(frame(Attach(pid=42))[4:]) == {"op": "attach", "pid": 42}


@pytest.mark.parametrize(
    "raw",
    [
        {"op": "nonsense", "x": 1},  # an unknown op
        {"pid": 1},  # no op
        {"op": "attach", "pid": "one"},  # a field of the wrong type
        [1, 2],  # not a map
    ],
)
def test_a_map_that_is_no_control_message_is_a_control_error(raw: object) -> None:
    with pytest.raises(ControlError):
        Unframer(ToIO).split(bytearray(frame(raw)))


def test_a_message_of_the_other_direction_is_refused() -> None:
    with pytest.raises(ControlError):
        Unframer(ToWorker).split(bytearray(frame(Attach(pid=1))))


def test_partial_frames_wait_for_the_rest() -> None:
    data = frame(Attach(pid=1)) + frame(Attach(pid=2))
    unframer = Unframer(ToIO)
    buffer = bytearray(data[:7])
    assert unframer.split(buffer) == []
    buffer += data[7:]
    assert unframer.split(buffer) == [Attach(pid=1), Attach(pid=2)]


def test_every_attach_has_its_own_ticket_range_off_zero() -> None:
    serial = 0
    seen = set()
    for _ in range(5):
        serial = next_serial(serial)
        seen.add(ticket_base(serial))
        assert ticket_of_attach(ticket_base(serial) + 1, serial)
        assert not ticket_of_attach(ticket_base(serial) + 1, serial + 1)
    assert len(seen) == 5 and 0 not in seen
    # Where the serial wraps modulo 2^24, the range that would start at 0 is skipped.
    assert next_serial(TICKET_SERIAL_MASK) == TICKET_SERIAL_MASK + 2
    assert ticket_base(TICKET_SERIAL_MASK + 2) == 1 << TICKET_SHIFT
