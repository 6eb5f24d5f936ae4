"""``tsfront.sim``: simulated TokenSpeed ranks that dial a frontend exactly as real ones do.

* :mod:`~tsfront.sim.scheduler` — the pure step logic of one rank (admission, one token per
  running request per step, finishing, output cadence, silent aborts); no I/O;
* :mod:`~tsfront.sim.engine` — one rank: handshake, input DEALER, output PUSH, fault injection
  and test hooks;
* :mod:`~tsfront.sim.group` — N ranks as threads (tests) or OS processes;
* :mod:`~tsfront.sim.script` — scripted answers (a marker in the prompt → output text).

The ``tsfront sim`` command is `tsfront.commands.sim`.

Tokens are deterministic: see :func:`~tsfront.sim.scheduler.default_token`.
"""

from tsfront.sim.engine import EngineOptions, Received, SimEngine
from tsfront.sim.group import SimGroup
from tsfront.sim.scheduler import (
    EngineFault,
    LoadTail,
    OutputRow,
    Scheduler,
    SchedulerConfig,
    ScriptFn,
    StepOutput,
    TokenFn,
    default_logprob,
    default_token,
)

__all__ = [
    "EngineFault",
    "EngineOptions",
    "LoadTail",
    "OutputRow",
    "Received",
    "Scheduler",
    "SchedulerConfig",
    "ScriptFn",
    "SimEngine",
    "SimGroup",
    "StepOutput",
    "TokenFn",
    "default_logprob",
    "default_token",
]
