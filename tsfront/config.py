"""Configuration: where the client listens, which engines it expects, and how it routes.

`ClientConfig` carries the crate's eight fields (timeouts in seconds) plus the knobs of the
I/O process and the shared-memory region, each with a documented default.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tsfront.errors import ConfigError


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


@dataclass(frozen=True)
class Routing:
    """How requests are assigned to engines (one engine per attention-DP rank).

    A request whose ``data_parallel_rank`` is set always goes to that rank's engine
    (``first_engine_index + rank``); the others are placed by ``load_balance``.
    """

    load_balance: LoadBalance = LoadBalance.LEAST_IN_FLIGHT

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
        input_address: endpoint of the input ROUTER the engines' DEALERs connect to; port 0
            binds an ephemeral port. Sent to every engine in INIT.
        output_address: endpoint of the output PULL. Each engine gets its own PULL so a
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
            before `generate` raises `Busy`.
        engine_queue_depth: requests the I/O process lets ZMQ queue towards one engine
            (the input ROUTER's send high-water mark); beyond it requests wait in the I/O
            process's backlog for up to ``send_timeout``, so an engine that stops reading its
            input costs bounded memory and its requests end with `SendTimeout`.
        heartbeat_interval: seconds between ZMTP heartbeats on each engine's output
            connection.
        heartbeat_timeout: seconds without a heartbeat reply after which an engine's output
            connection is dropped and the engine declared dead. A partition is detected in
            about ``heartbeat_interval + heartbeat_timeout`` (3 s with the defaults).
        max_message_size: largest frame accepted from an engine on the handshake and input
            sockets (HELLO/READY and registrations are a few hundred bytes); larger frames
            cut that connection. Output sockets have no limit: a big batch is legitimate.
        load_ttl: seconds a load tail stays fresh for routing.
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
    engine_queue_depth: int = 4096
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 2.0
    max_message_size: int = 1 << 20
    load_ttl: float = 2.0
    state_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("handshake_address", "input_address", "output_address"):
            value = getattr(self, name)
            if not isinstance(value, str) or "://" not in value:
                raise ConfigError(
                    f"{name}={value!r} is not a ZMQ endpoint; use e.g. 'tcp://127.0.0.1:0'"
                )
        if not self.handshake_address.startswith("tcp://"):
            raise ConfigError(
                f"handshake_address={self.handshake_address!r}: TokenSpeed engines dial the "
                "handshake over TCP; use 'tcp://HOST:PORT'"
            )
        if not 1 <= self.num_engines <= 4096:
            raise ConfigError(f"num_engines={self.num_engines}: must be between 1 and 4096")
        if not 0 <= self.first_engine_index <= 0xFFFF - self.num_engines + 1:
            raise ConfigError(
                f"first_engine_index={self.first_engine_index}: identities are u16, so "
                f"first_engine_index + num_engines - 1 must be <= 65535"
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
        counts = (
            "max_workers",
            "slots_per_worker",
            "ring_capacity",
            "submit_queue_depth",
            "engine_queue_depth",
            "max_message_size",
        )
        for name in counts:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: must be a positive integer")
        if self.slots_per_worker * self.max_workers > 1 << 24:
            raise ConfigError("max_workers * slots_per_worker must be at most 16,777,216")
        if self.state_dir is not None:
            self._check_state_dir()

    def _check_state_dir(self) -> None:
        if not isinstance(self.state_dir, str) or not self.state_dir:
            raise ConfigError(f"state_dir={self.state_dir!r}: give a directory path, or None")
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
        return out

    @classmethod
    def from_dict(cls, data: dict) -> ClientConfig:
        """Inverse of `to_dict`."""
        data = dict(data)
        data["routing"] = Routing(LoadBalance(data["routing"]))
        return cls(**data)
