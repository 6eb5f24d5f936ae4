"""The agent workload of ``tsfront bench serve --preset agentic``: a real tokenizer, tools, history.

An agent sends a system prompt of thousands of tokens, the same tools on every request, and
its whole conversation again every turn, for short answers and tool calls. This module makes:

- the model folder (`make_agentic_model`): DeepSeek-V3's real byte-level BPE
  (`tsfront.bench.realtok`, 129,280 tokens) with ChatML's ``<|im_start|>`` / ``<|im_end|>``
  added as special tokens and Hermes' ``<tool_call>`` / ``</tool_call>`` as added tokens, and
  a Qwen2.5-style chat template with tools (``<tools>`` in the system message, calls as
  ``<tool_call>{json}</tool_call>``, results as ``<tool_response>``): both servers parse the
  calls (tsfront ``--tool-call-parser hermes``, SMG ``qwen``);
- the simulated ranks' script (`script_rules`): the last message of each request carries a
  marker ``[[turn K:call]]`` or ``[[turn K:text]]``; rules for higher K come first, so the
  newest marker of the history picks the answer: a tool call on two turns in three;
- the texts (`Workload`): seeded prose made of the tokenizer's own words (about 5 characters a
  token), a system prompt of a given size in tokens (shared by every conversation, or each its
  own: the cold variant), 8 tools with JSON schemas, user messages and tool results of a few
  hundred characters.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TOOL_PARSERS", "Workload", "call_text", "make_agentic_model", "script_rules", "tools"]

#: The tool-call parser names of this format, per server.
TOOL_PARSERS = {"tsfront": "hermes", "smg": "qwen"}

TEMPLATE = (
    # Text with a newline is in an expression: trim_blocks would eat a newline after a tag.
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}"
    "You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": '
    '<function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{% elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% elif message.role == 'assistant' %}{{ '<|im_start|>assistant' }}"
    "{% if message.content %}{{ '\\n' + message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}"
    "{% if call.function is defined %}{% set call = call.function %}{% endif %}"
    '{{ \'\\n<tool_call>\\n{\\"name\\": \\"\' + call.name + \'\\", \\"arguments\\": \' }}'
    "{% if call.arguments is string %}{{ call.arguments }}{% else %}"
    "{{ call.arguments | tojson }}{% endif %}{{ '}\\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TOOLS = [
    ("read_file", "Read a file of the repository.", {"path": "string", "start": "integer"}),
    ("write_file", "Write a file of the repository.", {"path": "string", "content": "string"}),
    ("run_command", "Run a shell command in the sandbox.", {"command": "string"}),
    ("search_code", "Search the repository for a pattern.", {"pattern": "string"}),
    ("list_directory", "List a directory.", {"path": "string", "depth": "integer"}),
    ("apply_patch", "Apply a unified diff.", {"patch": "string"}),
    ("web_search", "Search the web.", {"query": "string", "results": "integer"}),
    ("ask_user", "Ask the user a question.", {"question": "string"}),
]


def tools() -> list[dict[str, Any]]:
    """The 8 tools of every request (OpenAI's shape)."""
    out = []
    for name, description, params in TOOLS:
        properties = {
            key: {"type": kind, "description": f"The {key.replace('_', ' ')} to use."}
            for key, kind in params.items()
        }
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": list(params),
                    },
                },
            }
        )
    return out


def call_text(k: int) -> str:
    """The scripted tool call of turn ``k`` (Hermes' format)."""
    name, _, params = TOOLS[k % len(TOOLS)]
    args = {key: (f"src/module_{k}.py" if kind == "string" else k) for key, kind in params.items()}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def script_rules(turns: int) -> list[dict[str, str]]:
    """The simulated ranks' rules: the newest ``[[turn K:...]]`` marker picks the answer."""
    rules = []
    for k in reversed(range(turns)):
        rules.append({"match": f"[[turn {k}:call]]", "output": call_text(k)})
        rules.append(
            {"match": f"[[turn {k}:text]]", "output": f"Done with step {k}: the change is made."}
        )
    return rules


def make_agentic_model(folder: Path, tokenizer_json: Path, turns: int = 64) -> Path:
    """Write the model folder and its script (``script.json``) into ``folder``."""
    from tokenizers import AddedToken, Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")]
    )
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "chat_template": TEMPLATE,
        "model_max_length": 131072,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "max_position_embeddings": 131072,
                "eos_token_id": eos,
                "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            }
        )
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (folder / "script.json").write_text(json.dumps(script_rules(turns)))
    return folder


@dataclass
class Workload:
    """Seeded texts of one run (the same in every process that makes it with these values)."""

    vocabulary: list[str]
    system_tokens: int
    seed: int = 0

    @classmethod
    def from_tokenizer(cls, tokenizer_json: Path, system_tokens: int, seed: int = 0) -> Workload:
        vocab = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))["model"]["vocab"]
        words = sorted(
            w[1:]
            for w in vocab
            if w.startswith("Ġ") and w[1:].isascii() and w[1:].isalpha() and 2 <= len(w) <= 12
        )
        random.Random(seed).shuffle(words)  # a word's rank in the Zipf-like choice
        return cls(words, system_tokens, seed)

    def prose(self, rng: random.Random, chars: int) -> str:
        """Sentences of the vocabulary's words (a Zipf-like choice, some code and numbers)."""
        words, out, total = self.vocabulary, [], 0
        while total < chars:
            n = rng.randint(6, 18)
            ranks = (min(len(words) - 1, int(rng.paretovariate(1.2) * 40)) for _ in range(n))
            picked = [words[r] for r in ranks]
            if rng.random() < 0.15:
                picked.append(f"`{rng.choice(words)}_{rng.randint(0, 999)}()`")
            sentence = " ".join(picked).capitalize() + rng.choice([".", ".", ",", ":", "?"])
            if rng.random() < 0.1:
                sentence += "\n\n"
            out.append(sentence)
            total += len(sentence) + 1
        return " ".join(out)

    def system_prompt(self, conversation: int | None) -> str:
        """The system prompt: shared (``conversation`` None) or a conversation's own."""
        rng = random.Random(f"system/{self.seed}/{conversation}")
        head = "You are a coding agent working in a repository. Follow these rules.\n\n"
        return head + self.prose(rng, int(self.system_tokens * 5.1))

    def user_text(self, conversation: int, turn: int) -> str:
        rng = random.Random(f"user/{self.seed}/{conversation}/{turn}")
        return self.prose(rng, rng.randint(150, 600))

    def tool_result(self, conversation: int, turn: int) -> str:
        rng = random.Random(f"tool/{self.seed}/{conversation}/{turn}")
        return self.prose(rng, rng.randint(200, 900))
