"""Configuration: where the client listens, which engines it expects, and how it routes.

`ClientConfig` carries the crate's eight fields (timeouts in seconds) plus the knobs of the
I/O process and the shared-memory region, each with a documented default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import cast

from tsfront.errors import ConfigError
from tsfront.wire.addresses import MAX_PORT, check_endpoint, split_tcp


class LoadBalance(enum.Enum):
    """Placement policy for unpinned requests in aggregated serving.

    Every policy skips dead engines and breaks ties by rotating, so rank 0 is never favoured.
    """

    #: Fewest requests in flight, counted by tsfront itself (always exact).
    LEAST_IN_FLIGHT = "least_in_flight"
    #: Each live engine in turn.
    ROUND_ROBIN = "round_robin"
    #: Smallest `num_running + num_waiting` from the engine's latest load tail, plus the
    #: requests sent to it since that tail was sampled; stale or empty tails are ignored and the
    #: engine's own in-flight count stands in for them.
    SHORTEST_QUEUE = "shortest_queue"
    #: Lowest `kv_active_pages / kv_total_pages` from the load tail (fresh tails only), ties and
    #: stale tails broken by in-flight count.
    MIN_CACHE_USAGE = "min_cache_usage"
    #: The engine holding the longest prefix of the prompt, by an index of the prompts sent to
    #: each engine (chained hashes of its prompt blocks, LRU-bounded by
    #: ``ClientConfig.prefix_index_blocks``, forgotten when the engine dies or restarts); the
    #: least in flight among equals, and the least in flight overall when the chosen engine is
    #: more than ``affinity_abs_threshold`` requests and ``affinity_rel_threshold`` times above
    #: it. See ``tsfront.io.affinity``.
    PREFIX_AFFINITY = "prefix_affinity"


@dataclass(frozen=True)
class EngineGroup:
    """One engine group of disaggregated serving (its prefill ranks, or its decode ranks).

    Each group has its own handshake, input and output addresses and identities
    ``first_engine_index .. first_engine_index + num_engines - 1`` (as `ClientConfig`'s own
    fields for an aggregated group), all bound by the one I/O process.

    Attributes:
        handshake_address, input_address, output_address, first_engine_index, num_engines:
            as the `ClientConfig` fields of the same names, for this group.
        load_balance: placement within the group (the decode group's; the prefill engine is
            fixed by the request's ``bootstrap_room`` residue, as TokenSpeed requires).
        bootstrap_host: the host a decode engine reaches the prefill engines' bootstrap
            server at (prefill group only). ``None``: the address each prefill engine's
            handshake connection came from.
        bootstrap_port: the prefill engines' ``--disaggregation-bootstrap-port`` (prefill
            group only). ``None``: sent as nil, so each engine uses its own (default 8998).
    """

    handshake_address: str
    input_address: str = "tcp://127.0.0.1:0"
    output_address: str = "tcp://127.0.0.1:0"
    first_engine_index: int = 0
    num_engines: int = 1
    load_balance: LoadBalance = LoadBalance.LEAST_IN_FLIGHT
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.load_balance, LoadBalance):
            raise ConfigError(
                f"EngineGroup.load_balance={self.load_balance!r}: use a LoadBalance member"
            )
        if self.bootstrap_host is not None and (
            not isinstance(self.bootstrap_host, str) or not self.bootstrap_host
        ):
            raise ConfigError(f"bootstrap_host={self.bootstrap_host!r}: a host name or None")
        port = self.bootstrap_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
            raise ConfigError(f"bootstrap_port={port!r}: a port number or None")
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"bootstrap_port={port!r}: must be in 1..65535")

    def to_dict(self) -> dict:
        """The group as plain data."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["load_balance"] = self.load_balance.value
        return out

    @classmethod
    def from_dict(cls, data: dict) -> EngineGroup:
        """Inverse of `to_dict`."""
        data = dict(data)
        data["load_balance"] = LoadBalance(data["load_balance"])
        return cls(**data)


@dataclass(frozen=True)
class Routing:
    """How requests are assigned to engines (one engine per attention-DP rank).

    Aggregated (`aggregated`): a request whose ``data_parallel_rank`` is set always goes to
    that rank's engine (``first_engine_index + rank``); the others are placed by
    ``load_balance``. Disaggregated (`disaggregated`): each request goes to one prefill engine
    and one decode engine (see `disaggregated`).
    """

    load_balance: LoadBalance = LoadBalance.LEAST_IN_FLIGHT
    prefill: EngineGroup | None = None
    decode: EngineGroup | None = None

    @property
    def is_disaggregated(self) -> bool:
        """Whether requests go to a prefill and a decode engine."""
        return self.prefill is not None

    @classmethod
    def disaggregated(cls, prefill: EngineGroup, decode: EngineGroup) -> Routing:
        """Disaggregated prefill/decode serving over two engine groups.

        Each request gets a unique 63-bit ``bootstrap_room``; its prefill engine is the one
        TokenSpeed requires, ``prefill.first_engine_index + room % prefill.num_engines``; its
        decode engine is placed by ``decode.load_balance`` (or ``data_parallel_rank``, a rank
        of the decode group). The same ADD goes to both with the bootstrap fields filled in;
        the stream comes from the decode engine. The decode group's fields become the
        config's ``handshake_address`` ... ``num_engines``.
        """
        for name, group in (("prefill", prefill), ("decode", decode)):
            if not isinstance(group, EngineGroup):
                raise ConfigError(
                    f"Routing.disaggregated: {name}={group!r}; pass an EngineGroup(...)"
                )
        return cls(decode.load_balance, prefill, decode)

    @classmethod
    def aggregated(cls, load_balance: LoadBalance = LoadBalance.LEAST_IN_FLIGHT) -> Routing:
        """Aggregated (non-disaggregated) serving with the given placement policy."""
        if not isinstance(load_balance, LoadBalance):
            raise ConfigError(
                f"Routing.aggregated takes a LoadBalance, got {load_balance!r}; "
                "use e.g. LoadBalance.LEAST_IN_FLIGHT"
            )
        return cls(load_balance)


@dataclass(frozen=True)
class ClientConfig:
    """Where the client listens and which engines it expects.

    The first eight fields are the crate's; the rest tune the I/O process and shared memory.

    Attributes:
        handshake_address: ZMQ endpoint of the handshake ROUTER the engines dial
            (TokenSpeed's ``--data-parallel-address``/``--data-parallel-rpc-port``).
        input_address: endpoint of the input port the engines' DEALERs connect to (a ROUTER
            served by the I/O process itself, `tsfront.io.inputs`); port 0 binds an ephemeral
            port. Sent to every engine in INIT.
        output_address: endpoint of the engines' output PUSHes, read as a ZMTP PULL by the I/O
            process itself (`tsfront.io.outputs`). Each engine gets its own so a
            failure can be attributed: port 0 gives each an ephemeral port, a fixed port P gives
            engine ``i`` (counted from 0) port ``P + i``, ``ipc://path`` gives ``ipc://path.i``.
        first_engine_index: TokenSpeed's ``--zmq-engine-index`` (identity of rank 0).
        num_engines: number of attention-DP ranks expected.
        routing: placement of unpinned requests.
        handshake_timeout: seconds for every engine to say HELLO and register.
        send_timeout: seconds a request may wait for an engine's input queue to take it
            before its stream ends with `SendTimeout`.
        max_workers: worker processes that may attach at once.
        slots_per_worker: requests one worker may have in flight (its slots).
        ring_capacity: tokens a slot's ring holds before the I/O process spills to its own
            memory (never blocking on a slow reader).
        submit_queue_depth: submissions a worker may have queued towards the I/O process
            over ZMQ before `generate` raises `Busy`.
        submit_ring_bytes: bytes of each worker's submission ring in shared memory (a
            multiple of 64, at least 4,096; 0: none, every submission goes over ZMQ). ADDs and
            ABORTs go through it without a ZMQ I/O thread on either side; a record larger
            than half of it (a prompt of more than about 100k tokens at the default 1 MiB)
            goes over ZMQ. A full ring is `Busy`, like a full queue.
        engine_queue_depth: messages (ADDs, ABORT batches) the I/O process queues towards
            one engine that the kernel has not taken yet (the input port's high-water mark,
            as a ROUTER's ``SNDHWM``); beyond it requests wait in the I/O
            process's backlog for up to ``send_timeout``, so an engine that stops reading its
            input costs bounded memory and its requests end with `SendTimeout`.
        heartbeat_interval: seconds between ZMTP heartbeats on each engine's output
            connection.
        heartbeat_timeout: seconds without a heartbeat reply after which an engine's output
            connection is dropped and the engine declared dead. A partition is detected in
            about ``heartbeat_interval + heartbeat_timeout`` (3 s with the defaults).
        max_message_size: largest frame accepted from an engine on the handshake and input
            sockets (HELLO/READY and registrations are a few hundred bytes); larger frames
            cut that connection. Output connections take messages of up to 256 MiB
            (`tsfront.io.outputs.MAX_OUTPUT_MESSAGE`): a big batch is legitimate.
        load_ttl: seconds a load tail stays fresh for routing.
        request_deadline: default deadline of every request, in seconds from `generate`
            (``None``, the default: no deadline). A request still unfinished when it passes
            is aborted on its engine and its stream ends with `DeadlineExceeded`;
            ``generate(..., deadline=...)`` overrides it per request.
        stall_timeout: seconds an engine with requests in flight may send no output frame
            before the I/O process marks it *stalled* (``None``: never): no request is placed
            (nor pinned) on it, `EngineClient.load` and the metrics say so, the I/O process
            probes it with a one-token request of its own (again every ``stall_timeout``
            while unanswered), and its first output frame clears it. 30 s, the default, is
            longer than any engine step should take (a chunked prefill sends rows for the
            other requests of each step); a false alarm (one huge unchunked prefill on an
            otherwise idle rank) steers new requests elsewhere until its next output. While
            every live engine is stalled, new requests end at once with `EngineStalled`
            (retryable; ``/health`` answers 503 meanwhile).
        stall_fail_timeout: seconds a stalled engine keeps its requests (counted from the
            moment it was marked stalled) before their streams end with `EngineStalled` and
            they are aborted on it (``None``: never; they then end only by their deadlines or
            the engine's death). 300 s, the default, is far above any prefill a real engine
            takes, long prompts in big batches included (a step that long is already a stall
            of ``stall_timeout``), so only a rank that stopped stepping reaches it.
        prefix_index_blocks: `LoadBalance.PREFIX_AFFINITY` only: block hashes remembered per
            engine (least recently used go first; fewer if the engine's registered KV cache
            holds fewer blocks). At most 400 bytes each in the I/O process: the default, 8,192
            (2M tokens of prompt at 256-token blocks), costs up to 3.3 MB per engine.
        prefix_block_tokens: `PREFIX_AFFINITY` only: the least number of tokens per indexed
            block; a block is a whole number of the engine's ``prefix_granularity`` blocks
            (so 256 tokens for the usual 64). Smaller blocks match more finely and cost more
            routing CPU per prompt token.
        affinity_abs_threshold: `PREFIX_AFFINITY` only: requests in flight the engine with
            the longest match may carry above the least loaded engine before load wins...
        affinity_rel_threshold: ...provided it also carries more than this many times as
            many (both must hold for the fallback to least in flight).
        state_dir: a directory where the I/O process keeps each engine's registration, so
            that a new I/O process started with the same config takes the running engines
            over (after a crash or an upgrade) instead of waiting for them to restart; see
            docs/RELIABILITY.md. Needs fixed addresses (no port 0). ``None``: nothing kept.
    """

    handshake_address: str = "tcp://127.0.0.1:30500"
    input_address: str = "tcp://127.0.0.1:0"
    output_address: str = "tcp://127.0.0.1:0"
    first_engine_index: int = 0
    num_engines: int = 1
    routing: Routing = field(default_factory=Routing)
    handshake_timeout: float = 600.0
    send_timeout: float = 5.0
    max_workers: int = 32
    slots_per_worker: int = 2048
    ring_capacity: int = 256
    submit_queue_depth: int = 4096
    submit_ring_bytes: int = 1 << 20
    engine_queue_depth: int = 4096
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 2.0
    max_message_size: int = 1 << 20
    load_ttl: float = 2.0
    request_deadline: float | None = None
    stall_timeout: float | None = 30.0
    stall_fail_timeout: float | None = 300.0
    prefix_index_blocks: int = 8192
    prefix_block_tokens: int = 256
    affinity_abs_threshold: int = 8
    affinity_rel_threshold: float = 1.5
    state_dir: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.routing, Routing) and self.routing.is_disaggregated:
            _adopt_decode_group(self)
        check_endpoint(self.handshake_address, "handshake_address", tcp_only=True)
        check_endpoint(self.input_address, "input_address")
        check_endpoint(self.output_address, "output_address")
        if isinstance(self.routing, Routing) and self.routing.is_disaggregated:
            _check_prefill_group(self)
        if not 1 <= self.num_engines <= 4096:
            raise ConfigError(f"num_engines={self.num_engines}: must be between 1 and 4096")
        if not 0 <= self.first_engine_index <= 0xFFFF - self.num_engines + 1:
            raise ConfigError(
                f"first_engine_index={self.first_engine_index}: identities are u16, so "
                f"first_engine_index + num_engines - 1 must be <= 65535"
            )
        if self.output_address.startswith("tcp://"):
            port = split_tcp(self.output_address)[1]
            if port.isdigit() and int(port) and int(port) + self.num_engines - 1 > MAX_PORT:
                raise ConfigError(
                    f"output_address={self.output_address!r}: engine i gets port {port}+i, and "
                    f"{port}+{self.num_engines - 1} is above {MAX_PORT}; pick a lower port or 0"
                )
        if not isinstance(self.routing, Routing):
            raise ConfigError(
                f"routing={self.routing!r}: use Routing.aggregated(LoadBalance.LEAST_IN_FLIGHT)"
            )
        positive = (
            "handshake_timeout",
            "send_timeout",
            "heartbeat_interval",
            "heartbeat_timeout",
            "load_ttl",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be a positive number")
        if self.request_deadline is not None and not (
            isinstance(self.request_deadline, (int, float))
            and not isinstance(self.request_deadline, bool)
            and self.request_deadline > 0
        ):
            raise ConfigError(
                f"request_deadline={self.request_deadline!r}: must be None (no deadline) or a "
                "positive number of seconds"
            )
        if self.stall_timeout is not None and not (
            isinstance(self.stall_timeout, (int, float))
            and not isinstance(self.stall_timeout, bool)
            and self.stall_timeout > 0
        ):
            raise ConfigError(
                f"stall_timeout={self.stall_timeout!r}: must be None (no stall detection) or a "
                "positive number of seconds"
            )
        if self.stall_fail_timeout is not None and not (
            isinstance(self.stall_fail_timeout, (int, float))
            and not isinstance(self.stall_fail_timeout, bool)
            and self.stall_fail_timeout > 0
        ):
            raise ConfigError(
                f"stall_fail_timeout={self.stall_fail_timeout!r}: must be None (a stalled "
                "engine keeps its requests) or a positive number of seconds"
            )
        counts = (
            "max_workers",
            "slots_per_worker",
            "ring_capacity",
            "submit_queue_depth",
            "engine_queue_depth",
            "max_message_size",
            "prefix_index_blocks",
            "prefix_block_tokens",
        )
        for name in counts:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: must be a positive integer")
        if not isinstance(self.affinity_abs_threshold, int) or self.affinity_abs_threshold < 0:
            raise ConfigError(
                f"affinity_abs_threshold={self.affinity_abs_threshold!r}: must be an integer >= 0"
            )
        if not self.affinity_rel_threshold >= 1.0:
            raise ConfigError(
                f"affinity_rel_threshold={self.affinity_rel_threshold!r}: must be >= 1.0"
            )
        ring = self.submit_ring_bytes
        if (
            not isinstance(ring, int)
            or isinstance(ring, bool)
            or not (ring == 0 or (4096 <= ring <= 1 << 30 and ring % 64 == 0))
        ):
            raise ConfigError(
                f"submit_ring_bytes={ring!r}: must be 0 (no ring) or a multiple of 64 from 4096 "
                "to 1073741824"
            )
        if self.slots_per_worker * self.max_workers > 1 << 24:
            raise ConfigError("max_workers * slots_per_worker must be at most 16,777,216")
        if self.state_dir is not None:
            self._check_state_dir()

    def _check_state_dir(self) -> None:
        if not isinstance(self.state_dir, str) or not self.state_dir:
            raise ConfigError(f"state_dir={self.state_dir!r}: give a directory path, or None")
        if isinstance(self.routing, Routing) and self.routing.is_disaggregated:
            raise ConfigError(
                "state_dir is not supported with Routing.disaggregated yet (only the decode "
                "group's registrations would be kept); drop state_dir, or serve aggregated"
            )
        for name in ("handshake_address", "input_address", "output_address"):
            value = getattr(self, name)
            port = value.rpartition(":")[2] if value.startswith("tcp://") else ""
            if port in ("0", "*"):
                # The engines reconnect to the addresses they were given in INIT: a successor
                # bound elsewhere would never see them again.
                raise ConfigError(
                    f"state_dir needs fixed addresses, but {name}={value!r} binds an "
                    "ephemeral port, which a restarted I/O process could not bind again; "
                    "give it a fixed port (or an ipc:// path)"
                )

    def to_dict(self) -> dict:
        """The config as plain data (sent to the I/O process)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["routing"] = self.routing.load_balance.value
        if self.routing.is_disaggregated:
            # Disaggregated: both groups are set (Routing.disaggregated).
            out["routing"] = {
                "prefill": cast(EngineGroup, self.routing.prefill).to_dict(),
                "decode": cast(EngineGroup, self.routing.decode).to_dict(),
            }
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ClientConfig:
        """Inverse of `to_dict`."""
        data = dict(data)
        routing = data["routing"]
        if isinstance(routing, dict):
            data["routing"] = Routing.disaggregated(
                EngineGroup.from_dict(routing["prefill"]), EngineGroup.from_dict(routing["decode"])
            )
        else:
            data["routing"] = Routing(LoadBalance(routing))
        return cls(**data)


_GROUP_FIELDS = (
    "handshake_address",
    "input_address",
    "output_address",
    "first_engine_index",
    "num_engines",
)


def _adopt_decode_group(config: ClientConfig) -> None:
    # The decode group is the config's own group: the stream comes from it, pins name its
    # ranks. (Frozen dataclass: set before anything reads the fields.)
    for name in _GROUP_FIELDS:
        object.__setattr__(config, name, getattr(config.routing.decode, name))


def _check_prefill_group(config: ClientConfig) -> None:
    p = cast(EngineGroup, config.routing.prefill)  # called only when disaggregated
    for name in ("handshake_address", "input_address", "output_address"):
        value = getattr(p, name)
        if not isinstance(value, str) or "://" not in value:
            raise ConfigError(f"prefill {name}={value!r} is not a ZMQ endpoint")
    if not p.handshake_address.startswith("tcp://"):
        raise ConfigError(
            f"prefill handshake_address={p.handshake_address!r}: use 'tcp://HOST:PORT'"
        )
    if not 1 <= p.num_engines <= 4096:
        raise ConfigError(f"prefill num_engines={p.num_engines}: must be between 1 and 4096")
    if not 0 <= p.first_engine_index <= 0xFFFF - p.num_engines + 1:
        raise ConfigError(f"prefill first_engine_index={p.first_engine_index}: identities are u16")
    if p.handshake_address == config.handshake_address and not p.handshake_address.endswith(":0"):
        raise ConfigError(
            f"the prefill and decode groups share handshake_address={p.handshake_address!r}; "
            "each group needs its own"
        )
