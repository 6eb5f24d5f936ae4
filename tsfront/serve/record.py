"""What one HTTP request did, for its access-log line: filled by the service, read at its end.

`OpenAIService` gets a `RequestRecord` with the request's id (which it puts in the engine rids),
stamps the time of the first output, and leaves a ``summary`` to call once the response is
over; nothing is written per token. The HTTP edge (`tsfront.serve.gate`) makes the record and
reads it when the request ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RequestRecord", "Summary"]

#: ``(prompt_tokens, completion_tokens, finish_reason)`` of a finished response.
Summary = tuple[int, int, "str | None"]


class RequestRecord:
    """One request's id, start, first-output time and (once it is over) token counts."""

    __slots__ = ("first_output", "request_id", "started", "summary")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.started = time.monotonic()
        #: ``time.monotonic()`` of the request's first output, if any came.
        self.first_output: float | None = None
        #: Set by the service once its engine requests are made: the response's counts.
        self.summary: Callable[[], Summary] | None = None

    def output_began(self) -> None:
        """Stamp the first output (the service calls it once)."""
        if self.first_output is None:
            self.first_output = time.monotonic()
