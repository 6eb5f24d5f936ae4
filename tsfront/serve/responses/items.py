"""A stored response's input items (``GET /v1/responses/{id}/input_items``), as OpenAI lists
them.

`input_items` turns a request's ``input`` into the items OpenAI's API shows for it, each with
an id (the client's, else a fresh one from `tsfront.ids`) and ``status: "completed"``, and
only the fields OpenAI's item of its type has: a string input is one ``user`` ``message``;
a message's content its text parts (``input_text``, or ``output_text`` for the
assistant's); a ``function_call`` its ``call_id``, ``name``, ``arguments``; a
``function_call_output`` its ``call_id`` and ``output``; a ``reasoning`` item its
``summary``, ``content`` and ``encrypted_content``. A stored response keeps the items of its whole
context: those of the response it continued (its input items, then its output), then its own
input's; ``instructions`` are not an item.

`page` is the listing: ``order`` ``desc`` (the default, newest first) or ``asc``, at most
``limit`` items (1 to 100, default 20) after the item ``after`` or before the item ``before``
in that order, with ``first_id``, ``last_id`` and ``has_more``: the shape of OpenAI's cursor
pages, which the ``openai`` client pages through by ``after``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from tsfront.ids import item_id
from tsfront.serve.core.reply import ApiError

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "input_items", "page", "page_query"]

#: Items a page holds when the request names no ``limit`` (OpenAI's default), and at most.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# The id prefix of an item of each type that came without one.
_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param)


def _text_parts(content: Any, kind: str) -> list[dict[str, Any]]:
    """A message's (or an output's) content as text parts of ``kind``: only the text is kept
    (`input_messages` refused any other part)."""
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    else:  # a reasoning item sent back sealed: its other fields were not read
        texts = []
    if kind == "output_text":
        return [{"type": kind, "text": text, "annotations": []} for text in texts]
    return [{"type": kind, "text": text} for text in texts]


def _item(item: dict[str, Any]) -> dict[str, Any]:
    # The fields OpenAI's item of this type has, no others: what is echoed is bounded by what
    # the request's own checks read (no client field of any depth is stored as it came).
    kind = item.get("type", "message" if "role" in item else None)
    given = item.get("id")
    shown: dict[str, Any] = {
        "id": given if isinstance(given, str) and given else item_id(_PREFIXES[str(kind)]),
        "type": kind,
        "status": "completed",
    }
    if kind == "message":
        role = str(item.get("role"))
        shown["role"] = role
        kind_of_text = "output_text" if role == "assistant" else "input_text"
        shown["content"] = _text_parts(item.get("content", ""), kind_of_text)
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            shown[name] = item.get(name, "")
    elif kind == "function_call_output":
        shown["call_id"] = item.get("call_id")
        output = item.get("output", "")
        shown["output"] = output if isinstance(output, str) else _text_parts(output, "input_text")
    else:  # reasoning
        shown["summary"] = _text_parts(item.get("summary") or [], "summary_text")
        if item.get("content"):
            shown["content"] = _text_parts(item["content"], "reasoning_text")
        if isinstance(item.get("encrypted_content"), str):
            shown["encrypted_content"] = item["encrypted_content"]
    return shown


def input_items(given: str | list[Any]) -> list[dict[str, Any]]:
    """The items of a request's ``input`` as the listing shows them (after
    `tsfront.serve.responses.endpoints.input_messages` checked them: four types, text only)."""
    if isinstance(given, str):
        return [_item({"role": "user", "content": given})] if given else []
    return [_item(item) for item in given]


def page_query(query: bytes) -> dict[str, Any]:
    """The listing's parameters from a query string (a bad one a 400 naming it)."""
    try:
        fields = parse_qs(query.decode("ascii"), strict_parsing=False)
    except UnicodeDecodeError:
        raise _bad("the query string must be ASCII (URL-encoded)", "query") from None
    out: dict[str, Any] = {"after": None, "before": None, "limit": DEFAULT_LIMIT, "order": "desc"}
    for name in ("after", "before"):
        if name in fields:
            out[name] = fields[name][-1]
    if "limit" in fields:
        raw = fields["limit"][-1]
        if not (raw.isdecimal() and 1 <= int(raw) <= MAX_LIMIT):
            raise _bad(f"limit={raw[:32]!r}: an integer from 1 to {MAX_LIMIT}", "limit")
        out["limit"] = int(raw)
    if "order" in fields:
        order = fields["order"][-1]
        if order not in ("asc", "desc"):
            raise _bad(f"order={order[:32]!r}: asc or desc", "order")
        out["order"] = order
    for value in fields.get("include", []) + fields.get("include[]", []):
        if value != "reasoning.encrypted_content":
            raise _bad(
                f"include {value[:64]!r}: only reasoning.encrypted_content is supported", "include"
            )
    if out["after"] is not None and out["before"] is not None:
        raise _bad("send after or before, not both", "before")
    return out


def page(
    items: list[dict[str, Any]],
    *,
    after: str | None = None,
    before: str | None = None,
    limit: int = DEFAULT_LIMIT,
    order: str = "desc",
) -> dict[str, Any]:
    """One page of ``items`` (oldest first) as OpenAI's list object."""
    ordered = items[::-1] if order == "desc" else list(items)
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    if after is not None:
        if after not in ids:
            raise _bad(f"after={after[:64]!r} is not an item of this response", "after")
        start = ids.index(after) + 1
    if before is not None:
        if before not in ids:
            raise _bad(f"before={before[:64]!r} is not an item of this response", "before")
        end = ids.index(before)
        start = max(0, end - limit)
        data = ordered[start:end]
        more = start > 0
    else:
        data = ordered[start : start + limit]
        more = start + limit < end
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }
