"""The server's seal on reasoning handed to clients (tsfront/serve/core/seal.py): a tag or a
sealed text verifies only for the secret, owner and purpose it was made for, and only
unaltered."""

from __future__ import annotations

import pytest

from tsfront.serve.core.seal import ENV_KEY, Seal, secret_from_env

SECRET = bytes(range(32))
OTHER = bytes(range(1, 33))


def test_a_tag_verifies_for_its_owner_purpose_and_text_only() -> None:
    seal = Seal(SECRET)
    tag = seal.tag("anthropic.thinking", "owner-a", "I thought so.")
    assert len(tag) == 43  # 32 bytes, base64url without padding
    assert seal.check("anthropic.thinking", "owner-a", "I thought so.", tag)
    assert not seal.check("anthropic.thinking", "owner-b", "I thought so.", tag)
    assert not seal.check("responses.reasoning", "owner-a", "I thought so.", tag)
    assert not seal.check("anthropic.thinking", "owner-a", "I thought so!", tag)
    assert not Seal(OTHER).check("anthropic.thinking", "owner-a", "I thought so.", tag)
    assert not seal.check("anthropic.thinking", "owner-a", "I thought so.", tag[:-1] + "A")
    assert not seal.check("anthropic.thinking", "owner-a", "I thought so.", "")


def test_a_sealed_text_opens_unaltered_only() -> None:
    seal = Seal(SECRET)
    text = "Step 1: \u00fcber; step 2: \U0001f600."
    sealed = seal.seal("responses.reasoning", "owner-a", text)
    assert sealed.startswith("ts1.")
    assert seal.open("responses.reasoning", "owner-a", sealed) == text
    assert seal.open("responses.reasoning", "owner-b", sealed) is None
    assert seal.open("anthropic.thinking", "owner-a", sealed) is None
    assert Seal(OTHER).open("responses.reasoning", "owner-a", sealed) is None
    # Any change of a character of the body is refused.
    body = sealed[4:]
    for i in (0, len(body) // 2, len(body) - 1):
        flipped = body[:i] + ("A" if body[i] != "A" else "B") + body[i + 1 :]
        assert seal.open("responses.reasoning", "owner-a", "ts1." + flipped) is None
    for junk in ("", "ts1.", "ts1.!!!", "ts2." + body, body, "ts1.AAAA"):
        assert seal.open("responses.reasoning", "owner-a", junk) is None


def test_the_owner_cannot_be_shifted_into_the_text() -> None:
    # The fields are led by their lengths: ("a", "\0b") is not ("a\0", "b").
    seal = Seal(SECRET)
    tag = seal.tag("p", "a", "\0b")
    assert not seal.check("p", "a\0", "b", tag)


def test_the_secret_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_KEY, raising=False)
    a, b = secret_from_env(), secret_from_env()
    assert len(a) == 32 and a != b  # fresh each time without the variable
    monkeypatch.setenv(ENV_KEY, SECRET.hex())
    assert secret_from_env() == SECRET
    for bad in ("abc", "zz" * 32, "00" * 31):
        monkeypatch.setenv(ENV_KEY, bad)
        with pytest.raises(ValueError, match=ENV_KEY):
            secret_from_env()
