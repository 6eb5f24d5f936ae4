"""tsfront: a Python frontend for TokenSpeed inference engines.

One I/O process terminates every engine socket and writes each request's tokens into
shared-memory rings keyed by request slot; any number of worker processes submit tokenized
requests and read their streams straight from shared memory.
"""

from tsfront.errors import (
    Busy,
    ClientClosed,
    ConfigError,
    DuplicateRequest,
    EngineDied,
    EngineUnavailable,
    Error,
    HandshakeError,
    HandshakeTimeout,
    InvalidRequest,
    IOProcessDied,
    PromptTooLong,
    SendTimeout,
    StopStringsRefused,
    StreamError,
    StreamRejected,
    WireDecodeError,
)

__version__ = "0.1.0"

__all__ = [
    "Busy",
    "ClientClosed",
    "ConfigError",
    "DuplicateRequest",
    "EngineDied",
    "EngineUnavailable",
    "Error",
    "HandshakeError",
    "HandshakeTimeout",
    "IOProcessDied",
    "InvalidRequest",
    "PromptTooLong",
    "SendTimeout",
    "StopStringsRefused",
    "StreamError",
    "StreamRejected",
    "WireDecodeError",
    "__version__",
]
