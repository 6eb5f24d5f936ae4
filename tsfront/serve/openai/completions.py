"""The OpenAI dialect's routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` and ``GET /v1/models/{id}``.

`OpenAIService` is the core's `Service` with OpenAI's routes: a chat or completions body is
decoded into the core's request form (`tsfront.serve.core.schema`), planned and run by the core
(`Service.generate`), and its output shaped by `tsfront.serve.openai.formats`. The other
dialects take the same `Service` (``/v1/responses``, ``/v1/messages``, the tokenize routes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.serve.core.reply import JSON_HEADERS, Reply, SSEReply
from tsfront.serve.core.schema import ChatRequest, CompletionRequest
from tsfront.serve.core.service import Plan, Service
from tsfront.serve.openai.formats import ChatFormat, CompletionFormat

if TYPE_CHECKING:
    from tsfront.serve.core.record import RequestRecord
    from tsfront.serve.core.shape import Format

__all__ = ["OpenAIService"]

_JSON = msgspec.json.Encoder()
_COMPLETION = msgspec.json.Decoder(CompletionRequest)
_CHAT = msgspec.json.Decoder(ChatRequest)


class OpenAIService(Service):
    """One worker's core (`Service`, whose arguments it takes) with OpenAI's routes."""

    def models(self) -> Reply:
        """``GET /v1/models``."""
        return Reply(200, _JSON.encode({"object": "list", "data": [self._card()]}))

    def model(self, model_id: str) -> Reply:
        """``GET /v1/models/{id}``: the served model's card, or OpenAI's 404 for another id."""
        if model_id != self.model_name:
            body = {
                "message": f"The model {model_id!r} does not exist; this server serves "
                f"{self.model_name!r} (GET /v1/models)",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            return Reply(404, _JSON.encode({"error": body}), JSON_HEADERS)
        return Reply(200, _JSON.encode(self._card()), JSON_HEADERS)

    def _card(self) -> dict[str, Any]:
        card: dict[str, Any] = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "tsfront",
        }
        limit = self.context_limit()
        if limit:
            card["max_model_len"] = limit
        return card

    async def completions(
        self, body: bytes, record: RequestRecord | None = None
    ) -> Reply | SSEReply:
        """``POST /v1/completions`` (``record``: the request's id, filled with its outcome)."""
        return await self.generate(
            body, _COMPLETION, self.plan_completion, self._completion_format, record
        )

    async def chat(self, body: bytes, record: RequestRecord | None = None) -> Reply | SSEReply:
        """``POST /v1/chat/completions`` (``record`` as for `completions`)."""
        return await self.generate(body, _CHAT, self.plan_chat, self._chat_format, record)

    def _completion_format(self, plan: Plan) -> Format:
        return CompletionFormat(self.model_name, self.text, len(plan.prompts), plan.include_usage)

    def _chat_format(self, plan: Plan) -> Format:
        return ChatFormat(self.model_name, self.text, len(plan.prompts), plan.include_usage)
