"""The serve master's supervision of its workers: replace the dead, kill the silent, give up late.

`RestartPolicy` is the budget and the backoff, pure (the time is given): at most
``max_restarts`` replacements in any ``window`` seconds, the first at once, the next ones after
0.25, 0.5, 1, 2 ... seconds (at most `MAX_DELAY_S`). `Supervisor` keeps one `Place` per
worker and moves it through `TRANSITIONS`:

========== ========= ===========  =====================================================
state      event     next         what the master does
========== ========= ===========  =====================================================
starting   ready     serving      the worker attached and listens
starting   late      killed       no ``ready`` in the start timeout: SIGKILL
starting   exited    waiting      a death (the budget is asked for a delay)
serving    silent    killed       no heartbeat for ``--worker-timeout``: SIGKILL
serving    exited    waiting      a death
killed     exited    waiting      a death
waiting    due       starting     the backoff passed: a replacement is spawned
========== ========= ===========  =====================================================

A death past the budget raises `RestartsExhausted` (the server stops, exit 1). The heartbeat
is a word of `ServeCounters` the worker's loop stores the time in; the master only reads it.
A replacement serves on its place's listening socket, which the master kept (connections
queued on it meanwhile are not lost), and attaches to the same I/O process, which
gave the dead worker's place back when its control socket closed (and aborted its engine
requests then), so there is always a place for it.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tsfront.errors import Error

__all__ = [
    "TRANSITIONS",
    "Place",
    "RestartPolicy",
    "RestartsExhausted",
    "Supervisor",
]

#: Longest wait before a replacement.
MAX_DELAY_S = 5.0
#: Backoff of the second replacement in a window (doubling after).
BASE_DELAY_S = 0.25

#: (state, event) -> next state; anything else is not a transition (ignored).
TRANSITIONS = {
    ("starting", "ready"): "serving",
    ("starting", "late"): "killed",
    ("starting", "exited"): "waiting",
    ("serving", "silent"): "killed",
    ("serving", "exited"): "waiting",
    ("killed", "exited"): "waiting",
    ("waiting", "due"): "starting",
}


class RestartsExhausted(Error):
    """Workers died more often than ``--max-worker-restarts`` allows in the window."""


@dataclass
class RestartPolicy:
    """The restart budget and backoff (pure: every call is given the time).

    Args:
        max_restarts: replacements allowed in any ``window`` seconds (0: none).
        window: seconds.
    """

    max_restarts: int
    window: float
    base_delay: float = BASE_DELAY_S
    max_delay: float = MAX_DELAY_S
    _times: collections.deque[float] = field(default_factory=collections.deque, repr=False)

    def admit(self, now: float) -> float | None:
        """A worker died at ``now``: seconds to wait before replacing it, or None when
        ``max_restarts`` replacements were admitted in the last ``window`` seconds already."""
        times = self._times
        while times and now - times[0] >= self.window:
            times.popleft()
        if len(times) >= self.max_restarts:
            return None
        earlier = len(times)
        times.append(now)
        if earlier == 0:
            return 0.0
        return float(min(self.max_delay, self.base_delay * 2 ** (earlier - 1)))

    def recent(self, now: float) -> int:
        """Replacements admitted in the ``window`` seconds before ``now``."""
        return sum(1 for t in self._times if now - t < self.window)


@dataclass
class Place:
    """One worker place: its process now, and where it is in `TRANSITIONS`."""

    index: int
    proc: Any = None  # a multiprocessing Process
    state: str = "starting"
    since: float = 0.0  # monotonic seconds the state began
    ready_ns: int = 0  # monotonic ns of its ``ready``
    due: float = 0.0  # when ``waiting``: the replacement's time
    why: str = ""  # the last failure the worker reported

    def move(self, event: str, now: float) -> bool:
        """Take ``event``; False if it is no transition from this state."""
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            return False
        self.state = nxt
        self.since = now
        return True


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Supervisor:
    """The master's workers after they all served once.

    Args:
        places: `Place` per worker, each with its started process (state ``serving``).
        spawn: starts a fresh worker process for a place index (same listening socket, same
            I/O process).
        policy: the restart budget.
        counters: the shared words (heartbeats read, restarts counted).
        worker_timeout: seconds without a heartbeat before a serving worker is killed.
        start_timeout: seconds a replacement may take to attach and listen.
        note: writes one line for the operator.
    """

    def __init__(
        self,
        places: list[Place],
        spawn: Callable[[int], Any],
        policy: RestartPolicy,
        counters: Any,
        worker_timeout: float,
        start_timeout: float,
        note: Callable[[str], None],
    ) -> None:
        self.places = places
        self._spawn = spawn
        self.policy = policy
        self.counters = counters
        self.worker_timeout = worker_timeout
        self.start_timeout = start_timeout
        self._note = note

    def on_event(self, kind: str, index: int, payload: Any, now: float) -> None:
        """A worker's message: ``ready`` (payload: its pid) or ``failed`` (payload: why)."""
        if not 0 <= index < len(self.places):
            return
        place = self.places[index]
        if kind == "ready" and place.proc is not None and payload == place.proc.pid:
            if place.move("ready", now):
                place.ready_ns = time.monotonic_ns()
                self._note(f"worker {index} (pid {payload}) serving")
        elif kind == "failed":
            place.why = str(payload)

    def tick(self, now: float) -> None:
        """Reap, kill and replace as `TRANSITIONS` says; raises `RestartsExhausted`."""
        now_ns = time.monotonic_ns()
        for place in self.places:
            proc = place.proc
            if place.state == "waiting":
                if now >= place.due:
                    place.move("due", now)
                    place.proc = self._spawn(place.index)
                    place.why = ""
                    self.counters.add_restart()
                    self._note(f"worker {place.index} replaced by pid {place.proc.pid}")
                continue
            if proc.exitcode is not None:
                self._died(place, now)
            elif place.state == "serving":
                beat = max(self.counters.last_beat(place.index), place.ready_ns)
                silent = (now_ns - beat) / 1e9
                if silent > self.worker_timeout and place.move("silent", now):
                    self._note(
                        f"worker {place.index} (pid {proc.pid}) sent no heartbeat for "
                        f"{silent:.1f}s (--worker-timeout {self.worker_timeout:g}); killing it"
                    )
                    _kill(proc)
            elif place.state == "starting" and now - place.since > self.start_timeout:
                place.move("late", now)
                self._note(
                    f"worker {place.index} (pid {proc.pid}) did not serve within "
                    f"{self.start_timeout:g}s; killing it"
                )
                _kill(proc)

    def _died(self, place: Place, now: float) -> None:
        proc = place.proc
        what = f"worker {place.index} (pid {proc.pid}) {_exit_text(proc.exitcode)}"
        if place.why:
            what += f" ({place.why})"
        proc.join(0)
        place.move("exited", now)
        delay = self.policy.admit(now)
        if delay is None:
            p = self.policy
            raise RestartsExhausted(
                f"{what}; {p.max_restarts} worker restart(s) within {p.window:g}s already "
                "(--max-worker-restarts, --worker-restart-window): stopping"
            )
        place.due = now + delay
        self._note(f"{what}; replacing it in {delay:.2f}s")

    def live(self) -> list[Any]:
        """The worker processes not yet reaped."""
        return [p.proc for p in self.places if p.proc is not None and p.proc.exitcode is None]


def _kill(proc: Any) -> None:
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
