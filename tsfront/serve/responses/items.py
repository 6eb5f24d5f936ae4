"""A stored response's input items (``GET /v1/responses/{id}/input_items``), as OpenAI lists
them.

`input_items` turns a request's ``input`` into the items OpenAI's API shows for it, each with
an id (the client's, else a fresh one from `tsfront.ids`): a string input is one ``user``
``message`` with an ``input_text`` part; a message's string content becomes one text part
(``input_text``, or ``output_text`` for the assistant's); ``function_call``,
``function_call_output`` and ``reasoning`` items are kept as given, with an id and ``status:
"completed"``. A stored response keeps the items of its whole context: those of the response
it continued (its input items, then its output), then its own input's; ``instructions`` are
not an item.

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


def _parts(content: Any, role: str) -> Any:
    if not isinstance(content, str):
        return content
    if role == "assistant":
        return [{"type": "output_text", "text": content, "annotations": []}]
    return [{"type": "input_text", "text": content}]


def input_items(given: str | list[Any]) -> list[dict[str, Any]]:
    """The items of a request's ``input`` as the listing shows them (already checked by
    `tsfront.serve.responses.endpoints.input_messages`)."""
    if isinstance(given, str):
        return [
            {
                "id": item_id("msg"),
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": _parts(given, "user"),
            }
        ] if given else []  # fmt: skip
    items = []
    for item in given:
        kind = item.get("type", "message" if "role" in item else None)
        shown = {**item, "type": kind}
        if not isinstance(shown.get("id"), str) or not shown["id"]:
            shown["id"] = item_id(_PREFIXES.get(kind, "item"))
        shown.setdefault("status", "completed")
        if kind == "message":
            shown["content"] = _parts(shown.get("content", ""), str(shown.get("role")))
        items.append(shown)
    return items


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
