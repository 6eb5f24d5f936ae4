"""A model folder's tokenizer, read from the file the folder ships.

Three formats, tried in this order (`load_tokenizer`):

- ``tokenizer.json``: a ``tokenizers`` ("fast") tokenizer, loaded as it is;
- ``tekken.json`` (Mistral's Tekken: Mistral-Nemo, Pixtral, Mistral-Small-3, Devstral,
  Magistral): base64 token bytes by rank, a split pattern, control tokens first;
- ``tiktoken.model`` (Kimi-K2 / K2.5 / Linear, Moonlight: a custom ``TikTokenTokenizer``
  class in ``tokenization_kimi.py``): tiktoken's file, ``base64(bytes) rank`` per line, with
  the split pattern and the number of reserved tokens in the class (read from its source
  with ``ast``, never run), the reserved tokens' names in ``tokenizer_config.json``.

The two tiktoken-style formats are converted once, at load, into a ``tokenizers.Tokenizer``
(byte-level BPE): every later step (encode, the table detokenizer, special tokens,
``max_token_chars``) is the ``tokenizers`` path's, with its guarantees. The conversion is
transformers' for Llama-3 and gpt-oss: the vocabulary in the GPT-2 byte alphabet, and for
each token every split into two tokens as a merge, ordered by the token's rank, so that BPE
merges the adjacent pair whose joined bytes rank lowest, as tiktoken does; the split pattern
a ``Split`` pre-tokenizer (Oniguruma takes tiktoken's patterns, Kimi's ``&&`` class
intersections included). `tests/unit/test_text_tokenizer_files.py` checks the ids against
tiktoken's and mistral-common's own encoders. The control tokens are added tokens, matched in
text as every ``tokenizers`` special token is (mistral-common encodes text without them: its
prompts are built as ids).
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tsfront.text._deps import require
from tsfront.text.detok import byte_alphabet
from tsfront.text.errors import TokenizerNotFound

__all__ = [
    "KIMI_PATTERN",
    "TOKENIZER_FILES",
    "ShippedTokenizer",
    "bpe_tokenizer",
    "bpe_tokenizer_json",
    "load_tokenizer",
    "read_tiktoken_file",
]

#: The files a tokenizer is read from, in the order they are looked for.
TOKENIZER_FILES = ("tokenizer.json", "tekken.json", "tiktoken.model")

#: Kimi's split pattern (``TikTokenTokenizer.pat_str`` in Moonshot's tokenization_kimi.py),
#: for a folder whose class source is not there to read it from.
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
_KIMI_RESERVED = 256  # TikTokenTokenizer.num_reserved_special_tokens

# mistral-common's control tokens of a Tekken file that lists none (versions up to v7).
_TEKKEN_CONTROL = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)


@dataclass(frozen=True)
class AddedToken:
    """A token matched whole in text (a control or reserved token), at a fixed id."""

    id: int
    content: str
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False


@dataclass(frozen=True)
class ShippedTokenizer:
    """What `load_tokenizer` read.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer``.
        path: the file it came from.
        format: ``"tokenizer.json"``, ``"tekken"`` or ``"tiktoken"``.
        defaults: ``tokenizer_config.json`` keys the format itself names (Tekken's ``<s>`` and
            ``</s>``), for a folder whose config does not.
    """

    tokenizer: Any
    path: Path
    format: str
    defaults: dict[str, Any] = field(default_factory=dict)


def load_tokenizer(folder: Path, tokenizer_config: Mapping[str, Any]) -> ShippedTokenizer:
    """The tokenizer of ``folder``, from the first of `TOKENIZER_FILES` it has.

    Raises `TokenizerNotFound` (a ``TextError``) when it has none, or the file cannot be read;
    the message says what to do.
    """
    tokenizers = require("tokenizers")
    for name in TOKENIZER_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name == "tokenizer.json":
                return ShippedTokenizer(
                    tokenizers.Tokenizer.from_file(str(path)), path, "tokenizer.json"
                )
            if name == "tekken.json":
                return _tekken(path)
            return _kimi(path, tokenizer_config)
        except TokenizerNotFound:
            raise
        except Exception as e:
            raise TokenizerNotFound(
                f"{path} cannot be loaded by tokenizers {tokenizers.__version__}: {e}; "
                "re-save it with a current transformers or upgrade tokenizers"
            ) from e
    raise TokenizerNotFound(
        f"{folder} has no tokenizer.json (nor {', '.join(TOKENIZER_FILES[1:])}): tsfront "
        "needs a tokenizer; write one with transformers' "
        "AutoTokenizer.from_pretrained(...).save_pretrained(folder)"
    )


def read_tiktoken_file(path: Path) -> list[bytes]:
    """The token bytes of a tiktoken file (``base64 rank`` a line), indexed by rank.

    Raises `TokenizerNotFound` on a malformed line or ranks that are not 0..n-1.
    """
    by_rank: dict[int, bytes] = {}
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
            except (IndexError, ValueError, binascii.Error):
                raise TokenizerNotFound(
                    f"{path}, line {number}: not 'base64-bytes rank'; is it a tiktoken file?"
                ) from None
            by_rank[rank] = token
    tokens = [by_rank.get(i) for i in range(len(by_rank))]
    if any(t is None for t in tokens):
        raise TokenizerNotFound(f"{path}: its ranks are not 0..{len(by_rank) - 1}")
    return tokens  # type: ignore[return-value]


def _tekken(path: Path) -> ShippedTokenizer:
    data = json.loads(path.read_text(encoding="utf-8"))
    config = data["config"]
    n_special = int(config["default_num_special_tokens"])
    size = int(config["default_vocab_size"])
    given = data.get("special_tokens")
    names = (
        [t["token_str"] for t in sorted(given, key=lambda t: t["rank"])]
        if given is not None
        else list(_TEKKEN_CONTROL)
    )
    names += [f"<SPECIAL_{i}>" for i in range(len(names), n_special)]
    vocab = data["vocab"][: size - n_special]
    tokens = [base64.b64decode(v["token_bytes"]) for v in vocab]
    added = [AddedToken(i, name) for i, name in enumerate(names[:n_special])]
    tokenizer = bpe_tokenizer(tokens, config["pattern"], added, first_id=n_special)
    defaults = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if "<pad>" in names:
        defaults["pad_token"] = "<pad>"
    return ShippedTokenizer(tokenizer, path, "tekken", defaults)


def _kimi(path: Path, tokenizer_config: Mapping[str, Any]) -> ShippedTokenizer:
    tokens = read_tiktoken_file(path)
    pattern, reserved = _tiktoken_class(path.parent, tokenizer_config)
    declared = tokenizer_config.get("added_tokens_decoder") or {}
    n = len(tokens)
    added: dict[int, AddedToken] = {
        i: AddedToken(i, f"<|reserved_token_{i}|>") for i in range(n, n + reserved + 2)
    }
    for key, entry in declared.items():
        try:
            i = int(key)
        except ValueError:
            continue
        if i >= n and isinstance(entry, dict) and isinstance(entry.get("content"), str):
            added[i] = AddedToken(
                i,
                entry["content"],
                special=bool(entry.get("special", True)),
                lstrip=bool(entry.get("lstrip", False)),
                rstrip=bool(entry.get("rstrip", False)),
            )
    tokenizer = bpe_tokenizer(tokens, pattern, [added[i] for i in sorted(added)])
    return ShippedTokenizer(tokenizer, path, "tiktoken")


def _tiktoken_class(folder: Path, tokenizer_config: Mapping[str, Any]) -> tuple[str, int]:
    """``(pattern, reserved tokens)`` of the folder's tiktoken tokenizer class: its
    ``pat_str`` and ``num_reserved_special_tokens`` read from the module's source (literals
    only), or Kimi's when the class is Kimi's and its source is not in the folder."""
    auto = (tokenizer_config.get("auto_map") or {}).get("AutoTokenizer")
    ref = auto[0] if isinstance(auto, list) and auto else auto
    if not isinstance(ref, str) or "." not in ref:
        raise TokenizerNotFound(
            f"{folder} has a tiktoken.model but its tokenizer_config.json names no tokenizer "
            "class (auto_map.AutoTokenizer), whose split pattern tsfront needs; add a "
            "tokenizer.json (transformers' save_pretrained writes one)"
        )
    module, cls = ref.rsplit(".", 1)
    module = module.rsplit("--", 1)[-1]  # "repo--module" names another repository's file
    source = folder / f"{module.replace('.', '/')}.py"
    found: dict[str, Any] = {}
    if source.is_file():
        found = _class_literals(source.read_text(encoding="utf-8"), cls)
    pattern = found.get("pat_str")
    reserved = found.get("num_reserved_special_tokens")
    if pattern is None and "kimi" in module.lower():
        pattern = KIMI_PATTERN
    if not isinstance(pattern, str):
        raise TokenizerNotFound(
            f"{folder}: no split pattern for {ref} (a pat_str literal in {source.name}); "
            "add a tokenizer.json (transformers' save_pretrained writes one)"
        )
    return pattern, reserved if isinstance(reserved, int) else _KIMI_RESERVED


def _class_literals(source: str, cls: str) -> dict[str, Any]:
    """The class-level assignments of ``cls`` in ``source`` whose value is a literal, or a
    ``"sep".join([...literals])`` of one (how Kimi writes ``pat_str``); nothing is run."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for stmt in node.body:
            target: ast.expr | None = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target, value = stmt.target, stmt.value
            if not isinstance(target, ast.Name):
                continue
            literal = _literal(value)
            if literal is not None:
                out[target.id] = literal
    return out


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and not node.keywords
    ):
        sep, parts = _literal(node.func.value), _literal(node.args[0])
        if (
            isinstance(sep, str)
            and isinstance(parts, (list, tuple))
            and all(isinstance(p, str) for p in parts)
        ):
            return sep.join(parts)
    return None


def bpe_tokenizer_json(
    tokens: Sequence[bytes],
    pattern: str,
    added: Sequence[AddedToken] = (),
    *,
    first_id: int = 0,
) -> str:
    """The ``tokenizer.json`` text of a tiktoken-style vocabulary: ``tokens[r]`` the bytes of
    rank ``r`` (id ``first_id + r``), ``pattern`` its split regex, ``added`` its control
    tokens. See the module docstring for the conversion."""
    alphabet = dict(enumerate(byte_alphabet()))
    rank = {t: r for r, t in enumerate(tokens)}
    # latin-1 maps each byte to the code point of the same number; translate then maps it.
    text = [t.decode("latin-1").translate(alphabet) for t in tokens]
    merges: list[list[str]] = []
    for r, t in enumerate(tokens):
        if len(t) < 2:
            continue
        splits = []
        for k in range(1, len(t)):
            left, right = rank.get(t[:k]), rank.get(t[k:])
            if left is not None and right is not None:
                splits.append((left, right, k))
        splits.sort()
        s = text[r]
        merges.extend([s[:k], s[k:]] for _, _, k in splits)
    vocab = {s: first_id + r for r, s in enumerate(text)}
    for a in added:
        # In the model's vocabulary too: tokenizers gives an added token that is not there
        # the next free id, whatever id it was given (Tekken's come before the vocabulary).
        if vocab.setdefault(a.content, a.id) != a.id:
            raise TokenizerNotFound(
                f"control token {a.content!r} (id {a.id}) is also token "
                f"{vocab[a.content]} of the vocabulary; add a tokenizer.json to the folder"
            )
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": a.id,
                "content": a.content,
                "single_word": False,
                "lstrip": a.lstrip,
                "rstrip": a.rstrip,
                "normalized": False,
                "special": a.special,
            }
            for a in added
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": True,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return json.dumps(spec, ensure_ascii=False)


def bpe_tokenizer(
    tokens: Sequence[bytes],
    pattern: str,
    added: Sequence[AddedToken] = (),
    *,
    first_id: int = 0,
) -> Any:
    """A ``tokenizers.Tokenizer`` of a tiktoken-style vocabulary (`bpe_tokenizer_json`)."""
    tokenizers = require("tokenizers")
    return tokenizers.Tokenizer.from_str(
        bpe_tokenizer_json(tokens, pattern, added, first_id=first_id)
    )
