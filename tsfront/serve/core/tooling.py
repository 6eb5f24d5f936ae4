"""The request half of tool calls: ``tools``, ``tool_choice``, and tool calls in the history.

`tool_plan` checks a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
(a refusal is `Refused`, naming the field) and returns a `ToolPlan`: the tools the template
renders, the engine constraint the choice asks for, and a fresh tool parser per choice.

=============================  ===================  ============================================
``tool_choice``                engine constraint    output parsed by
=============================  ===================  ============================================
``"none"``                     none                 nothing (the tools are still rendered)
``"auto"`` (default w/ tools)  none                 the ``--tool-call-parser`` (refused without)
``"required"``                 ``json_schema``:     `tsfront.text.tools.RequiredToolParser`
                               `required_schema`
``{"type": "function", …}``    ``json_schema``:     `tsfront.text.tools.NamedToolParser`
                               `named_schema`
=============================  ===================  ============================================

`history_message` turns an assistant message's ``tool_calls`` into what Hugging Face
templates expect: each ``function.arguments`` JSON string parsed into its object, which is
then held to what the template and the tokenizer can take (`tsfront.serve.core.limits.check_json`:
nesting, no lone surrogate; a template may write the values raw, as Qwen3-Coder's does).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tsfront.serve.core.limits import Refused, check_json, too_deep

if TYPE_CHECKING:
    from tsfront.text.tools import ToolParser

__all__ = ["ToolPlan", "history_message", "tool_plan"]


class ToolPlan:
    """What a request's tools ask of the server.

    Attributes:
        tools: the request's ``tools`` (for the template's ``tools=``).
        mode: ``"none"``, ``"auto"``, ``"required"`` or ``"named"``.
        function: the named function (mode ``"named"``).
        parallel: ``parallel_tool_calls``.
        parser_name: the ``--tool-call-parser`` (mode ``"auto"``).
    """

    __slots__ = ("function", "mode", "parallel", "parser_name", "tools")

    def __init__(
        self,
        tools: list[dict[str, Any]],
        mode: str,
        function: str | None,
        parallel: bool,
        parser_name: str | None,
    ) -> None:
        self.tools = tools
        self.mode = mode
        self.function = function
        self.parallel = parallel
        self.parser_name = parser_name

    def schema(self) -> str | None:
        """The engine ``json_schema`` (JSON text) the choice constrains the output to, or
        ``None`` (``"none"`` and ``"auto"`` are not constrained)."""
        from tsfront.text.tools import named_schema, required_schema

        if self.mode == "required":
            return json.dumps(required_schema(self.tools, self.parallel), ensure_ascii=False)
        if self.mode == "named" and self.function is not None:
            return json.dumps(named_schema(self.tools, self.function), ensure_ascii=False)
        return None

    def parser(self, constrained: bool) -> ToolParser | None:
        """A fresh tool parser for one choice (``constrained``: the engine got `schema`;
        else, for ``"required"`` and named tools, the output is not theirs and is content)."""
        from tsfront.text.tools import NamedToolParser, RequiredToolParser, make_tool_parser

        mode = self.mode
        if mode == "auto" and self.parser_name is not None:
            return make_tool_parser(self.parser_name, self.tools)
        if not constrained:
            return None
        if mode == "required":
            return RequiredToolParser(self.tools)
        if mode == "named" and self.function is not None:
            return NamedToolParser(self.tools, self.function)
        return None


def _function_name(tool: Any) -> str | None:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        return None
    function = tool.get("function")
    if not isinstance(function, dict):
        return None
    name = function.get("name")
    return name if isinstance(name, str) and name else None


def tool_plan(
    tools: list[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    parser_name: str | None,
) -> ToolPlan | None:
    """The `ToolPlan` of a chat request, or ``None`` when it has no tools (nor asks for
    any). Raises `Refused` naming the field that is wrong and saying what to send."""
    from tsfront.text.tools import TOOL_PARSERS

    if not tools:
        if tool_choice is None or tool_choice == "none":
            return None
        raise Refused(
            f"tool_choice {json.dumps(tool_choice)[:200]} needs tools: send the functions in "
            "'tools', or omit tool_choice",
            "tool_choice",
        )
    check_json(tools, "tools")  # before any recursive code (schemas, tojson) sees them
    if tool_choice is not None and not isinstance(tool_choice, str):
        check_json(tool_choice, "tool_choice")
    names = []
    for i, tool in enumerate(tools):
        name = _function_name(tool)
        if name is None:
            raise Refused(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": NAME, '
                '"parameters": JSON_SCHEMA}}: only function tools are supported',
                "tools",
            )
        params = tool["function"].get("parameters")
        if params is not None and not isinstance(params, dict):
            raise Refused(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.append(name)
    function = None
    if tool_choice is None:
        mode = "auto"
    elif tool_choice in ("none", "auto", "required"):
        mode = tool_choice
    elif (
        isinstance(tool_choice, dict)
        and tool_choice.get("type") == "function"
        and isinstance(tool_choice.get("function"), dict)
        and isinstance(tool_choice["function"].get("name"), str)
    ):
        mode = "named"
        function = tool_choice["function"]["name"]
        if function not in names:
            raise Refused(
                f"tool_choice names function {function!r}, which tools does not define "
                f"(it has {', '.join(repr(n) for n in names)})",
                "tool_choice",
            )
    else:
        raise Refused(
            'tool_choice must be "none", "auto", "required" or {"type": "function", '
            '"function": {"name": NAME}}',
            "tool_choice",
        )
    if mode == "auto" and parser_name is None:
        raise Refused(
            "this server parses no tool calls: start tsfront serve with --tool-call-parser NAME "
            f"(one of {', '.join(sorted(TOOL_PARSERS))}, the model's format) for tools with "
            'tool_choice "auto"; tool_choice "required" or a named function work without it',
            "tools",
        )
    return ToolPlan(list(tools), mode, function, parallel_tool_calls, parser_name)


def history_message(i: int, message: dict[str, Any]) -> dict[str, Any]:
    """``messages[i]`` for the template: an assistant's ``tool_calls`` with their
    ``function.arguments`` parsed from JSON text into objects (Hugging Face templates write
    them with ``tojson``); arguments that are an object cut short (a call the model broke,
    which an agent sends back with the error its tool gave) closed where they were cut.
    Raises `Refused` for other arguments that are not JSON, and arguments that nest too deep
    or hold a lone surrogate."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    if not isinstance(calls, list):
        raise Refused(f"messages[{i}].tool_calls must be a list", "messages")
    parsed = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Refused(
                f'messages[{i}].tool_calls[{j}] must be {{"id": ID, "type": "function", '
                '"function": {"name": NAME, "arguments": JSON_TEXT}}',
                "messages",
            )
        arguments = function.get("arguments")
        where = f"messages[{i}].tool_calls[{j}].function.arguments"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except RecursionError:
                # json.loads recurses: past ~1,000 levels (the text may hold any depth).
                raise too_deep(where, "messages") from None
            except ValueError as exc:
                # A call the model broke (docs/TEXT.md), sent back as this server sent it: an
                # object cut short, given to the template closed where it was cut.
                from tsfront.text.tools.jsontext import close_object

                arguments = close_object(function["arguments"])
                if arguments is None:
                    raise Refused(
                        f"{where} is not JSON ({exc}): send the arguments the call had, as "
                        "JSON text",
                        "messages",
                    ) from None
            # Parsed here, not by the body's decoder: lone surrogates are possible.
            check_json(arguments, "messages", where, text=True)
        elif arguments is None:
            arguments = {}
        else:
            check_json(arguments, "messages", where)
        parsed.append({**call, "function": {**function, "arguments": arguments}})
    return {**message, "tool_calls": parsed}
