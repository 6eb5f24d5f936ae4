"""Adoption: a new I/O process takes over the engines its predecessor registered.

An I/O process started with a state directory (`tsfront.io.state`) that holds registrations
of its group binds the same addresses and loads them; each such engine is *adopting*
(HANDSHAKING in the engine table, its registration known) until its output PUSH reconnects
(``EVENT_ACCEPTED`` from that rank's output port), when it is LIVE again, with the usual heartbeat
from then on. Its input DEALER reconnects on its own too, perhaps a little later: until a
send to it first succeeds, an unreachable input queues the request (bounded by
``send_timeout``) instead of declaring the engine dead. An engine that says HELLO instead (it
was restarted in the gap) runs the normal handshake, which drops its saved registration. Each
rank goes its own way.

The group is *ready* (workers get the engine list) as soon as one engine is live: ranks still
coming back show as HANDSHAKING and take no requests until they are. ``handshake_timeout``
after the start, an adopted engine that has not come back, or a rank that never registered,
is declared dead (and its registration dropped); if by then no engine is live, the start
fails as a normal handshake would.

Orphans: rows of an adopted engine process for rids this I/O process never bound to that
engine are requests of its predecessor, still decoding (a rid bound here to another engine is
one too: those rows never reach its slot). Each such rid (its row not a finishing one) is
aborted on that engine once and remembered with the other aborts of that engine
(`tsfront.ipc.aborts.RecentAborts`), so that an ADD reusing it within the engine's 300 s abort
memory is refused with `StreamRejected` instead of being dropped by the engine unanswered.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from tsfront.errors import WireDecodeError
from tsfront.io.core import IOCore
from tsfront.io.engines import Engine, EngineEvent
from tsfront.io.state import SavedEngine
from tsfront.wire import BatchTokenIDOutSlim, decode_output

log = logging.getLogger("tsfront.io")


class Adoption:
    """The take-over of one I/O core's engines; it uses only the core's public methods (the
    core calls it back through `tsfront.io.core.Adopter`)."""

    def __init__(self, core: IOCore) -> None:
        self.core = core

    def load(self, saved: list[SavedEngine]) -> None:
        """Mark each saved engine adopting, with its saved registration."""
        core = self.core
        for s in saved:
            engine = core.engines[s.row]
            engine.registration = s.registration
            engine.apply(EngineEvent.LOADED)
            core.adopting = True
            log.info("engine %d (rank %d): registration loaded, waiting for it", s.index, s.row)

    def on_accepted(self, engine: Engine) -> None:
        """The engine's output connection came back: it is live again."""
        engine.apply(EngineEvent.RECONNECTED)
        engine.dead_reason = ""
        self.core.dirty.add(engine.row)
        log.warning("engine %d (rank %d) reconnected: taken over", engine.index, engine.row)
        self.core.engine_live(engine)

    def expire(self) -> None:
        """``handshake_timeout`` has passed since the start: the ranks not back are dead."""
        core = self.core
        core.adopting = False
        for engine in core.engines:
            if engine.can(EngineEvent.EXPIRED):  # still adopting, or never registered
                why = (
                    f"did not come back within handshake_timeout={core.config.handshake_timeout}s "
                    "after the I/O process restarted"
                )
                core.kill(engine, EngineEvent.EXPIRED, why)
                core.forget_registration(engine)
        if core.state == "handshaking":
            if any(e.live for e in core.engines):
                core.ready()
            else:
                core.fail_handshake()

    def orphans(self, engine: Engine, frame: bytes) -> None:
        """Abort, once each, the rids of ``frame`` (from an adopted engine) that we never
        bound to that engine."""
        try:
            batch = decode_output(frame)
        except WireDecodeError:
            return  # the native decoder took it; nothing more to learn here
        rids = getattr(batch, "rids", None)
        if not rids:
            return
        now = time.monotonic()
        known: set[bytes] | None = None
        reasons = cast(BatchTokenIDOutSlim, batch).finished_reasons  # it has rids: not DEAD
        for rid, reason in zip(rids, reasons, strict=False):
            if reason or not isinstance(rid, str):
                continue  # ended on the engine already: nothing to stop
            key = rid.encode("utf-8", "surrogatepass")
            if engine.aborted.age(key, now) is not None:
                continue  # aborted already (by a worker of ours, or as an orphan)
            if known is None:
                # Bound here to another engine is not ours on this one: the predecessor sent it.
                known = {r.rid for r in self.core.records.values() if r.engine is engine}
            if key in known:
                continue
            self.core.count("orphan_aborts")
            log.info("engine %d: aborting orphan %r of the previous I/O process", engine.index, rid)
            self.core.queue_abort(engine, key)
