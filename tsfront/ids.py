"""The ids a client is shown and may name back: made here, every one from `secrets`.

A request's id (``X-Request-Id`` when the client sent none) is in every reply, every error
body and the engine's rid: a counter there would tell one client how many requests the others
made. A response's id (``chatcmpl-…``, ``cmpl-…``, ``resp_…``) names a stored object a client may
fetch, continue or delete; an output item's (``msg_…``, ``rs_…``, ``fc_…``) and a tool call's
(``call_…``) are sent back in later requests. None may follow from the ids a client has seen:
each is drawn from the operating system's generator (`secrets`), never from `random`, whose
Mersenne Twister gives its next outputs away after 624 words of its past ones (the ids of
~208 one-token completions were enough to find another client's next stored response).

A leaf: imports nothing of tsfront, so the text layer's tool parsers and the server both make
their ids here. The cost is one ``getrandom`` call per id (about 0.5 µs for a response id
against 0.14 µs from `random`; a call id about 3 µs: docs/SERVE.md).
"""

from __future__ import annotations

import secrets

__all__ = ["call_id", "item_id", "request_id", "response_id"]

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def request_id() -> str:
    """24 hex digits (96 bits): the id of a request whose client sent no ``X-Request-Id``."""
    return secrets.token_hex(12)


def response_id(prefix: str) -> str:
    """``prefix`` + 24 hex digits (96 bits): a completion's or a response's id."""
    return prefix + secrets.token_hex(12)


def item_id(prefix: str) -> str:
    """``prefix`` + ``_`` + 32 hex digits (128 bits): a Responses output item's id."""
    return f"{prefix}_{secrets.token_hex(16)}"


def call_id(length: int = 24, prefix: str = "call_") -> str:
    """``prefix`` + ``length`` letters and digits, uniform (``call_`` + 24, as OpenAI's; a
    Mistral call's is 9 of them and no prefix)."""
    n = secrets.randbelow(62**length)
    digits = []
    for _ in range(length):
        n, d = divmod(n, 62)
        digits.append(_ALNUM[d])
    return prefix + "".join(digits)
