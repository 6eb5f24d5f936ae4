"""Tool calls as each model family writes them: a list of ``(name, arguments)`` calls -> the
model's text, for the tests that feed a parser or a simulated rank a model's output (the unit
tests of `tsfront.text.tools`, the families table through ``tsfront serve``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Call = tuple[str, dict[str, Any]]


def json_text(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def param_text(v: Any) -> str:
    """A value as the XML-parameter templates write it: a string as it is, else JSON."""
    return v if isinstance(v, str) else json_text(v)


def hermes(calls: list[Call]) -> str:
    return "\n".join(
        f'<tool_call>\n{{"name": "{n}", "arguments": {json_text(a)}}}\n</tool_call>'
        for n, a in calls
    )


def qwen3_coder(calls: list[Call]) -> str:
    return "\n".join(
        f"<tool_call>\n<function={n}>\n"
        + "".join(f"<parameter={k}>\n{param_text(v)}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>"
        for n, a in calls
    )


def llama3_json(calls: list[Call], tagged: bool = False) -> str:
    body = "; ".join(f'{{"name": "{n}", "parameters": {json_text(a)}}}' for n, a in calls)
    return "<|python_tag|>" + body if tagged else body


def mistral(calls: list[Call], v11: bool = True) -> str:
    if not v11:
        return "[TOOL_CALLS]" + json_text([{"name": n, "arguments": a} for n, a in calls])
    return "".join(f"[TOOL_CALLS]{n}[ARGS]{json_text(a)}" for n, a in calls)


def pythonic(calls: list[Call], tagged: bool = False) -> str:
    def value(v: Any) -> str:
        return repr(v)

    body = (
        "["
        + ", ".join(
            f"{n}(" + ", ".join(f"{k}={value(v)}" for k, v in a.items()) + ")" for n, a in calls
        )
        + "]"
    )
    return f"<|python_start|>{body}<|python_end|>" if tagged else body


def _ds(words: str) -> str:
    return "<\uff5c" + "\u2581".join(words.split()) + "\uff5c>"


DS = {w: _ds(w) for w in ("tool calls begin", "tool calls end", "tool call begin",
                          "tool call end", "tool sep")}  # fmt: skip


def deepseek_v3(calls: list[Call]) -> str:
    body = "\n".join(
        f"{DS['tool call begin']}function{DS['tool sep']}{n}\n```json\n{json_text(a)}\n```"
        f"{DS['tool call end']}"
        for n, a in calls
    )
    return DS["tool calls begin"] + body + DS["tool calls end"]


def deepseek_v31(calls: list[Call]) -> str:
    body = "".join(
        f"{DS['tool call begin']}{n}{DS['tool sep']}{json_text(a)}{DS['tool call end']}"
        for n, a in calls
    )
    return DS["tool calls begin"] + body + DS["tool calls end"]


DSML = "\uff5cDSML\uff5c"


def dsml(block: str) -> Callable[[list[Call]], str]:
    def write(calls: list[Call]) -> str:
        invokes = "".join(
            f'<{DSML}invoke name="{n}">\n'
            + "".join(
                f'<{DSML}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
                f"{param_text(v)}</{DSML}parameter>\n"
                for k, v in a.items()
            )
            + f"</{DSML}invoke>\n"
            for n, a in calls
        )
        return f"<{DSML}{block}>\n{invokes}</{DSML}{block}>"

    return write


def kimi_k2(calls: list[Call]) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{json_text(a)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return "<|tool_calls_section_begin|>" + body + "<|tool_calls_section_end|>"


def glm(nl: str) -> Callable[[list[Call]], str]:
    def write(calls: list[Call]) -> str:
        return "".join(
            f"<tool_call>{n}{nl}"
            + "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{param_text(v)}</arg_value>{nl}"
                for k, v in a.items()
            )
            + "</tool_call>"
            for n, a in calls
        )

    return write


def minimax_m2(calls: list[Call]) -> str:
    invokes = "".join(
        f'<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{param_text(v)}</parameter>\n' for k, v in a.items())
        + "</invoke>\n"
        for n, a in calls
    )
    return f"<minimax:tool_call>\n{invokes}</minimax:tool_call>"


def longcat(calls: list[Call]) -> str:
    return "\n".join(
        f'<longcat_tool_call>\n{{"name": "{n}", "arguments": {json_text(a)}}}\n</longcat_tool_call>'
        for n, a in calls
    )


def nemotron(calls: list[Call]) -> str:
    return "<TOOLCALL>" + json_text([{"name": n, "arguments": a} for n, a in calls]) + "</TOOLCALL>"


K3 = ("<|open|>", "<|close|>", "<|sep|>")


def k3_tag(name: str, **attrs: Any) -> str:
    text = "".join(
        f' {k}="{str(v).replace("&", "&amp;").replace(chr(34), "&quot;")}"'
        for k, v in attrs.items()
    )
    return f"<|open|>{name}{text}<|sep|>"


K3_TYPES = {str: "string", bool: "boolean", int: "number", float: "number", dict: "object",
             list: "array", type(None): "null"}  # fmt: skip


def kimi_k3(calls: list[Call], text: str = "") -> str:
    body = "".join(
        k3_tag("call", tool=n, index=i + 1)
        + "".join(
            k3_tag("argument", key=k, type=K3_TYPES[type(v)]) + param_text(v)
            + "<|close|>argument<|sep|>"
            for k, v in a.items()
        )
        + "<|close|>call<|sep|>"
        for i, (n, a) in enumerate(calls)
    )  # fmt: skip
    return (
        f"<|open|>response<|sep|>{text}<|close|>response<|sep|><|open|>tools<|sep|>{body}"
        "<|close|>tools<|sep|><|close|>message<|sep|>"
    )


NS = "]<]minimax[>["


def m3_value(v: Any) -> str:
    """A value as MiniMax-M3's template writes it (its to_xml macro)."""
    if isinstance(v, dict):
        return "".join(f"{NS}<{k}>{m3_value(x)}{NS}</{k}>" for k, x in v.items())
    if isinstance(v, list):
        return "".join(f"{NS}<item>{m3_value(x)}{NS}</item>" for x in v)
    return param_text(v)


def minimax_m3(calls: list[Call]) -> str:
    invokes = "".join(
        f'{NS}<invoke name="{n}">\n'
        + "".join(f"{NS}<{k}>{m3_value(v)}{NS}</{k}>\n" for k, v in a.items())
        + f"{NS}</invoke>\n"
        for n, a in calls
    )
    return f"{NS}<tool_call>\n{invokes}{NS}</tool_call>"


def inkling(calls: list[Call]) -> str:
    return (
        "".join(
            f"<|message_model|>{n}<|content_invoke_tool_json|>{json_text({'name': n, 'args': a})}"
            "<|end_message|>"
            for n, a in calls
        )
        + "<|content_model_end_sampling|>"
    )
