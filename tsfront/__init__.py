"""tsfront: a Python frontend for TokenSpeed inference engines.

One I/O process terminates every engine socket and writes each request's tokens into
shared-memory rings keyed by request slot; any number of worker processes submit tokenized
requests and read their streams straight from shared memory.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tsfront.client.engine_client import ClientListener, EngineClient
    from tsfront.client.info import EngineInfo, EngineLoad
    from tsfront.client.stream import OutputChunk, RequestStream
    from tsfront.config import ClientConfig, EngineGroup, LoadBalance, Routing
    from tsfront.errors import (
        Busy,
        ClientClosed,
        ConfigError,
        DeadlineExceeded,
        DuplicateRequest,
        EngineDied,
        EngineStalled,
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
    from tsfront.process.ioproc import IOProcess

# Each public name's module, imported on first use (PEP 562): ``import tsfront`` (and so
# every ``tsfront`` command before it parses its line) stays light, and a Ctrl-C while a
# command starts lands in the command's own handler, not in the middle of an import.
_WHERE = {
    "Busy": "tsfront.errors",
    "ClientClosed": "tsfront.errors",
    "ClientConfig": "tsfront.config",
    "ClientListener": "tsfront.client.engine_client",
    "ConfigError": "tsfront.errors",
    "DeadlineExceeded": "tsfront.errors",
    "DuplicateRequest": "tsfront.errors",
    "EngineClient": "tsfront.client.engine_client",
    "EngineDied": "tsfront.errors",
    "EngineGroup": "tsfront.config",
    "EngineInfo": "tsfront.client.info",
    "EngineLoad": "tsfront.client.info",
    "EngineStalled": "tsfront.errors",
    "EngineUnavailable": "tsfront.errors",
    "Error": "tsfront.errors",
    "HandshakeError": "tsfront.errors",
    "HandshakeTimeout": "tsfront.errors",
    "IOProcess": "tsfront.process.ioproc",
    "IOProcessDied": "tsfront.errors",
    "InvalidRequest": "tsfront.errors",
    "LoadBalance": "tsfront.config",
    "OutputChunk": "tsfront.client.stream",
    "PrefillFailed": "tsfront.errors",
    "PromptTooLong": "tsfront.errors",
    "RequestStream": "tsfront.client.stream",
    "RidRecentlyAborted": "tsfront.errors",
    "Routing": "tsfront.config",
    "SendTimeout": "tsfront.errors",
    "StateDirInUse": "tsfront.errors",
    "StateDirMismatch": "tsfront.errors",
    "StopStringsRefused": "tsfront.errors",
    "StreamError": "tsfront.errors",
    "StreamRejected": "tsfront.errors",
    "WireDecodeError": "tsfront.errors",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tsfront' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
    "EngineStalled",
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
