"""Numbers of the shared region that the C extension and Python both use.

The end codes a slot can carry (the engine's 1..4, the I/O process's own from 16), the word
indices of an engine-table row and the engine states published in its ``E_STATE`` word. The C
defines each of them too (native/frame.h, native/region.h); `check_native` compares every one
with `tsfront._native` when this module is imported, so a drift fails at import, not as a
wrong end code in a stream.
"""

from __future__ import annotations

from typing import Final

from tsfront import _native

# Engine-table row: ENGINE_WORDS little-endian u32 words (64 bytes).
ENGINE_WORDS: Final = 16
E_STATE: Final = 0
E_INDEX: Final = 1
E_IN_FLIGHT: Final = 2
E_RUNNING: Final = 3
E_WAITING: Final = 4
E_KV_ACTIVE: Final = 5
E_KV_TOTAL: Final = 6
E_LOAD_MS_LO: Final = 7
E_LOAD_MS_HI: Final = 8
E_REQUESTS_LO: Final = 9
E_REQUESTS_HI: Final = 10

# Published engine states (the E_STATE word). In the I/O process an engine's state is richer
# (`tsfront.io.engines.EngineState`); this is what workers see of it.
ENGINE_ABSENT: Final = 0
ENGINE_HANDSHAKING: Final = 1
ENGINE_LIVE: Final = 2
ENGINE_DEAD: Final = 3
# A live engine that holds requests and sent no output frame for ``stall_timeout``.
ENGINE_STALLED: Final = 4
#: The published states of a connected engine (context limits count both; a request placed
#: or pinned on a stalled one is the I/O process's to refuse, with FIN_ENGINE_STALLED).
SERVING_STATES: Final = (ENGINE_LIVE, ENGINE_STALLED)

# End codes from the engine (its finish reason).
FIN_NONE: Final = 0
FIN_STOP: Final = 1
FIN_LENGTH: Final = 2
FIN_ABORT: Final = 3
FIN_OTHER: Final = 4
# Local end codes: the I/O process ends the slot itself.
FIN_LOCAL_FIRST: Final = 16
FIN_ENGINE_DEAD: Final = 16
FIN_SEND_TIMEOUT: Final = 17
FIN_DUPLICATE: Final = 18
FIN_NO_ENGINE: Final = 19
FIN_IO_STOPPING: Final = 20
FIN_RID_ABORTED: Final = 21
FIN_DEADLINE: Final = 22
# Disaggregated serving: failures of the prefill half (the decode half's are the codes above).
FIN_PREFILL_DEAD: Final = 23
FIN_PREFILL_SEND_TIMEOUT: Final = 24
FIN_PREFILL_ABORTED: Final = 25
# The engine holding it stalled for longer than stall_fail_timeout (or every live engine, or
# the pinned one, was stalled when it was placed): retry.
FIN_ENGINE_STALLED: Final = 26

#: Every name above the C also defines.
SHARED_WITH_NATIVE: Final = (
    "E_STATE",
    "E_INDEX",
    "E_IN_FLIGHT",
    "E_RUNNING",
    "E_WAITING",
    "E_KV_ACTIVE",
    "E_KV_TOTAL",
    "E_LOAD_MS_LO",
    "E_LOAD_MS_HI",
    "E_REQUESTS_LO",
    "E_REQUESTS_HI",
    "ENGINE_WORDS",
    "ENGINE_ABSENT",
    "ENGINE_HANDSHAKING",
    "ENGINE_LIVE",
    "ENGINE_DEAD",
    "ENGINE_STALLED",
    "FIN_NONE",
    "FIN_STOP",
    "FIN_LENGTH",
    "FIN_ABORT",
    "FIN_OTHER",
    "FIN_LOCAL_FIRST",
    "FIN_ENGINE_DEAD",
    "FIN_SEND_TIMEOUT",
    "FIN_DUPLICATE",
    "FIN_NO_ENGINE",
    "FIN_IO_STOPPING",
    "FIN_RID_ABORTED",
    "FIN_DEADLINE",
    "FIN_PREFILL_DEAD",
    "FIN_PREFILL_SEND_TIMEOUT",
    "FIN_PREFILL_ABORTED",
    "FIN_ENGINE_STALLED",
)


def mismatches(native: object, names: tuple[str, ...] = SHARED_WITH_NATIVE) -> list[str]:
    """Each of ``names`` whose value here differs from (or is missing in) ``native``."""
    mine = globals()
    return [
        f"{name}: {mine[name]} here, {getattr(native, name, 'missing')} in the C extension"
        for name in names
        if getattr(native, name, None) != mine[name]
    ]


def check_native(native: object = _native) -> None:
    """Raise ImportError if the C extension disagrees with any number of this module (a stale
    build of native/: rebuild it)."""
    wrong = mismatches(native)
    if wrong:
        raise ImportError("tsfront._native disagrees with tsfront.ipc.codes: " + "; ".join(wrong))


check_native()
