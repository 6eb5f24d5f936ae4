"""``/v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API over the chat
path.

A Messages request becomes the core's chat request (`chat_of`), planned and run as chat
completions are (`Service.chat_request`: the same limits, template, grammar, parsers,
detokenizer and stop logic), and `tsfront.serve.anthropic.blocks.MessagesFormat` writes the
answer as Anthropic's content blocks, whole or streamed:

==================================  ===========================================================
Messages                            chat request
==================================  ===========================================================
``system`` (a string or text        a first ``system`` message (blocks joined by newlines)
blocks)
a ``user`` message's ``text``       a ``user`` message (blocks joined by newlines)
a ``tool_result`` block             a ``role: "tool"`` message with ``tool_call_id`` (its text,
                                    or its text blocks joined; ``is_error``: ``Error: `` first)
an ``assistant`` message            an assistant message: ``text`` its content, ``tool_use``
                                    its ``tool_calls`` (``input`` as the arguments' JSON),
                                    ``thinking`` its ``reasoning_content`` (the signature must
                                    be this server's for the request's key)
``tools`` (``input_schema``)        function tools (``parameters``)
``tool_choice`` ``auto``, ``any``,  ``auto``, ``required``, the named function, ``none``;
``tool``, ``none``                  ``disable_parallel_tool_use``: ``parallel_tool_calls: false``
``max_tokens`` (required),          ``max_tokens``, ``stop``, ``temperature``, ``top_p``,
``stop_sequences``, ``temperature``,  ``top_k``
``top_p``, ``top_k``
``thinking`` ``enabled``,           ``chat_template_kwargs`` ``{"enable_thinking": true,
``adaptive`` / ``disabled``         "thinking": true}`` / both ``false`` (absent: the
                                    template's default); ``budget_tokens`` is advisory
``output_config.format``            ``response_format`` ``json_schema``
==================================  ===========================================================

Refused with an ``invalid_request_error`` naming the field (this server cannot serve them):
image, document, search-result and redacted-thinking blocks and every server-side block, server
tools (any ``tools[i].type`` but ``custom``), ``container``, ``mcp_servers``,
``context_management``, a last message from the assistant (prefill), a thinking block whose
signature is not this server's for the key. Ignored, as advisory: ``cache_control`` anywhere
(prompt caching is the engine's own, by prefix), ``metadata.user_id`` (checked, not kept),
``service_tier``, ``output_config.effort``, ``thinking.budget_tokens`` and ``display``,
citations on text blocks, the ``anthropic-version`` and ``anthropic-beta`` headers. Errors are
Anthropic's shape (`anthropic_error`): ``{"type": "error", "error": {"type", "message"}}``,
the type by status (``invalid_request_error`` 400, ``authentication_error`` 401,
``not_found_error`` 404, ``request_too_large`` 413, ``api_error`` 500/502,
``overloaded_error`` 529 for what OpenAI's routes answer 503, ``timeout_error`` 504); the
routing gives the edge's own errors on these paths the same shape.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.serve.anthropic.blocks import THINKING, MessagesFormat, error_type
from tsfront.serve.core.limits import Refused, check_json, decoded
from tsfront.serve.core.record import SHARED_OWNER
from tsfront.serve.core.reply import (
    CUT_MESSAGE,
    JSON_HEADERS,
    RETRY_AFTER_S,
    ApiError,
    Reply,
    SSEReply,
)
from tsfront.serve.core.schema import ChatRequest

if TYPE_CHECKING:
    from tsfront.serve.core.record import RequestRecord
    from tsfront.serve.core.service import Plan, Service

__all__ = [
    "CountTokensRequest",
    "Messages",
    "MessagesRequest",
    "anthropic_error",
    "chat_of",
]

_JSON = msgspec.json.Encoder()
#: The longest ``metadata.user_id`` taken (Anthropic's limit).
MAX_USER_ID = 256
# Block types of Anthropic's that this server cannot serve, and why.
_UNSERVED = {
    "image": "images are not supported (a text-only server)",
    "document": "documents are not supported (a text-only server)",
    "search_result": "search results are not supported",
    "redacted_thinking": "redacted thinking is not supported (this server never makes it)",
    "container_upload": "containers are not supported",
}
# Chat's names for what a refusal names, in the Messages API's terms.
_PARAMS = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "response_format": "output_config.format",
    "chat_template_kwargs": "thinking",
}


class _Conversation(msgspec.Struct, kw_only=True):
    """What both routes read: the model, the conversation and its tools."""

    model: str
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: Any = None
    output_config: Any = None
    output_format: Any = None
    # Server-side features: refused when given.
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None


class MessagesRequest(_Conversation, kw_only=True):
    """``POST /v1/messages``: the fields the server reads (others are ignored)."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Any = None


class CountTokensRequest(_Conversation, kw_only=True):
    """``POST /v1/messages/count_tokens``."""


_REQUEST = msgspec.json.Decoder(MessagesRequest)
_COUNT = msgspec.json.Decoder(CountTokensRequest)


def anthropic_error(err: ApiError) -> Reply:
    """``err`` in Anthropic's error shape: a 503 is ``overloaded_error`` with status 529 (and
    ``Retry-After``); the field a refusal names leads its message (Anthropic's errors have no
    ``param``)."""
    status = 529 if err.status == 503 else err.status
    message = str(err)
    if err.param and err.param not in message:
        message = f"{err.param}: {message}"
    body = _JSON.encode(
        {"type": "error", "error": {"type": error_type(status), "message": message}}
    )
    headers = JSON_HEADERS
    if status == 529:
        headers = [*JSON_HEADERS, (b"retry-after", str(RETRY_AFTER_S).encode())]
    return Reply(status, body, headers, err)


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _rename(exc: ApiError | Refused) -> ApiError:
    """A refusal of the core's in the Messages API's names."""
    param = _PARAMS.get(exc.param or "", exc.param)
    message = str(exc)
    for chat_name in ("max_completion_tokens", "response_format", "chat_template_kwargs"):
        message = message.replace(chat_name, _PARAMS[chat_name])
    if isinstance(exc, Refused):
        return _bad(message, param)
    return ApiError(exc.status, message, kind=exc.kind, param=param, code=exc.code)


def _owner(record: RequestRecord | None) -> str:
    return SHARED_OWNER if record is None else record.owner


def _block_text(block: Any, where: str) -> str:
    """The text of a ``text`` block (its ``cache_control`` and citations ignored)."""
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text must be a string", "messages")
    return text


def _refuse_block(kind: Any, where: str, param: str) -> ApiError:
    why = _UNSERVED.get(kind) if isinstance(kind, str) else None
    if why is None:
        why = f"a block of type {kind!r} is not supported here"
    return _bad(f"{where}: {why}", param)


def _system(system: str | list[Any] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for i, block in enumerate(system):
        where = f"system[{i}]"
        if not isinstance(block, dict):
            raise _bad(f"{where} must be an object", "system")
        if block.get("type") != "text":
            raise _bad(f"{where}: only text blocks are supported in system", "system")
        texts.append(_block_text(block, where))
    return "\n".join(texts) or None


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks", "messages")
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise _bad(f"{where}.content[{j}] must be an object", "messages")
    return content


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call = block.get("tool_use_id")
    if not isinstance(call, str) or not call:
        raise _bad(f"{where}.tool_use_id must be a non-empty string", "messages")
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            inner = f"{where}.content[{k}]"
            if not isinstance(part, dict):
                raise _bad(f"{inner} must be an object", "messages")
            if part.get("type") != "text":
                raise _refuse_block(part.get("type"), inner, "messages")
            parts.append(_block_text(part, inner))
        text = "\n".join(parts)
    else:
        raise _bad(f"{where}.content must be a string or a list of text blocks", "messages")
    if block.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call, "content": text}


def _user(blocks: list[dict[str, Any]], where: str, out: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        at = f"{where}.content[{j}]"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "tool_result":
            if texts:  # the text before it, in its place
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, at))
        else:
            raise _refuse_block(kind, at, "messages")
    if texts or not blocks:
        out.append({"role": "user", "content": "\n".join(texts)})


def _assistant(
    blocks: list[dict[str, Any]], where: str, check: Any, out: list[dict[str, Any]]
) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        at = f"{where}.content[{j}]"
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "tool_use":
            call, name, given = block.get("id"), block.get("name"), block.get("input")
            if not (isinstance(call, str) and call and isinstance(name, str) and name):
                raise _bad(f"{at}: a tool_use block needs its id and name (strings)", "messages")
            if not isinstance(given, dict):
                raise _bad(f"{at}.input must be an object", "messages")
            check_json(given, "messages", f"{at}.input")  # before json.dumps recurses into it
            arguments = json.dumps(given, ensure_ascii=False)
            calls.append(
                {"id": call, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "thinking":
            thought, signature = block.get("thinking"), block.get("signature")
            if not isinstance(thought, str) or not isinstance(signature, str):
                raise _bad(f"{at}: a thinking block needs thinking and signature", "messages")
            if not check(thought, signature):
                raise _bad(
                    f"{at}.signature is not this server's for this API key: send thinking "
                    "blocks back exactly as this server returned them, or leave them out (a "
                    "server restarted without TSFRONT_REASONING_KEY no longer knows its "
                    "earlier signatures)",
                    "messages",
                )
            thoughts.append(thought)
        else:
            raise _refuse_block(kind, at, "messages")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
        message["content"] = message["content"] or None
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    out.append(message)


def _messages(req: _Conversation, check: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = _system(req.system)
    if system is not None:
        out.append({"role": "system", "content": system})
    if not req.messages:
        raise _bad("messages must hold at least one message", "messages")
    for i, given in enumerate(req.messages):
        where = f"messages[{i}]"
        if not isinstance(given, dict):
            raise _bad(f"{where} must be an object", "messages")
        role = given.get("role")
        blocks = _blocks(given.get("content", ""), where)
        if role == "user":
            _user(blocks, where, out)
        elif role == "assistant":
            _assistant(blocks, where, check, out)
        elif role == "system":
            texts = [_block_text(b, f"{where}.content[{j}]") for j, b in enumerate(blocks)]
            out.append({"role": "system", "content": "\n".join(texts)})
        else:
            raise _bad(f"{where}.role {role!r}: send user or assistant", "messages")
    if req.messages[-1].get("role") == "assistant":
        raise _bad(
            "the last message is the assistant's: continuing it (prefill) is not supported; "
            "end with a user message",
            "messages",
        )
    return out


def _tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    check_json(tools, "tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(f"{where} must be an object", "tools")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _bad(
                f"{where} is a server tool of Anthropic's ({kind!r}) that this server does not "
                "run; only client tools ({name, description, input_schema}) are supported",
                "tools",
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.name must be a non-empty string", "tools")
        if not isinstance(schema, dict):
            raise _bad(f"{where}.input_schema must be a JSON schema (an object)", "tools")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> tuple[Any, bool]:
    """``tool_choice`` as chat's, and ``parallel_tool_calls``."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict):
        raise _bad('tool_choice must be an object, e.g. {"type": "auto"}', "tool_choice")
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use") is not True
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise _bad('tool_choice of type "tool" needs the tool\'s name', "tool_choice")
        return {"type": "function", "function": {"name": name}}, parallel
    raise _bad(f"tool_choice type {kind!r}: send auto, any, tool or none", "tool_choice")


def _thinking(thinking: Any) -> dict[str, Any] | None:
    """``thinking`` as the template's reasoning switch (None: the template's default)."""
    if thinking is None:
        return None
    if not isinstance(thinking, dict):
        raise _bad('thinking must be an object, e.g. {"type": "disabled"}', "thinking")
    kind = thinking.get("type")
    if kind in ("enabled", "adaptive"):
        budget = thinking.get("budget_tokens")
        if budget is not None and (type(budget) is not int or budget < 1):
            raise _bad("thinking.budget_tokens must be a positive integer", "thinking")
        return {"enable_thinking": True, "thinking": True}
    if kind == "disabled":
        return {"enable_thinking": False, "thinking": False}
    raise _bad(f"thinking type {kind!r}: send enabled, adaptive or disabled", "thinking")


def _output_format(req: _Conversation) -> Any:
    config = req.output_config
    given = req.output_format
    param = "output_format"
    if config is not None:
        if not isinstance(config, dict):
            raise _bad("output_config must be an object", "output_config")
        if config.get("format") is not None:
            given, param = config["format"], "output_config.format"
    if given is None:
        return None
    if not isinstance(given, dict) or given.get("type") != "json_schema":
        raise _bad(f'{param}: send {{"type": "json_schema", "schema": {{...}}}}', param)
    if not isinstance(given.get("schema"), dict):
        raise _bad(f"{param}.schema must be a JSON schema (an object)", param)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": given["schema"]}}


def _refusals(req: _Conversation) -> None:
    for name in ("container", "mcp_servers", "context_management"):
        if getattr(req, name) is not None:
            raise _bad(f"{name} is not supported: this server runs no server-side tools", name)


def _metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
        raise _bad('metadata takes only {"user_id": STRING}', "metadata")
    user = metadata.get("user_id")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_USER_ID):
        raise _bad(
            f"metadata.user_id must be a string of at most {MAX_USER_ID} characters", "metadata"
        )


def chat_of(req: _Conversation, check: Any) -> ChatRequest:
    """The chat request a Messages request plans as (``check(thinking, signature)``: whether a
    thinking block sent back is this server's for the request's key)."""
    _refusals(req)
    messages = _messages(req, check)
    tool_choice, parallel = _tool_choice(req.tool_choice)
    chat = ChatRequest(
        model=req.model,
        messages=messages,
        tools=_tools(req.tools),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=_output_format(req),
        chat_template_kwargs=_thinking(req.thinking),
    )
    if isinstance(req, MessagesRequest):
        _metadata(req.metadata)
        if req.max_tokens < 1:
            raise _bad(f"max_tokens={req.max_tokens}: must be at least 1", "max_tokens")
        chat.max_tokens = req.max_tokens
        chat.stop = req.stop_sequences or None
        chat.temperature = req.temperature
        chat.top_p = req.top_p
        chat.top_k = req.top_k
        chat.stream = req.stream
    return chat


class Messages:
    """The ``/v1/messages`` routes of one worker over its core `Service`."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def _check(self, owner: str) -> Any:
        seal = self.service.seal

        def check(thought: str, signature: str) -> bool:
            return seal.check(THINKING, owner, thought, signature)

        return check

    async def create(self, body: bytes, record: RequestRecord | None = None) -> Reply | SSEReply:
        """``POST /v1/messages``."""
        try:
            req = decoded(_REQUEST, body)
        except Refused as exc:  # as it is: the body's own field names
            return anthropic_error(_bad(str(exc)))
        service = self.service
        owner = _owner(record)
        shape: list[MessagesFormat] = []

        def format_of(plan: Plan) -> MessagesFormat:
            fmt = MessagesFormat(
                service.model_name, service.text, len(plan.prompts[0]), service.seal, owner
            )
            shape.append(fmt)
            return fmt

        try:
            chat = chat_of(req, self._check(owner))
            reply = await service.chat_request(chat, len(body), format_of, record)
        except (ApiError, Refused) as exc:
            return anthropic_error(_rename(exc))
        if type(reply) is SSEReply:
            fmt = shape[0]

            def cut() -> bytes:  # a stopping server's last event (`ServeApp.cut`)
                return fmt.error_event(Exception(CUT_MESSAGE), 503, "service_unavailable_error")

            reply.cut = cut
        return reply

    async def count_tokens(self, body: bytes, record: RequestRecord | None = None) -> Reply:
        """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the prompt's tokens as
        ``/v1/messages`` would render them."""
        try:
            req = decoded(_COUNT, body)
        except Refused as exc:
            return anthropic_error(_bad(str(exc)))
        try:
            chat = chat_of(req, self._check(_owner(record)))
            ids = await self.service.prompt_ids(chat, len(body))
        except (ApiError, Refused) as exc:
            return anthropic_error(_rename(exc))
        return Reply(200, _JSON.encode({"input_tokens": len(ids)}))
