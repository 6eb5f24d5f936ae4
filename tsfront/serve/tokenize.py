"""``POST /v1/tokenize`` and ``POST /v1/detokenize``, as vLLM serves them (`Tokenize`).

``/v1/tokenize`` takes a ``prompt`` (text, encoded with the special tokens unless
``add_special_tokens`` is false) or chat ``messages`` (rendered by the chat template as
``/v1/chat/completions`` renders them, ``tools`` included; no special tokens added by
default, the template writes them) and answers ``{"tokens", "count", "max_model_len"}`` (and
``token_strs`` with ``return_token_strs``). ``/v1/detokenize`` takes ``tokens`` and answers
``{"prompt"}``: their text, special tokens kept. The routes are also served without the
``/v1`` prefix, where vLLM serves them. The bounds are chat's and the encode (and render)
is sized by its text, as chat's (`tsfront.serve.core.offload`): both through the core's
`Service`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.serve.core.limits import Refused, decoded
from tsfront.serve.core.reply import ApiError, Reply
from tsfront.serve.core.tooling import tool_plan

if TYPE_CHECKING:
    from tsfront.serve.core.service import Service

__all__ = ["DetokenizeRequest", "Tokenize", "TokenizeRequest"]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/tokenize``: ``prompt``, or ``messages`` (with ``tools``)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/detokenize``: token ids back to text."""

    tokens: list[int]
    model: str | None = None


_TOKENIZE = msgspec.json.Decoder(TokenizeRequest)
_DETOKENIZE = msgspec.json.Decoder(DetokenizeRequest)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


class Tokenize:
    """The tokenize routes of one worker over its core `Service`."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def tokenize(self, body: bytes) -> Reply:
        """``POST /v1/tokenize`` (and ``/tokenize``), as vLLM serves it: a ``prompt``, or chat
        ``messages`` (with ``tools``) rendered as chat renders them → ``tokens``, ``count``,
        ``max_model_len``. The bounds of chat first; the encode (and render) is sized by its
        text, as chat's (`tsfront.serve.core.offload`)."""
        service = self.service
        try:
            req = decoded(_TOKENIZE, body)
            service.check_model(req.model)
            if (req.prompt is None) == (req.messages is None):
                raise _bad('send either "prompt" (text) or "messages" (chat)', "prompt")
            limit = service.context_limit()
            if req.prompt is not None:
                service.check_chars(len(req.prompt), limit, "prompt")
                special = True if req.add_special_tokens is None else req.add_special_tokens
                size = len(req.prompt)
                work: tuple[Any, ...] = (service.encoded, req.prompt, special)
            else:
                assert req.messages is not None
                if not req.messages:
                    raise _bad("messages must not be empty", "messages")
                plan = tool_plan(req.tools, "none" if req.tools else None, True, None)
                messages = service.messages_of(req.messages, limit)
                kwargs = service.template_kwargs_of(req.chat_template_kwargs)
                tools = plan.tools if plan is not None else None
                size = len(body) + service.defaults_chars
                add = req.add_generation_prompt
                work = (service.rendered_ids, messages, add, kwargs, tools)
            answer = await service.off_loop(
                size, self._tokenized, limit, req.return_token_strs, *work
            )
        except Refused as exc:
            return _bad(str(exc), exc.param).reply()
        except ApiError as exc:
            return exc.reply()
        return Reply(200, answer)

    def _tokenized(
        self, limit: int | None, strs: bool, encode: Callable[..., list[int]], *args: Any
    ) -> bytes:
        # The whole of /v1/tokenize's work, reply included (on a thread when it is large).
        ids = encode(*args)
        out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": limit}
        if strs:
            out["token_strs"] = [self.service.text.token_text(t) for t in ids]
        return msgspec.json.encode(out)

    async def detokenize(self, body: bytes) -> Reply:
        """``POST /v1/detokenize`` (and ``/detokenize``): ``tokens`` → ``prompt``, the text
        (special tokens kept). At most the context's worth of tokens (what a model reads or
        writes); the decode is sized by the text they can make (`tsfront.serve.core.offload`)."""
        service = self.service
        try:
            req = decoded(_DETOKENIZE, body)
            service.check_model(req.model)
        except Refused as exc:
            return _bad(str(exc), exc.param).reply()
        except ApiError as exc:
            return exc.reply()
        tokens = req.tokens
        limit = service.context_limit()
        if limit is not None and len(tokens) > limit:
            return _bad(
                f"tokens holds {len(tokens)} token ids: at most {limit}: {service.context(limit)}, "
                "which holds any text the model reads or writes; detokenize a longer list in parts",
                "tokens",
            ).reply()
        vocab = service.vocab
        if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
            bad = next(t for t in tokens if not 0 <= t < vocab)
            return _bad(
                f"tokens holds {bad}: token ids of this model are 0..{vocab - 1}", "tokens"
            ).reply()
        answer = await service.off_loop(
            len(tokens) * service.token_chars, self._detokenized, tokens
        )
        return Reply(200, answer)

    def _detokenized(self, tokens: list[int]) -> bytes:
        # The decode and the reply's encode (the tokenizer's decode releases the GIL).
        return msgspec.json.encode(
            {"prompt": self.service.text.decode(tokens, skip_special_tokens=False)}
        )
