"""tsfront: a Python frontend for TokenSpeed inference engines.

One I/O process terminates every engine socket and writes each request's tokens into
shared-memory rings keyed by request slot; any number of worker processes submit tokenized
requests and read their streams straight from shared memory.
"""

from tsfront.client import ClientListener, EngineClient
from tsfront.config import ClientConfig, EngineGroup, LoadBalance, Routing
from tsfront.errors import (
    Busy,
    ClientClosed,
    ConfigError,
    DeadlineExceeded,
    DuplicateRequest,
    EngineDied,
    EngineUnavailable,
    Error,
    HandshakeError,
    HandshakeTimeout,
    InvalidRequest,
    IOProcessDied,
    PrefillFailed,
    PromptTooLong,
    RidRecentlyAborted,
    SendTimeout,
    StateDirInUse,
    StateDirMismatch,
    StopStringsRefused,
    StreamError,
    StreamRejected,
    WireDecodeError,
)
from tsfront.info import EngineInfo, EngineLoad
from tsfront.ioproc import IOProcess
from tsfront.stream import OutputChunk, RequestStream

__version__ = "0.1.0"

__all__ = [
    "Busy",
    "ClientClosed",
    "ClientConfig",
    "ClientListener",
    "ConfigError",
    "DeadlineExceeded",
    "DuplicateRequest",
    "EngineClient",
    "EngineDied",
    "EngineGroup",
    "EngineInfo",
    "EngineLoad",
    "EngineUnavailable",
    "Error",
    "HandshakeError",
    "HandshakeTimeout",
    "IOProcess",
    "IOProcessDied",
    "InvalidRequest",
    "LoadBalance",
    "OutputChunk",
    "PrefillFailed",
    "PromptTooLong",
    "RequestStream",
    "RidRecentlyAborted",
    "Routing",
    "SendTimeout",
    "StateDirInUse",
    "StateDirMismatch",
    "StopStringsRefused",
    "StreamError",
    "StreamRejected",
    "WireDecodeError",
    "__version__",
]
