"""Scripted answers for simulated ranks: a marker in the prompt picks the output text.

A script file is JSON, a list of rules tried in order; the first rule whose ``match`` is a
substring of the prompt answers with its ``output``, encoded by the model folder's tokenizer
into the token ids the rank then emits (followed by the eos token, so the request finishes
``"stop"``; ``max_new_tokens`` and ``stop_token_ids`` still end it earlier)::

    [
      {"match": "weather in Paris",
       "output": "<tool_call>\\n{\\"name\\": \\"get_weather\\"}\\n</tool_call>"},
      {"match": "Think first", "output": "<think>\\nHmm.\\n</think>\\n\\nFour."}
    ]

The prompt is the request's token ids decoded with special tokens kept (so a marker may name
a chat-template tag, e.g. ``"<|im_start|>tool"`` for a prompt that carries a tool result). A
rule with ``"match": ""`` matches every prompt. A prompt no rule matches gets the rank's usual
output (:func:`tsfront.sim.scheduler.default_token`). The text is encoded without special
tokens added, so a tag that is one added token in ``tokenizer.json`` (``<tool_call>``) is
emitted as that one token, as a model would.

:class:`Script` is the pure function ``prompt ids -> output ids | None`` the scheduler is
given (``Scheduler(script=...)``, ``EngineOptions(script=...)``); it pickles without its
tokenizer (reloaded from the folder), so process-mode ranks can take it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Script", "ScriptError", "load_rules"]


class ScriptError(ValueError):
    """A script file that cannot be used: says what is wrong and how to write it."""


def load_rules(path: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """The ``(match, output)`` rules of script file ``path``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScriptError(f"script {path}: cannot read it as JSON ({exc})") from exc
    if not isinstance(data, list):
        raise ScriptError(
            f'script {path}: expected a JSON list of {{"match": TEXT, "output": TEXT}} rules'
        )
    rules = []
    for i, rule in enumerate(data):
        if not (
            isinstance(rule, dict)
            and isinstance(rule.get("match"), str)
            and isinstance(rule.get("output"), str)
        ):
            raise ScriptError(
                f'script {path}: rule {i} must be {{"match": TEXT, "output": TEXT}}, got {rule!r}'
            )
        rules.append((rule["match"], rule["output"]))
    return rules


class Script:
    """``script(prompt_ids)`` → the scripted output ids, or ``None`` (no rule matched).

    Args:
        rules: ``(match, output)`` pairs, first match wins.
        model_dir: the model folder whose ``tokenizer.json`` encodes outputs and decodes
            prompts.
    """

    def __init__(self, rules: Sequence[tuple[str, str]], model_dir: str | os.PathLike[str]):
        self.model_dir = str(model_dir)
        self._tokenizer: Any = None
        tok = self._load()
        self.rules: list[tuple[str, list[int]]] = [
            (match, tok.encode(output, add_special_tokens=False).ids) for match, output in rules
        ]

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], model_dir: str | os.PathLike[str]) -> Script:
        """The script in JSON file ``path`` (see the module docstring) for ``model_dir``."""
        return cls(load_rules(path), model_dir)

    def _load(self) -> Any:
        if self._tokenizer is None:
            from tsfront.text.model import TextModel

            self._tokenizer = TextModel.load(self.model_dir).tokenizer
        return self._tokenizer

    def __call__(self, prompt_ids: Sequence[int]) -> list[int] | None:
        """The output ids of the first rule whose marker is in the decoded prompt."""
        prompt = self._load().decode(list(prompt_ids), skip_special_tokens=False)
        for match, ids in self.rules:
            if match in prompt:
                return list(ids)
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {"model_dir": self.model_dir, "rules": self.rules, "_tokenizer": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
