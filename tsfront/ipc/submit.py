"""The submit socket's frames (worker DEALER → I/O ROUTER) and the tickets they carry.

A submission is ``[identity, kind, header + rid, payload (, block hashes)]`` for an ADD
(`SUBMIT_ADD`) or ``[identity, SUBMIT_ABORT, abort entries]``. The identity is the worker's
number and the serial of its attach (`WORKER_IDENTITY`); a request's ticket comes from that
attach's own range (`ticket_base`), so no ticket of a departed worker can match a request of
the next worker given the same number (a stale backlog entry or abort is matched by slot and
ticket).
"""

from __future__ import annotations

import struct
from typing import Final

#: Submission header: local slot, ticket, pinned rank (-1: none), logprobs flag, the request's
#: deadline (CLOCK_MONOTONIC seconds, which every process of the machine shares; 0: none), and
#: under disaggregated serving the byte offset of the payload's nil bootstrap fields (0: none).
#: The rid follows it.
SUBMIT_HEADER: Final = struct.Struct("<IQiBdI")
#: One aborted request of an ABORT submission: local slot, ticket.
ABORT_ENTRY: Final = struct.Struct("<IQ")
SUBMIT_ADD: Final = b"A"
SUBMIT_ABORT: Final = b"X"
#: A worker's submit-socket identity: its number and the serial of its attach.
WORKER_IDENTITY: Final = struct.Struct("<IQ")

#: Each attach draws its tickets from ``(serial mod 2^24) << 40`` + 1..2^40-1.
TICKET_SHIFT: Final = 40
TICKET_SERIAL_MASK: Final = (1 << 24) - 1


def ticket_base(serial: int) -> int:
    """The first ticket (minus one) of the attach with this serial."""
    return (serial & TICKET_SERIAL_MASK) << TICKET_SHIFT


def ticket_of_attach(ticket: int, serial: int) -> bool:
    """Whether ``ticket`` lies in the range of the attach with this serial."""
    return ticket >> TICKET_SHIFT == serial & TICKET_SERIAL_MASK


def next_serial(serial: int) -> int:
    """The serial of the attach after ``serial``: never one whose ticket range starts at 0
    (ticket 0 means "no ticket")."""
    serial += 1
    if serial & TICKET_SERIAL_MASK == 0:
        serial += 1
    return serial


__all__ = [
    "ABORT_ENTRY",
    "SUBMIT_ABORT",
    "SUBMIT_ADD",
    "SUBMIT_HEADER",
    "TICKET_SERIAL_MASK",
    "TICKET_SHIFT",
    "WORKER_IDENTITY",
    "next_serial",
    "ticket_base",
    "ticket_of_attach",
]
