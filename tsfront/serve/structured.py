"""Structured outputs: ``response_format`` and ``structured_outputs`` as the engine's grammar.

The TokenSpeed wire carries one grammar per request (``sampling_params`` ``json_schema``,
``regex``, ``ebnf`` or ``structural_tag``, CONTRACT §2.3); `constraint` maps a request's
fields onto one:

=====================================================  ======================================
request                                                engine field
=====================================================  ======================================
``response_format: {"type": "text"}``                  none
``response_format: {"type": "json_object"}``           ``json_schema`` ``{"type": "object"}``
``response_format: {"type": "json_schema",             ``json_schema``: the schema's JSON text
"json_schema": {"name", "schema", "strict"}}``
``response_format: {"type": "structural_tag", …}``     ``structural_tag``: the object's JSON
``structured_outputs: {"json": SCHEMA}``               ``json_schema`` (a schema object or text)
``structured_outputs: {"json_object": true}``          ``json_schema`` ``{"type": "object"}``
``structured_outputs: {"regex": PATTERN}``             ``regex``
``structured_outputs: {"choice": [TEXT, …]}``          ``regex``: the texts, escaped, as
                                                       alternatives
``structured_outputs: {"grammar": EBNF}``              ``ebnf``
``structured_outputs: {"structural_tag": JSON}``       ``structural_tag``
=====================================================  ======================================

``structured_outputs`` is vLLM's extension; one of its keys per request, and not together
with a ``response_format`` other than ``text``. The server does not check that a schema,
pattern or grammar compiles: the engine does, and answers one that does not with an abort,
which the server turns into a 400 (`tsfront.serve.api`).
"""

from __future__ import annotations

import json
from typing import Any

from tsfront.serve.limits import Refused, check_json

__all__ = ["Constraint", "choice_regex", "constraint"]

_ANY_OBJECT = '{"type": "object"}'
# Characters a regex gives a meaning to (xgrammar's and Python's syntax alike).
_SPECIAL = frozenset("\\.^$|?*+()[]{}")


class Constraint:
    """One grammar for the engine: ``field`` (a `tsfront.wire.SamplingParams` name) and its
    text, and the request field (``param``) it came from, for refusals."""

    __slots__ = ("field", "param", "value")

    def __init__(self, field: str, value: str, param: str) -> None:
        self.field = field
        self.value = value
        self.param = param

    def __repr__(self) -> str:
        return f"Constraint({self.field}={self.value[:60]!r}, from {self.param})"


def choice_regex(choices: list[str]) -> str:
    """A regex that matches exactly one of ``choices`` (each escaped)."""
    escaped = ("".join("\\" + c if c in _SPECIAL else c for c in text) for text in choices)
    return "(" + "|".join(escaped) + ")"


def _json_text(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, bool)):
        return json.dumps(value, ensure_ascii=False)
    raise Refused(f"{param} must be a JSON schema (an object)", param.split(".")[0])


def constraint(response_format: Any, structured_outputs: Any) -> Constraint | None:
    """The engine grammar a request asks for, or ``None``. Raises `Refused` saying what is
    wrong and what to send (a value nested too deep for ``json.dumps`` included)."""
    rf = None
    if response_format is not None:
        check_json(response_format, "response_format")
        rf = _response_format(response_format)
    so = None
    if structured_outputs is not None:
        check_json(structured_outputs, "structured_outputs")
        so = _structured_outputs(structured_outputs)
    if rf is not None and so is not None:
        raise Refused(
            "response_format and structured_outputs both constrain the output: send one",
            "structured_outputs",
        )
    return rf or so


def _response_format(rf: Any) -> Constraint | None:
    param = "response_format"
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_schema", _ANY_OBJECT, param)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise Refused(
                'response_format {"type": "json_schema"} needs "json_schema": {"name": NAME, '
                '"schema": JSON_SCHEMA, "strict": BOOL}',
                param,
            )
        return Constraint("json_schema", json.dumps(spec["schema"], ensure_ascii=False), param)
    if kind == "structural_tag":
        return Constraint("structural_tag", json.dumps(rf, ensure_ascii=False), param)
    raise Refused(
        f"response_format type {json.dumps(kind)[:80]}: use text, json_object, json_schema or "
        "structural_tag",
        param,
    )


_KEYS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def _structured_outputs(so: Any) -> Constraint | None:
    param = "structured_outputs"
    if not isinstance(so, dict):
        raise Refused(f"structured_outputs must be an object with one of {', '.join(_KEYS)}", param)
    given = [k for k in _KEYS if so.get(k) not in (None, False)]
    if not given:
        return None
    if len(given) > 1:
        raise Refused(
            f"structured_outputs has {', '.join(given)}: one constraint per request", param
        )
    key = given[0]
    value = so[key]
    if key == "json":
        return Constraint("json_schema", _json_text(value, "structured_outputs.json"), param)
    if key == "json_object":
        return Constraint("json_schema", _ANY_OBJECT, param)
    if key == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
            raise Refused("structured_outputs.choice must be a non-empty list of strings", param)
        return Constraint("regex", choice_regex(value), param)
    if key == "structural_tag":
        tag = _json_text(value, "structured_outputs.structural_tag")
        return Constraint("structural_tag", tag, param)
    if not isinstance(value, str) or not value:
        raise Refused(f"structured_outputs.{key} must be a non-empty string", param)
    return Constraint("regex" if key == "regex" else "ebnf", value, param)
