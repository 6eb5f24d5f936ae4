"""What one HTTP request did, for its access-log line: filled by the service, read at its end.

`OpenAIService` gets a `RequestRecord` with the request's id (which it puts in the engine rids)
and its owner (whose stored objects it may see: `tsfront.serve.processes.store`), stamps the time of
the first output, and leaves a ``summary`` to call once the response is over; nothing is written
per token. The HTTP edge (`tsfront.serve.edge.gate`) makes the record, sets the owner from the API
key it checked, and reads the record when the request ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SHARED_OWNER", "RequestRecord", "Summary"]

#: The owner of every request of a server without API keys (and of an app without a gate):
#: they all share one store. Never equal to a key's handle (hex digits).
SHARED_OWNER = "shared"

#: ``(prompt_tokens, completion_tokens, finish_reason)`` of a finished response.
Summary = tuple[int, int, "str | None"]


class RequestRecord:
    """One request's id, owner, start, first-output time and (once it is over) token counts."""

    __slots__ = ("first_output", "owner", "request_id", "started", "summary")

    def __init__(self, request_id: str, owner: str = SHARED_OWNER) -> None:
        self.request_id = request_id
        #: The handle of the API key the request came with (`SHARED_OWNER` without keys).
        self.owner = owner
        self.started = time.monotonic()
        #: ``time.monotonic()`` of the request's first output, if any came.
        self.first_output: float | None = None
        #: Set by the service once its engine requests are made: the response's counts.
        self.summary: Callable[[], Summary] | None = None

    def output_began(self) -> None:
        """Stamp the first output (the service calls it once)."""
        if self.first_output is None:
            self.first_output = time.monotonic()
