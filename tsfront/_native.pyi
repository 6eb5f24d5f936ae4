"""Types of the C extension (native/module.c and the files it names).

The C returns plain tuples (a named tuple would cost the worker's per-token read); their
fields are named here, in order, so that a change of shape in the C has to change these
aliases, and every caller that unpacks one by position fails mypy until it follows.
"""

from typing import Any, Final, TypeAlias

from typing_extensions import Buffer

#: What `Writer.ingest` returns for an output frame: (engine_index, num_running, num_waiting,
#: kv_active_pages, kv_total_pages, rows, unknown_rows, finished_slots), the first five from
#: the frame's load tail (zeros when it has none); ``finished_slots`` are the slots the frame
#: ended. ``None`` instead of it: the frame was ENGINE_CORE_DEAD.
IngestResult: TypeAlias = tuple[int, int, int, int, int, int, int, list[int]]

#: One slot's news from `Reader.poll` / `Reader.read`: (local_slot, token_ids,
#: logprob_values or None, logprob_ids or None, finish (0: still running), prompt_tokens,
#: completion_tokens, cached_tokens, engine_index (-1: none)).
SlotUpdate: TypeAlias = tuple[
    int, list[int], list[float] | None, list[int] | None, int, int, int, int, int
]

SLOT_IDLE: Final[int]
LANE_SENT: Final[int]
LANE_FULL: Final[int]
LANE_UNREACHABLE: Final[int]
SUB_OK: Final[int]
SUB_FULL: Final[int]
SUB_TOO_BIG: Final[int]
SUB_ZMQ_PENDING: Final[int]
SUB_ADD: Final[int]
SUB_ABORT: Final[int]
SLOT_LIVE: Final[int]
SLOT_DONE: Final[int]
FIN_NONE: Final[int]
FIN_STOP: Final[int]
FIN_LENGTH: Final[int]
FIN_ABORT: Final[int]
FIN_OTHER: Final[int]
FIN_LOCAL_FIRST: Final[int]
FIN_ENGINE_DEAD: Final[int]
FIN_SEND_TIMEOUT: Final[int]
FIN_DUPLICATE: Final[int]
FIN_NO_ENGINE: Final[int]
FIN_IO_STOPPING: Final[int]
FIN_RID_ABORTED: Final[int]
FIN_DEADLINE: Final[int]
FIN_PREFILL_DEAD: Final[int]
FIN_PREFILL_SEND_TIMEOUT: Final[int]
FIN_PREFILL_ABORTED: Final[int]
ENGINE_BYTES: Final[int]
ENGINE_WORDS: Final[int]
HEADER_BYTES: Final[int]
E_STATE: Final[int]
E_INDEX: Final[int]
E_IN_FLIGHT: Final[int]
E_RUNNING: Final[int]
E_WAITING: Final[int]
E_KV_ACTIVE: Final[int]
E_KV_TOTAL: Final[int]
E_LOAD_MS_LO: Final[int]
E_LOAD_MS_HI: Final[int]
E_REQUESTS_LO: Final[int]
E_REQUESTS_HI: Final[int]
ENGINE_ABSENT: Final[int]
ENGINE_HANDSHAKING: Final[int]
ENGINE_LIVE: Final[int]
ENGINE_DEAD: Final[int]
ENGINE_STALLED: Final[int]

def abi_version() -> int: ...
def first_bad_token(ids: object) -> int: ...
def block_hashes(payload: Buffer, granularity: int, limit: int) -> list[int]: ...
def packed_block_hashes(ids: list[int], granularity: int, limit: int) -> bytes: ...
def layout(
    num_workers: int,
    slots_per_worker: int,
    ring_capacity: int,
    max_engines: int,
    submit_ring_bytes: int = 0,
) -> dict[str, int]: ...
def anchor_ends(data: Buffer, anchors: tuple[bytes, ...], /) -> tuple[list[int], list[int]]: ...
def encode_cache_format(buffer: Buffer, seed: int, /) -> None: ...

class EncodeCache:
    """The shared store of prompt-prefix token ids (native/encodecache.c)."""

    def __init__(self, buffer: Buffer, /) -> None: ...
    @property
    def arena_bytes(self) -> int: ...
    def lookup(self, data: Buffer, ends: list[int], /) -> tuple[int, list[int]]: ...
    def store(
        self, data: Buffer, ends: list[int], first: int, segments: list[list[int]], /
    ) -> int: ...
    def counters(self) -> tuple[int, ...]: ...

def set_parent_death_signal(signum: int, /) -> None: ...
def set_process_title(title: str, name: str, /) -> int: ...
def token_event(
    pieces: list[bytes],
    decoder: object,
    tokens: list[int],
    head: bytes,
    tail: bytes,
    errors: str,
    framed: bool,
    /,
) -> bytes | None: ...
def push_batch(updates: list[SlotUpdate], refs: list[Any], /) -> list[SlotUpdate]: ...

class PusherBase:
    """The state `push_batch` reads of a streamed choice's sink
    (`tsfront.serve.core.push.Pusher`)."""

    _cycle: Any
    _flow: Any
    _pieces: list[bytes]
    _decoder: Any
    _errors: str
    _head: bytes
    _tail: bytes
    _choice: Any
    inflight: Any
    error: BaseException | None
    _sock: Any
    _fd: int
    @property
    def direct_sends(self) -> int: ...

class ConnectionBase:
    """The write state `push_batch` reads of a connection's transport
    (`tsfront.serve.edge.transport.ConnectionTransport`)."""

    _clean: bool
    @property
    def clean_sends(self) -> int: ...

class Writer:
    """The I/O process's side of the slot region: binds requests, ingests output frames."""

    def __init__(
        self,
        buffer: Buffer,
        num_workers: int,
        slots_per_worker: int,
        ring_capacity: int,
        max_engines: int,
        submit_ring_bytes: int = 0,
    ) -> None: ...
    def bind(
        self,
        rid: bytes,
        slot: int,
        ticket: int,
        with_logprobs: bool,
        dup_code: int,
        engine_index: int,
        /,
    ) -> bool: ...
    def unbind(self, slot: int, /) -> bool: ...
    def finish(self, slot: int, code: int, engine_index: int, /) -> bool: ...
    def ingest(
        self, frame: Buffer, engine_index: int = 0, table_row: int = -1, /
    ) -> IngestResult | None: ...
    def flush_spills(self) -> int: ...
    def set_worker_fd(self, worker: int, fd: int, /) -> None: ...
    def wake(self) -> int: ...
    def reset_worker(self, worker: int, /) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def spilling(self) -> int: ...

class Reader:
    """One worker's side of the slot region: reads its slots' rings."""

    def __init__(
        self,
        buffer: Buffer,
        worker: int,
        num_workers: int,
        slots_per_worker: int,
        ring_capacity: int,
        max_engines: int,
        submit_ring_bytes: int = 0,
    ) -> None: ...
    def expect(self, local_slot: int, ticket: int, /) -> None: ...
    def release(self, local_slot: int, /) -> None: ...
    def poll(self) -> list[SlotUpdate]: ...
    def read(self, local_slot: int, /) -> SlotUpdate | None: ...
    def park(self) -> bool: ...
    def rescans(self) -> int: ...
    def wakes(self) -> int: ...

#: A record taken from a submission ring: (worker, kind, a, b, c); kind SUB_ADD (a: submit
#: header + rid, b: payload, c: block hashes or None), SUB_ABORT (a: abort entries), 0 (the
#: ring was corrupt, what it held is dropped; a: why, a str).
SubmitRecord: TypeAlias = tuple[int, int, bytes | str, bytes | None, bytes | None]

class Submitter:
    """A worker's side of its submission ring: writes ADD and ABORT records."""

    def __init__(
        self,
        buffer: Buffer,
        worker: int,
        num_workers: int,
        slots_per_worker: int,
        ring_capacity: int,
        max_engines: int,
        submit_ring_bytes: int,
        eventfd: int,
    ) -> None: ...
    def add(self, header: Buffer, payload: Buffer, hashes: Buffer | None = None, /) -> int: ...
    def abort(self, entries: Buffer, /) -> int: ...
    def ring(self) -> bool: ...
    def zmq_sent(self) -> None: ...
    def stats(self) -> dict[str, int]: ...

class Intake:
    """The I/O process's side of the workers' submission rings: takes their records."""

    def __init__(
        self,
        buffer: Buffer,
        num_workers: int,
        slots_per_worker: int,
        ring_capacity: int,
        max_engines: int,
        submit_ring_bytes: int,
    ) -> None: ...
    def open(self, worker: int, /) -> None: ...
    def close(self, worker: int, /) -> None: ...
    def park(self) -> bool: ...
    def take(self, limit: int = 256, worker: int = -1) -> list[SubmitRecord]: ...
    def applied(self, worker: int, /) -> None: ...
    def stats(self) -> dict[str, int]: ...

class Record:
    """A request in flight in the I/O core (native/record.c): its rid, the engine holding it,
    its worker's ticket, whether its ADD left; under disaggregated serving its prefill half."""

    rid: bytes
    engine: Any
    ticket: int
    sent: bool
    prefill: Any
    prefill_sent: bool
    room: int
    def __init__(self, rid: bytes, engine: Any, ticket: int, sent: bool = True) -> None: ...

#: What `InputLanes.flush` reports of a lane: (lane, errno of a failed send or 0, whether bytes
#: wait that the kernel did not take, EPOLLOUT wanted).
LaneChange: TypeAlias = tuple[int, int, bool]

class InputLanes:
    """Each routed input connection's outgoing stream, one lane a connection, found by its
    identity (native/lanes.c)."""

    def __init__(self, count: int, depth: int) -> None: ...
    @property
    def dirty(self) -> bool: ...
    def open(self, lane: int, fd: int, identity: bytes, /) -> None: ...
    def close(self, lane: int, /) -> None: ...
    def send(self, lane: int, kind: Buffer, payload: Buffer, /) -> int: ...
    def put(self, lane: int, data: Buffer, /) -> bool: ...
    def write(self, lane: int, /) -> tuple[int, bool]: ...
    def flush(self) -> list[LaneChange]: ...
    def pending(self, lane: int, /) -> bytes: ...
    def fd(self, lane: int, /) -> int: ...
    def stats(self) -> dict[str, int]: ...

class Turn:
    """The I/O process's wait and its turns that need no Python (native/turn.c)."""

    enabled: bool
    def __init__(
        self,
        writer: Writer,
        intake: Intake | None,
        lanes: InputLanes,
        epoll_fd: int,
        intake_fd: int,
        records: dict[int, Record],
        attached: dict[int, Any],
        probes: dict[bytes, Any],
        counts: dict[str, int],
        count_words: tuple[tuple[str, int], ...],
        engines: list[Any],
        router: Any,
        policy: int,
        load_ttl: float,
        live: Any,
        stepping: Any,
        add_kind: bytes,
        slots_per_worker: int,
        enabled: bool,
    ) -> None: ...
    def run(self, timeout_ms: int, /) -> list[tuple[int, int]]: ...
    def stats(self) -> dict[str, int]: ...
