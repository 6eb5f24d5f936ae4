"""The server's seal on reasoning it hands a client to send back: an HMAC-SHA256 tag.

Two dialects give a client the model's reasoning to send back in a later request: Anthropic's
``thinking`` blocks carry a ``signature``, and the Responses API's reasoning items an
``encrypted_content`` (``include: ["reasoning.encrypted_content"]``, for ``store: false``).
Both are made here, with one secret per server (`Seal`):

* ``tag(purpose, owner, text)``: HMAC-SHA256(secret, the purpose and the owner, each led by
  its length, then the text), base64url (43 characters). A thinking block's ``signature`` is
  the tag of its ``thinking`` text.
* ``seal(purpose, owner, text)``: ``"ts1."`` + base64url(tag bytes + the text's UTF-8): the
  text itself, sealed (a Responses reasoning item's ``encrypted_content``). ``open`` gives
  the text back only if the tag verifies.

The text is not secret: the same response shows it (a thinking block's text, a reasoning
item's ``content``). What the seal gives is that nothing but this server made it, for this
owner (the handle of the API key, `RequestRecord.owner`) and this purpose: a client cannot
forge or alter one, nor replay one another key was given, so what comes back as the model's
own reasoning is what the model wrote for that key. A seal that does not verify is refused
(400, naming the field), as Anthropic's and OpenAI's servers refuse a modified one.

The secret is `secrets.token_bytes` (32 bytes) made by ``tsfront serve``'s master and given to
every worker, so any worker verifies what another sealed; it lasts as long as the server.
``TSFRONT_REASONING_KEY`` (64 hex digits or more) sets it instead, so that seals outlive a
restart and are shared by several servers (`secret_from_env`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets

__all__ = ["ENV_KEY", "Seal", "secret_from_env"]

#: The environment variable that sets the server's secret (hex), when given.
ENV_KEY = "TSFRONT_REASONING_KEY"
_TAG_BYTES = 32
_PREFIX = "ts1."


def secret_from_env() -> bytes:
    """``TSFRONT_REASONING_KEY``'s bytes, or 32 fresh ones from `secrets` when it is not set;
    a value that is not at least 64 hex digits is a ``ValueError`` saying so."""
    given = os.environ.get(ENV_KEY)
    if not given:
        return secrets.token_bytes(32)
    try:
        key = bytes.fromhex(given.strip())
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ValueError(
            f"{ENV_KEY} must be at least 64 hex digits (32 bytes), e.g. the output of "
            "python3 -c 'import secrets; print(secrets.token_hex(32))'"
        )
    return key


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


class Seal:
    """Tags and seals of one server's secret."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a seal's secret has at least 16 bytes")
        self._key = secret

    def _mac(self, purpose: str, owner: str, data: bytes) -> bytes:
        # Each field led by its length: no owner and text can pass for another pair.
        head = f"{len(purpose)}:{purpose}{len(owner)}:{owner}".encode()
        return hmac.new(self._key, head + data, hashlib.sha256).digest()

    def tag(self, purpose: str, owner: str, text: str) -> str:
        """The tag of ``text`` for ``owner`` and ``purpose``."""
        return _b64(self._mac(purpose, owner, text.encode("utf-8", "surrogatepass")))

    def check(self, purpose: str, owner: str, text: str, tag: str) -> bool:
        """Whether ``tag`` is `tag` of ``text`` (compared in constant time)."""
        return hmac.compare_digest(self.tag(purpose, owner, text), tag)

    def seal(self, purpose: str, owner: str, text: str) -> str:
        """``text`` with its tag, as one opaque string."""
        data = text.encode("utf-8", "surrogatepass")
        return _PREFIX + _b64(self._mac(purpose, owner, data) + data)

    def open(self, purpose: str, owner: str, sealed: str) -> str | None:
        """The text `seal` sealed, or None if ``sealed`` is not one of this server's for
        ``owner`` and ``purpose`` (made elsewhere, altered, or not a seal)."""
        if not sealed.startswith(_PREFIX):
            return None
        raw = _unb64(sealed[len(_PREFIX) :])
        if raw is None or len(raw) < _TAG_BYTES:
            return None
        mac, data = raw[:_TAG_BYTES], raw[_TAG_BYTES:]
        if not hmac.compare_digest(mac, self._mac(purpose, owner, data)):
            return None
        try:
            return data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            return None
