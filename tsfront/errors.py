"""The exception hierarchy of tsfront.

Two roots, as in the crate docs: :class:`Error` for anything that goes wrong connecting to the
engines or submitting a request, and :class:`StreamError` (itself an :class:`Error`) for why a
request's output stream ended without a finished output. Every message says what happened and
what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Error(Exception):
    """An error from connecting to the engines or submitting a request."""


class ConfigError(Error, ValueError):
    """A `ClientConfig` (or an address in it) cannot be used as given."""


class MissingExtra(Error):
    """An optional dependency is not installed; the message carries the ``pip install`` line
    (the ``tsfront`` commands exit 2 on it, as on a bad command line)."""

    @classmethod
    def check(cls, what: str, modules: Iterable[str], extra: str) -> None:
        """Raise one naming every module of ``modules`` that does not import, for ``what``
        (e.g. ``"tsfront serve"``) and the ``extra`` that brings them."""
        import importlib

        missing = []
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                missing.append(module)
        if missing:
            from tsfront.install import install_line

            raise cls(f"{what} needs {', '.join(missing)}, not installed: {install_line(extra)}")


class StateDirMismatch(ConfigError):
    """The state directory was written for another engine group (other addresses, first
    index or count), or is not a tsfront state directory; the message names the difference."""


class StateDirInUse(ConfigError):
    """Another running I/O process holds the state directory."""


class WireDecodeError(Error, ValueError):
    """Bytes from a peer are not a valid frame of the TokenSpeed wire.

    Raised by every decoder in :mod:`tsfront.wire`; the I/O process logs it and drops the frame.
    """


class InvalidRequest(Error, ValueError):
    """A request the engine would abort or silently drop, refused before anything is sent.

    Attributes:
        field: dotted name of the offending field, e.g. ``"sampling_params.top_p"``.
        value: the value that was sent.
        rule: the rule it breaks.
        fix: what to send instead.
    """

    def __init__(self, field: str, value: Any, rule: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}={shown}: {rule}; {fix}")


class StopStringsRefused(InvalidRequest):
    """The request carries stop strings; the frontend matches them and sends stop token ids."""


class DuplicateRequest(InvalidRequest):
    """A request with this rid is already in flight (the engine never forgets a rid for 300 s)."""


class RidRecentlyAborted(InvalidRequest):
    """The rid was aborted by this client less than 300 s ago.

    The engine remembers an aborted rid for 300 s and silently drops a request that reuses it
    (its stream would never end), so the reuse is refused; use a fresh rid.
    """


class PromptTooLong(InvalidRequest):
    """The prompt plus `max_new_tokens` does not fit the engine's context."""


class Busy(Error):
    """The local submission queue is full; retry later or shed load."""


class EngineUnavailable(Error):
    """No live engine can take the request (a pin to an absent or dead rank, or none alive)."""


class HandshakeError(Error):
    """The engine group did not complete the HELLO → INIT → READY → registration handshake."""


class HandshakeTimeout(HandshakeError, TimeoutError):
    """Not every expected engine registered within ``handshake_timeout``."""


class ClientClosed(Error):
    """The client was closed, or its I/O process is gone; make a new client."""


class StreamError(Error):
    """Why a request's output stream ended without a finished output.

    Attributes:
        rid: the request id.
        engine_index: the engine that held the request, or ``None`` if it never reached one.
        side: under disaggregated serving, the side that failed: ``"prefill"`` or
            ``"decode"`` (``engine_index`` is an index of that group); else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        rid: str | None = None,
        engine_index: int | None = None,
        side: str | None = None,
    ):
        self.rid = rid
        self.engine_index = engine_index
        self.side = side
        super().__init__(message)


class EngineDied(StreamError):
    """The engine that held the request died: ENGINE_CORE_DEAD, a lost connection or heartbeat."""


class IOProcessDied(StreamError):
    """The I/O process that carried the stream exited; the request's fate is unknown."""


class EngineStalled(StreamError):
    """The engine stopped stepping (connected, but no output for ``stall_timeout``) and the
    request could not be served: it held the request for longer than
    ``ClientConfig.stall_fail_timeout`` after it was marked stalled (the request was aborted
    there and its slot freed), or it was the pinned rank, or every live engine was stalled
    when the request was placed. Retry: the other ranks, or this one once it steps again,
    serve it. ``engine_index`` is the stalled engine's, or ``None`` when every live engine
    was."""


class SendTimeout(StreamError):
    """The engine did not take the request within ``send_timeout``."""


class PrefillFailed(StreamError):
    """Under disaggregated serving, the prefill engine ended the request with ``abort``
    (it refused the request, or the KV transfer to the decode engine failed or timed out).

    The decode half was aborted too; ``side`` is ``"prefill"``. Retry the request.
    """


class DeadlineExceeded(StreamError):
    """The request's deadline (``generate(..., deadline=...)`` or
    ``ClientConfig.request_deadline``) passed before it finished.

    The request was aborted on its engine (or, still queued in the I/O process, never sent)
    and its slot freed; the tokens that arrived before the deadline were delivered first.

    Attributes:
        deadline: the request's deadline in seconds, as it was given.
    """

    def __init__(
        self,
        message: str,
        *,
        rid: str | None = None,
        engine_index: int | None = None,
        deadline: float | None = None,
    ):
        self.deadline = deadline
        super().__init__(message, rid=rid, engine_index=engine_index)


class StreamRejected(StreamError):
    """The I/O process refused the request after submission (e.g. a rid in flight elsewhere)."""
