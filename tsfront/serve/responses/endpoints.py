"""``/v1/responses``: OpenAI's Responses API over the chat path.

A Responses request becomes a chat request (`ResponsesRequest` → `ChatRequest`): its
``instructions`` a system message, its ``input`` items messages (``message`` → a user,
assistant or system message of its text parts; ``function_call`` → an assistant message's
``tool_calls``; ``function_call_output`` → a ``role: "tool"`` message with ``tool_call_id``;
``reasoning`` → the next assistant message's ``reasoning_content``), after the conversation of
``previous_response_id`` from the store; its flat function ``tools`` chat's ``{"type":
"function", "function": {…}}``; ``text.format`` chat's ``response_format``. The service runs
it as it runs chat (`Service.chat_request`: the same limits, template, grammar, parsers,
detokenizer and stop logic), and `ResponsesFormat` turns the parsed output into the response
object and its streamed events (``event: TYPE`` lines, a ``sequence_number`` on each).

With ``store`` (the default, as OpenAI's) the response object and its conversation go to the
server's store (`tsfront.serve.processes.store`) before the response is answered (streamed: before
``response.completed``), so ``GET``/``DELETE /v1/responses/{id}`` and ``previous_response_id``
work on any worker, for requests with the same API key: every store operation names the
request's owner (`RequestRecord.owner`, set by the gate), and another key's finds nothing.
The stored response keeps its context's items too, listed by ``GET
/v1/responses/{id}/input_items`` (`tsfront.serve.responses.items`); ``POST .../{id}/cancel``
is OpenAI's 400 for a response not in background mode.

With ``include: ["reasoning.encrypted_content"]`` (how Codex-style clients run with ``store:
false``) every reasoning item carries its text sealed as ``encrypted_content``
(`tsfront.serve.core.seal`, bound to the request's owner); a reasoning item sent back with
one is opened only if this server sealed it for that key (else a 400 naming it), and its
text becomes the assistant turn's ``reasoning_content``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from tsfront.ids import item_id as _item_id
from tsfront.serve.core.limits import Refused, check_json, check_metadata, decoded
from tsfront.serve.core.offload import text_chars
from tsfront.serve.core.record import SHARED_OWNER
from tsfront.serve.core.reply import CUT_MESSAGE, ApiError, Final, Reply, SSEReply
from tsfront.serve.core.schema import ChatRequest
from tsfront.serve.core.shape import Format, encode_json, stream_failure
from tsfront.serve.processes.store import StoreUnavailable
from tsfront.serve.responses.items import input_items, page, page_query
from tsfront.text.tools import CallArgs, CallStart

if TYPE_CHECKING:
    from tsfront.client.stream import OutputChunk
    from tsfront.serve.core.choice import Choice
    from tsfront.serve.core.parsing import Pieces
    from tsfront.serve.core.record import RequestRecord
    from tsfront.serve.core.seal import Seal
    from tsfront.serve.core.service import Plan, Service

__all__ = [
    "ENCRYPTED",
    "REASONING",
    "Responses",
    "ResponsesFormat",
    "ResponsesRequest",
    "input_messages",
    "stored_route",
]

#: The ``include`` value that asks for reasoning items' ``encrypted_content``.
ENCRYPTED = "reasoning.encrypted_content"
#: The seal's purpose for a reasoning item's ``encrypted_content``.
REASONING = "responses.reasoning"

_JSON = msgspec.json.Encoder()
_BLOB = msgspec.json.Decoder(dict)
#: Built-in tools of OpenAI's that run on OpenAI's side: no such thing here.
_BUILTIN_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "computer_use",
        "computer_use_preview",
        "computer",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "shell",
        "apply_patch",
        "custom",
    }
)
#: The longest id looked up (ours are 29 characters).
_MAX_ID = 256
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
# Chat's names for what a refusal names, in the Responses API's terms.
_PARAMS = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """``POST /v1/responses``: the fields the server reads (others are ignored)."""

    model: str | None = None
    input: str | list[Any] = ""
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    metadata: Any = None
    store: bool = True
    previous_response_id: str | None = None
    background: bool | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    conversation: Any = None
    prompt: Any = None
    user: str | None = None


_REQUEST = msgspec.json.Decoder(ResponsesRequest)


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, param=param)


def _not_found(rid: str) -> ApiError:
    return ApiError(
        404, f"no response with id {rid!r} (never stored, deleted, or evicted)",
        kind="invalid_request_error", param="response_id",
    )  # fmt: skip


def _unavailable(exc: Exception) -> ApiError:
    return ApiError(
        503,
        f"{exc}; retry, or send store: false without previous_response_id",
        kind="service_unavailable_error",
    )


def _refusals(req: ResponsesRequest) -> None:
    """What the server cannot do, or will not take, each a 400 naming its field."""
    check_metadata(req.metadata)
    if req.background:
        raise _bad("background mode is not supported; send background: false", "background")
    for value in req.include or ():
        if value != ENCRYPTED:
            raise _bad(
                f"include {str(value)[:64]!r}: only {ENCRYPTED!r} is supported (no built-in "
                "tools, no logprobs)",
                "include",
            )
    if req.conversation is not None:
        raise _bad(
            "conversation objects are not supported; use previous_response_id", "conversation"
        )
    if req.prompt is not None:
        raise _bad("prompt templates are not supported; send input", "prompt")
    if req.top_logprobs:
        raise _bad("top_logprobs is not supported", "top_logprobs")
    if req.truncation not in (None, "disabled"):
        raise _bad(
            f"truncation {req.truncation!r} is not supported: an input longer than the "
            "context is refused",
            "truncation",
        )
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise _bad(
            f"max_output_tokens={req.max_output_tokens}: must be at least 1", "max_output_tokens"
        )
    # Echoed in the response object (its encoder recurses): no deeper than a schema may be.
    if req.text is not None:
        check_json(req.text.get("format"), "text.format")
    check_json(req.tools, "tools")
    check_json(req.tool_choice, "tool_choice")


def _effort(reasoning: dict[str, Any] | None) -> str | None:
    """``reasoning.effort`` as chat's ``reasoning_effort`` (gpt-oss's Harmony reads it)."""
    effort = (reasoning or {}).get("effort")
    if effort is not None and not isinstance(effort, str):
        raise _bad("reasoning.effort must be low, medium or high", "reasoning.effort")
    return effort


def _chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}] must be an object", "tools")
        kind = tool.get("type")
        if kind != "function":
            what = "a built-in tool of OpenAI's" if kind in _BUILTIN_TOOLS else "a tool type"
            raise _bad(
                f"tools[{i}] is {what} ({kind!r}) this server does not run; only function "
                'tools ({"type": "function", "name", "parameters"}) are supported',
                "tools",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{i}].name must be a non-empty string", "tools")
        function: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            return {"type": "function", "function": {"name": choice.get("name")}}
        raise _bad(
            f"tool_choice of type {kind!r} is not supported; send none, auto, required or "
            '{"type": "function", "name": NAME}',
            "tool_choice",
        )
    raise _bad("tool_choice must be a string or an object", "tool_choice")


def _response_format(text: dict[str, Any] | None) -> Any:
    if not text or text.get("format") is None:
        return None
    fmt = text["format"]
    if not isinstance(fmt, dict):
        raise _bad("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format.schema must be a JSON schema (an object)", "text.format")
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise _bad(f"text.format type {kind!r}: send text, json_object or json_schema", "text.format")


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of parts", "input")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise _bad(f"{where}[{j}] must be an object", "input")
        kind = part.get("type")
        if kind not in _TEXT_PARTS:
            raise _bad(
                f"{where}[{j}] is {kind!r}: only text parts (input_text, output_text) are "
                "supported (no images, files or audio)",
                "input",
            )
        parts.append(str(part.get("text", "")))
    return "".join(parts)


def _assistant(messages: list[dict[str, Any]], *, merge: bool) -> dict[str, Any]:
    """The assistant message to add to: the last one if it is an assistant's and ``merge``
    allows it, else a new one."""
    if merge and messages and messages[-1].get("role") == "assistant":
        return messages[-1]
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    messages.append(message)
    return message


def input_messages(
    given: str | list[Any], unseal: Callable[[str], str | None] | None = None
) -> list[dict[str, Any]]:
    """A request's ``input`` as chat messages (``unseal``: a reasoning item's
    ``encrypted_content`` → its text, None if it is not this server's for the request's key)."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(given):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object", "input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{where}.role {role!r}: user, assistant, system or developer", "input")
            text = _text_of(item.get("content", ""), f"{where}.content")
            if role == "assistant":
                # After a reasoning item: the same turn.
                last = messages[-1] if messages else None
                turn = last is not None and last.get("role") == "assistant"
                turn = turn and not last.get("content") and not last.get("tool_calls")  # type: ignore[union-attr]
                _assistant(messages, merge=turn)["content"] = text
            else:
                messages.append(
                    {"role": "system" if role == "developer" else role, "content": text}
                )
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            arguments = item.get("arguments", "")
            if not (
                isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)
            ):
                raise _bad(
                    f"{where}: a function_call needs call_id, name and arguments (strings)", "input"
                )
            message = _assistant(messages, merge=True)
            message.setdefault("tool_calls", []).append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{where}: a function_call_output needs its call_id", "input")
            output = _text_of(item.get("output", ""), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            sealed = item.get("encrypted_content")
            if sealed is not None:
                opened = unseal(sealed) if unseal is not None and isinstance(sealed, str) else None
                if opened is None:
                    raise _bad(
                        f"{where}.encrypted_content is not this server's for this API key: send "
                        "reasoning items back exactly as this server returned them, or leave "
                        "them out (a server restarted without TSFRONT_REASONING_KEY no longer "
                        "opens its earlier ones)",
                        "input",
                    )
                text = opened
            else:
                parts = item.get("content") or item.get("summary") or []
                text = _text_of(parts, f"{where}.content")
            message = _assistant(messages, merge=False)
            message["reasoning_content"] = text
        else:
            raise _bad(
                f"{where} is an item of type {kind!r}: supported are message, function_call, "
                "function_call_output and reasoning",
                "input",
            )
    for message in messages:
        if (
            message.get("role") == "assistant"
            and message.get("tool_calls")
            and not message["content"]
        ):
            message["content"] = None
    return messages


def _owner(record: RequestRecord | None) -> str:
    return SHARED_OWNER if record is None else record.owner


def _rename(exc: ApiError | Refused) -> ApiError:
    param = _PARAMS.get(exc.param or "", exc.param)
    message = str(exc)
    for chat_name in ("max_completion_tokens", "max_tokens", "response_format"):
        message = re.sub(rf"\b{chat_name}\b", _PARAMS[chat_name], message)
    if isinstance(exc, Refused):
        return _bad(message, param)
    return ApiError(exc.status, message, kind=exc.kind, param=param)


class Responses:
    """The ``/v1/responses`` routes of one worker over its core `Service` and a store
    (`tsfront.serve.processes.store`: `StoreClient` or `LocalStore`)."""

    def __init__(self, service: Service, store: Any) -> None:
        self.service = service
        self.store = store

    async def create(self, body: bytes, record: RequestRecord | None = None) -> Reply | SSEReply:
        """``POST /v1/responses``."""
        try:
            req = decoded(_REQUEST, body)
        except Refused as exc:  # as it is: the body's own field names
            return _bad(str(exc), None).reply()
        try:
            return await self._create(req, len(body), record)
        except (ApiError, Refused) as exc:
            return _rename(exc).reply()

    async def _create(
        self, req: ResponsesRequest, size: int, record: RequestRecord | None
    ) -> Reply | SSEReply:
        _refusals(req)
        owner = _owner(record)
        seal = self.service.seal
        history: list[dict[str, Any]] = []
        items: list[dict[str, Any]] = []  # the context's items, for input_items
        if req.previous_response_id is not None:
            stored = await self._stored(owner, req.previous_response_id, "previous_response_id")
            history = stored["messages"]
            items = [*stored.get("items", ()), *stored["response"]["output"]]
            size += text_chars(history)  # rendered too: the render is sized by what it renders

        def unseal(sealed: str) -> str | None:
            return seal.open(REASONING, owner, sealed)

        new = input_messages(req.input, unseal) if req.input != "" else []
        items += input_items(req.input)
        if not new and not history:
            raise _bad("input must not be empty", "input")
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        chat = ChatRequest(
            model=req.model,
            messages=system + history + new,
            tools=_chat_tools(req.tools),
            tool_choice=_chat_tool_choice(req.tool_choice),
            parallel_tool_calls=req.parallel_tool_calls,
            max_completion_tokens=req.max_output_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stream=req.stream,
            response_format=_response_format(req.text),
            reasoning_effort=_effort(req.reasoning),
        )
        fmt: list[ResponsesFormat] = []

        def format_of(plan: Plan) -> Format:
            service = self.service
            fmt.append(ResponsesFormat(service.model_name, service.text, req, seal, owner))
            return fmt[0]

        reply = await self.service.chat_request(chat, size, format_of, record)
        conversation = history + new
        if type(reply) is SSEReply:
            shape = fmt[0]

            def cut() -> bytes:  # a stopping server's last event (`ServeApp.cut`), numbered then
                return shape.error_event(Exception(CUT_MESSAGE), 503, "service_unavailable_error")

            keeper = owner if req.store else None
            events = self._stored_stream(reply.events, shape, conversation, items, keeper)
            return SSEReply(events, cut=cut)
        if req.store and fmt:
            await self._keep(owner, fmt[0], conversation, items)
        return reply

    async def _stored_stream(
        self,
        events: AsyncGenerator[bytes, None],
        fmt: ResponsesFormat,
        conversation: list[dict[str, Any]],
        items: list[dict[str, Any]],
        owner: str | None,
    ) -> AsyncGenerator[bytes, None]:
        # The last event (response.completed) goes out once the response is stored (under
        # ``owner``; None: not stored), so a client that continues from it at once finds it.
        try:
            async for event in events:
                if type(event) is Final and owner is not None and fmt.response is not None:
                    try:
                        await self._keep(owner, fmt, conversation, items)
                    except ApiError as exc:
                        event = Final(fmt.unstored(exc, exc.status, exc.kind))
                yield event
        finally:
            await events.aclose()

    async def _keep(
        self,
        owner: str,
        fmt: ResponsesFormat,
        conversation: list[dict[str, Any]],
        items: list[dict[str, Any]],
    ) -> None:
        response = fmt.response
        if response is None:
            return
        blob = encode_json(
            {
                "response": response,
                "messages": [*conversation, fmt.assistant_message()],
                "items": items,
            }
        )
        try:
            await self.store.put(owner, response["id"], blob)
        except StoreUnavailable as exc:
            raise _unavailable(exc) from None

    async def _stored(self, owner: str, rid: str, param: str) -> dict[str, Any]:
        if len(rid) > _MAX_ID:  # never one of ours: no need to ask the store
            err = _not_found(rid[:64] + "...")
            err.param = param
            raise err
        try:
            blob = await self.store.get(owner, rid)
        except StoreUnavailable as exc:
            raise _unavailable(exc) from None
        if blob is None:
            err = _not_found(rid)
            err.param = param
            raise err
        return _BLOB.decode(blob)

    async def retrieve(self, rid: str, record: RequestRecord | None = None) -> Reply:
        """``GET /v1/responses/{id}`` (of ``record``'s owner)."""
        try:
            stored = await self._stored(_owner(record), rid, "response_id")
        except ApiError as exc:
            return exc.reply()
        return Reply(200, _JSON.encode(stored["response"]))

    async def delete(self, rid: str, record: RequestRecord | None = None) -> Reply:
        """``DELETE /v1/responses/{id}`` (of ``record``'s owner)."""
        try:
            deleted = await self.store.delete(_owner(record), rid)
        except StoreUnavailable as exc:
            return _unavailable(exc).reply()
        if not deleted:
            return _not_found(rid).reply()
        return Reply(200, _JSON.encode({"id": rid, "object": "response.deleted", "deleted": True}))

    async def input_items(
        self, rid: str, query: bytes, record: RequestRecord | None = None
    ) -> Reply:
        """``GET /v1/responses/{id}/input_items`` (of ``record``'s owner): the items of its
        context, a page at a time (`tsfront.serve.responses.items.page`)."""
        try:
            params = page_query(query)
            stored = await self._stored(_owner(record), rid, "response_id")
            return Reply(200, encode_json(page(stored.get("items", []), **params)))
        except ApiError as exc:
            return exc.reply()

    async def cancel(self, rid: str, record: RequestRecord | None = None) -> Reply:
        """``POST /v1/responses/{id}/cancel``: OpenAI's answer for a response that is not in
        background mode (none here is): a 400; another key's, or none, a 404."""
        try:
            await self._stored(_owner(record), rid, "response_id")
        except ApiError as exc:
            return exc.reply()
        return ApiError(
            400,
            "Cannot cancel a synchronous response. (Only a response created with background: "
            "true can be cancelled; this server runs none in the background: a response is "
            "over when its request is answered, and a client that disconnects from a stream "
            "aborts it.)",
        ).reply()


class ResponsesFormat(Format):
    """The response object and its streamed events for one request (one choice)."""

    object_whole = "response"
    id_prefix = "resp_"
    done = b""

    def __init__(
        self,
        model: str,
        text: Any,
        req: ResponsesRequest,
        seal: Seal | None = None,
        owner: str = SHARED_OWNER,
    ) -> None:
        super().__init__(model, text, 1, False)
        self.req = req
        # include: ["reasoning.encrypted_content"]: reasoning items carry their text sealed.
        self._seal = seal if ENCRYPTED in (req.include or ()) else None
        self._owner = owner
        self.seq = 0
        #: The output items so far (streamed: as they open).
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._texts: list[str] = []  # its text deltas, joined once when it closes
        self._calls: dict[int, dict[str, Any]] = {}
        #: The final response object, once known.
        self.response: dict[str, Any] | None = None
        self._parser: Any = None
        # What `last` sent before its final event, and that event's number (`unstored`).
        self._closing = b""
        self._final_seq = 0

    # -- the Format interface ------------------------------------------------------------------

    def _event(self, kind: str, body: dict[str, Any]) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **body}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + encode_json(body) + b"\n\n"

    def opening(self, index: int) -> bytes | None:
        shell = self._object("in_progress", [], None)
        return self._event("response.created", {"response": shell}) + self._event(
            "response.in_progress", {"response": shell}
        )

    def pieces(self, index: int, pieces: Pieces) -> bytes:
        if not pieces:
            return b""
        out: list[bytes] = []
        if pieces.reasoning:
            self._text("reasoning", pieces.reasoning, out)
        if pieces.content:
            self._text("message", pieces.content, out)
        for delta in pieces.calls:
            if type(delta) is CallStart:
                self._close(out)
                item: dict[str, Any] | None = {
                    "id": _item_id("fc"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": delta.id,
                    "name": delta.name,
                    "arguments": "",
                }
                assert item is not None
                self._calls[delta.index] = item
                self._add(item, out)
            elif type(delta) is CallArgs:
                item = self._calls.get(delta.index)
                if item is not None and delta.text:
                    if item is self._open:
                        # Joined once when the item closes: the fragments of a long call
                        # are many (the arguments stream).
                        self._texts.append(delta.text)
                        index = len(self.items) - 1
                    else:
                        item["arguments"] += delta.text
                        index = self._index(item)
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            {"item_id": item["id"], "output_index": index, "delta": delta.text},
                        )
                    )
        return b"".join(out)

    def last(self, ch: Choice, text: str, chunk: OutputChunk | None) -> bytes:
        out: list[bytes] = []
        self._close(out)
        for item in self.items:
            if item["type"] == "function_call" and not item["arguments"]:
                item["arguments"] = "{}"
        self._parser = ch.parser
        status = "incomplete" if ch.finish == "length" else "completed"
        self.response = self._object(status, self.items, ch)
        self._closing, self._final_seq = b"".join(out), self.seq
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.append(self._event(kind, {"response": self.response}))
        return b"".join(out)

    def unstored(self, exc: Exception, status: int, kind: str) -> bytes:
        """The end of a stream whose response could not be stored, instead of `last`'s: the
        open item closed as `last` closed it, then an ``error`` event numbered right after
        (not the ``response.completed`` that was never sent)."""
        self.seq = self._final_seq
        return self._closing + self.error_event(exc, status, kind)

    def whole(self, choices: list, texts: list[str]) -> bytes:
        (ch,) = choices
        self._parser = ch.parser
        message = ch.parser.message()
        items: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            items.append(self._sealed(self._reasoning_item(message["reasoning_content"])))
        if message.get("content"):
            items.append(self._message_item(message["content"]))
        for call in message.get("tool_calls") or []:
            items.append(
                {
                    "id": _item_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
        status = "incomplete" if ch.finish == "length" else "completed"
        self.items = items
        self.response = self._object(status, items, ch)
        return encode_json(self.response)

    def error_event(
        self, exc: Exception, status: int | None = None, kind: str | None = None
    ) -> bytes:
        """The ``error`` event that ends a failed stream (the engine died, the server stops),
        after the item it cut is closed as "incomplete": a client that tracks its items sees
        each one that was added end, as the store's failure ends them (`unstored`)."""
        if status is None or kind is None:
            kind, status = stream_failure(exc)
        out: list[bytes] = []
        self._close(out, "incomplete")
        out.append(self._event("error", {"code": kind, "message": str(exc), "param": None}))
        return b"".join(out)

    # -- the history a stored response continues with ------------------------------------------

    def assistant_message(self) -> dict[str, Any]:
        """This response's output as the chat message the next turn's template sees."""
        parser = self._parser
        message = dict(parser.message()) if parser is not None else {"role": "assistant"}
        if not message.get("reasoning_content"):
            message.pop("reasoning_content", None)
        return message

    # -- building blocks -----------------------------------------------------------------------

    def _object(
        self, status: str, items: list[dict[str, Any]], ch: Choice | None
    ) -> dict[str, Any]:
        req = self.req
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": items,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "store": req.store,
            "temperature": req.temperature if req.temperature is not None else 1.0,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "top_p": req.top_p if req.top_p is not None else 1.0,
            "truncation": "disabled",
            "metadata": req.metadata or {},
            "usage": None,
            "user": req.user,
        }
        if ch is not None:
            obj["completed_at"] = int(time.time()) if status == "completed" else None
            # Counted from the engine's tokens as they came (`OutputParser.reasoning_tokens`).
            thought = ch.parser.reasoning_tokens if ch.parser is not None else 0
            obj["usage"] = {
                "input_tokens": ch.prompt_tokens,
                "input_tokens_details": {"cached_tokens": ch.cached, "cache_write_tokens": 0},
                "output_tokens": ch.tokens,
                "output_tokens_details": {"reasoning_tokens": min(ch.tokens, thought)},
                "total_tokens": ch.prompt_tokens + ch.tokens,
            }
        return obj

    def _sealed(self, item: dict[str, Any]) -> dict[str, Any]:
        """A completed reasoning item with its text sealed as ``encrypted_content``, when the
        request included it (`tsfront.serve.core.seal`: only this server opens it, and only
        for this key)."""
        if self._seal is not None:
            text = item["content"][0]["text"]
            item["encrypted_content"] = self._seal.seal(REASONING, self._owner, text)
        return item

    @staticmethod
    def _reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
        return {
            "id": _item_id("rs"),
            "type": "reasoning",
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }

    @staticmethod
    def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
        return {
            "id": _item_id("msg"),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }

    def _index(self, item: dict[str, Any]) -> int:
        return next(i for i, it in enumerate(self.items) if it is item)

    def _add(self, item: dict[str, Any], out: list[bytes]) -> None:
        self.items.append(item)
        self._open = item
        shown = {**item}
        if item["type"] != "function_call":
            shown["content"] = []
        out.append(
            self._event(
                "response.output_item.added", {"output_index": len(self.items) - 1, "item": shown}
            )
        )

    def _text(self, kind: str, text: str, out: list[bytes]) -> None:
        item = self._open
        if item is None or item["type"] != kind:
            self._close(out)
            item = (
                self._reasoning_item("", "in_progress")
                if kind == "reasoning"
                else self._message_item("", "in_progress")
            )
            self._add(item, out)
            out.append(
                self._event(
                    "response.content_part.added",
                    {
                        "item_id": item["id"],
                        "output_index": len(self.items) - 1,
                        "content_index": 0,
                        "part": {**item["content"][0]},
                    },
                )
            )
        self._texts.append(text)
        body: dict[str, Any] = {
            "item_id": item["id"],
            "output_index": len(self.items) - 1,
            "content_index": 0,
            "delta": text,
        }
        if kind == "message":
            body["logprobs"] = []
            out.append(self._event("response.output_text.delta", body))
        else:
            out.append(self._event("response.reasoning_text.delta", body))

    def _close(self, out: list[bytes], status: str = "completed") -> None:
        """Close the open item (its ``.done`` events), with ``status``: "incomplete" when a
        failure cut it."""
        item, self._open = self._open, None
        if item is None:
            return
        index = self._index(item)
        item["status"] = status
        if item["type"] == "function_call":
            item["arguments"] += "".join(self._texts)
            self._texts.clear()
            if not item["arguments"]:
                item["arguments"] = "{}"
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    {
                        "item_id": item["id"],
                        "output_index": index,
                        "arguments": item["arguments"],
                        "name": item["name"],
                    },
                )
            )
        else:
            part = item["content"][0]
            part["text"] += "".join(self._texts)
            self._texts.clear()
            if item["type"] == "reasoning":
                self._sealed(item)
            kind = (
                "response.output_text.done"
                if item["type"] == "message"
                else "response.reasoning_text.done"
            )
            body: dict[str, Any] = {
                "item_id": item["id"],
                "output_index": index,
                "content_index": 0,
                "text": part["text"],
            }
            if item["type"] == "message":
                body["logprobs"] = []
            out.append(self._event(kind, body))
            out.append(
                self._event(
                    "response.content_part.done",
                    {
                        "item_id": item["id"],
                        "output_index": index,
                        "content_index": 0,
                        "part": part,
                    },
                )
            )
        out.append(self._event("response.output_item.done", {"output_index": index, "item": item}))


# The routes of a stored response: (method, what follows its id) → the action.
_STORED_ROUTES = {
    ("GET", ""): "retrieve",
    ("DELETE", ""): "delete",
    ("GET", "/input_items"): "input_items",
    ("POST", "/cancel"): "cancel",
}


def stored_route(method: str, path: str) -> tuple[str, str] | None:
    """``(action, id)`` of a stored response's route (``GET``/``DELETE /v1/responses/{id}``,
    ``GET .../{id}/input_items``, ``POST .../{id}/cancel``), or None for another path."""
    prefix = "/v1/responses/"
    if not path.startswith(prefix):
        return None
    rid, slash, rest = path[len(prefix) :].partition("/")
    action = _STORED_ROUTES.get((method, slash + rest))
    if action is None or not rid or len(rid) > _MAX_ID:
        return None
    return action, rid
