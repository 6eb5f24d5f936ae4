"""The worker side of the engine connection: what a process that submits requests and reads
their streams runs (a `tsfront serve` worker, an embedded server, a test).

* `tsfront.client.engine_client`: `EngineClient` (attach or connect, `generate`, load and
  metrics);
* `tsfront.client.attachment`: one worker's sockets, its mapping of the shared region and the
  drain that hands each slot update to its stream;
* `tsfront.client.slots`: slot lifetime (free list, open streams, deadlines, abort batches);
* `tsfront.client.stream`: `RequestStream`, the consumer side of one request;
* `tsfront.client.info`: `EngineInfo` and `EngineLoad`, the engine table as a worker reads it.

It imports nothing of the I/O process (`tsfront.io`): the two sides meet in `tsfront.ipc`.
"""

from tsfront.client.engine_client import ClientListener, EngineClient

__all__ = ["ClientListener", "EngineClient"]
