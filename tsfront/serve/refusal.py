"""`Refused`: a request the server answers with a 400 naming a field."""

from __future__ import annotations

__all__ = ["Refused"]


class Refused(Exception):
    """A request field the server cannot take: answered 400 with ``param``."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param
