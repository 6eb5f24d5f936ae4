"""A model's text side, loaded from its folder.

:class:`TextModel` reads the files a Hugging Face model folder carries for its tokenizer (the
tokenizer's two and the chat template may come from another folder, as vLLM's
``--tokenizer``):

- the tokenizer (required): ``tokenizer.json`` through the ``tokenizers`` package, or
  Mistral's ``tekken.json`` or Kimi's ``tiktoken.model`` converted into one at load
  (`tsfront.text.tokenizer_files`);
- ``tokenizer_config.json``: ``bos_token``, ``eos_token``, ``chat_template``,
  ``model_max_length``; a ``chat_template.jinja`` file overrides its ``chat_template``;
- ``generation_config.json`` and ``config.json``: the eos token ids and the context length.

The eos token ids come from the first of ``generation_config.json``, ``config.json`` and
``tokenizer_config.json``'s ``eos_token`` that names any; the stop token ids add the others
(as vLLM does: Llama-3-Instruct ends a turn with ``<|eot_id|>``, named only in the tokenizer
config).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tsfront.text import chat
from tsfront.text._deps import require
from tsfront.text.detok import (
    Detokenizer,
    StreamDetokenizer,
    TableDetokenizer,
    TokenTable,
    kept_table,
    token_tables,
    vocabulary_limit,
)
from tsfront.text.encode_cache import MIN_CACHED_CHARS
from tsfront.text.errors import ChatTemplateError, TextError
from tsfront.text.hub import local_folder
from tsfront.text.tokenizer_files import load_tokenizer

# A model_max_length at or above this is transformers' "no limit" placeholder (1e30).
_SANE_MAX_LEN = 10_000_000
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
)
_TOKEN_TEXT_CACHE = 65536


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TextError(f"{path} is not valid JSON ({e}); fix or remove it") from e
    if not isinstance(data, dict):
        raise TextError(f"{path} holds a {type(data).__name__}, not an object; fix or remove it")
    return data


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _ids(value: Any) -> list[int]:
    """eos_token_id as configs write it: an int, a list of ints, or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _dedup(ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(ids))


class TextModel:
    """The tokenizer, chat template and stop tokens of one model folder.

    Attributes:
        name: the folder's name (a default ``model`` for the API).
        eos_token_ids: the model's end-of-sequence token ids.
        stop_token_ids: ``eos_token_ids`` plus every other eos id the configs name.
        bos_token, eos_token: the special tokens' text, as templates see them.
        max_model_len: the context length, when the configs give a sane one.
        chat_template: the template source (a string, or the list of named templates).
        tokenizer: the ``tokenizers.Tokenizer``.
        folder, tokenizer_folder: the folders `load` read (``None`` for a model made
            otherwise; a Hugging Face id's snapshot in its cache); the tokenizer's is the
            model's unless ``load`` was given another.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        tokenizer_config: dict[str, Any] | None = None,
        generation_config: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        chat_template: Any = None,
    ) -> None:
        tokenizer_config = tokenizer_config or {}
        generation_config = generation_config or {}
        config = config or {}
        self.tokenizer = tokenizer
        self.name = name
        self.folder: Path | None = None
        self.tokenizer_folder: Path | None = None
        #: The file format the tokenizer was read from (`tsfront.text.tokenizer_files`).
        self.tokenizer_format = "tokenizer.json"
        self.tokenizer_config = tokenizer_config
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token"):
            content = _token_content(tokenizer_config.get(key))
            if content is not None:
                self.special_tokens[key] = content
        self.bos_token: str | None = self.special_tokens.get("bos_token")
        self.eos_token: str | None = self.special_tokens.get("eos_token")
        self.chat_template = (
            chat_template if chat_template is not None else tokenizer_config.get("chat_template")
        )

        from_tokenizer: list[int] = []
        if self.eos_token is not None:
            tid = tokenizer.token_to_id(self.eos_token)
            if tid is not None:
                from_tokenizer.append(tid)
        sources = [
            _ids(generation_config.get("eos_token_id")),
            _ids(config.get("eos_token_id")),
            _ids((config.get("text_config") or {}).get("eos_token_id"))
            if isinstance(config.get("text_config"), dict)
            else [],
            from_tokenizer,
        ]
        self.eos_token_ids: tuple[int, ...] = _dedup(next((s for s in sources if s), []))
        extra = _ids(generation_config.get("stop_token_ids"))
        self.stop_token_ids: tuple[int, ...] = _dedup(
            [*self.eos_token_ids, *(i for s in sources for i in s), *extra]
        )
        self.max_model_len: int | None = self._context_length(config, tokenizer_config)

        decoders = require("tokenizers.decoders")
        self._decode_stream: type | None = getattr(decoders, "DecodeStream", None)
        self._token_text: dict[int, str] = {}
        self._anchor_ids: list[int] | None = None
        self._prompt_encoder: Any = None
        self._byte_level = type(tokenizer.decoder) is decoders.ByteLevel
        # Keyed by skip_special_tokens; built at load (see docs/TEXT.md for the time it takes).
        self._tables: dict[bool, TokenTable] = token_tables(tokenizer) or {}
        self._kept_tables: dict[frozenset[int], TokenTable] = {}
        self._special = frozenset(
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        )
        self._id_limit = vocabulary_limit(tokenizer)
        # The most characters of text one token can stand for: a token's text in the vocabulary
        # is at least as long as the input it covers (byte-level: one character per byte).
        self.max_token_chars: int = max(
            map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1
        )
        """The longest token in characters: a text longer than ``context x max_token_chars``
        cannot fit a context of ``context`` tokens (a cheap check before encoding it)."""
        self.detokenizer_algorithm: str = (
            "table"
            if self._tables
            else "decode_stream"
            if self._decode_stream is not None
            else "offsets"
        )
        """Which algorithm :meth:`detokenizer` uses for this model (see tsfront.text.detok)."""

    @property
    def vocab_size(self) -> int:
        """One past the largest token id (model vocabulary and added tokens)."""
        return self._id_limit

    @property
    def template_names(self) -> frozenset[str]:
        """The variables `apply_chat_template` itself gives the template (messages, tools, the
        special tokens, its globals, ...): extra keyword arguments may not set them."""
        return chat.RENDERER_NAMES | chat.SPECIAL_TOKEN_NAMES | frozenset(self.special_tokens)

    @staticmethod
    def _context_length(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int | None:
        found: list[int] = []
        for cfg in (config, config.get("text_config")):
            if not isinstance(cfg, dict):
                continue
            for key in _CONTEXT_KEYS:
                v = cfg.get(key)
                if isinstance(v, int) and not isinstance(v, bool) and 0 < v < _SANE_MAX_LEN:
                    found.append(v)
        if found:
            return min(found)
        v = tokenizer_config.get("model_max_length")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < _SANE_MAX_LEN:
            return int(v)
        return None

    @classmethod
    def load(
        cls,
        model_dir: str | os.PathLike[str],
        tokenizer_dir: str | os.PathLike[str] | None = None,
    ) -> TextModel:
        """Load the model folder ``model_dir`` (see the module docstring for its files).

        ``tokenizer_dir``: another folder for the tokenizer's files (``tokenizer.json`` or
        another `tsfront.text.tokenizer_files.TOKENIZER_FILES`,
        ``tokenizer_config.json``, the chat template), as vLLM's ``--tokenizer``; the model's
        ``config.json`` and ``generation_config.json`` still come from ``model_dir``. Either
        may be a Hugging Face id instead (``Qwen/Qwen3-8B``): its text files are fetched into,
        or found in, Hugging Face's cache (`tsfront.text.hub`); the model is then named by it.
        """
        folder, from_hub = local_folder(model_dir)
        tok_folder = folder if tokenizer_dir is None else local_folder(tokenizer_dir)[0]
        tokenizer_config = _read_json(tok_folder / "tokenizer_config.json")
        shipped = load_tokenizer(tok_folder, tokenizer_config)
        template: Any = None
        jinja_file = tok_folder / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        else:
            template = _read_json(tok_folder / "chat_template.json").get("chat_template")
        model = cls(
            shipped.tokenizer,
            name=os.fspath(model_dir) if from_hub else folder.resolve().name,
            tokenizer_config={**shipped.defaults, **tokenizer_config},
            generation_config=_read_json(folder / "generation_config.json"),
            config=_read_json(folder / "config.json"),
            chat_template=template,
        )
        model.folder, model.tokenizer_folder = folder, tok_folder
        model.tokenizer_format = shipped.format
        return model

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds the tokenizer's bos etc. (leave it
        off for a rendered chat template, which already holds them)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def use_encode_cache(self, cache: Any, templates: Sequence[Any] = ()) -> str:
        """Encode long rendered prompts (`encode_prompt`) through ``cache`` (a
        `tsfront._native.EncodeCache`; ``None`` turns it off): only the text after the longest
        prefix already in it is encoded (`tsfront.text.encode_cache`). The anchors are the
        added tokens the chat templates (``templates``, else the model's) or the special
        tokens write. Returns ``""``, or why this tokenizer cannot be cached exactly."""
        from tsfront.text.encode_cache import PromptEncoder, exact_anchors

        self._prompt_encoder = None
        if cache is None:
            return "off"
        sources = [t for t in (*templates, self.chat_template) if t]
        text = json.dumps(sources) + "".join(self.special_tokens.values())
        wanted = [
            t.content
            for t in self.tokenizer.get_added_tokens_decoder().values()
            if t.content and t.content in text
        ]
        anchors, why = exact_anchors(self.tokenizer, wanted)
        if anchors is not None:
            self._prompt_encoder = PromptEncoder(self.tokenizer, anchors, cache)
        return why

    @property
    def prompt_encoder(self) -> Any:
        """The `PromptEncoder` of `use_encode_cache` (``None``: prompts are encoded whole)."""
        return self._prompt_encoder

    def encode_prompt(self, text: str) -> list[int]:
        """The ids of a rendered chat prompt, ``encode(text, add_special_tokens=False)``
        exactly: through the encode cache when the model has one and the prompt is long, and
        without the tokenizer's character offsets (``encode_batch_fast``, which releases the
        GIL too). ``UnicodeEncodeError`` for a prompt with a lone surrogate."""
        if len(text) < MIN_CACHED_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        if self._prompt_encoder is not None:
            return self._prompt_encoder.encode(text)
        text.encode("utf-8")  # the tokenizer's TypeError for a lone surrogate, made plain
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """Token ids of each of ``texts`` (as :meth:`encode`), in one call that releases the
        GIL while it tokenizes: on a thread, a long text does not stall the event loop (a
        plain ``encode`` holds the GIL throughout: 16 MB of text is seconds)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` decoded at once."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(
        self,
        prompt_ids: Sequence[int] | None = None,
        skip_special_tokens: bool = True,
        *,
        algorithm: str | None = None,
        keep: Iterable[int] = (),
    ) -> Detokenizer:
        """A new incremental :class:`Detokenizer` for one output stream, decoding after the
        tail of ``prompt_ids``.

        ``keep``: special token ids whose text is given even when ``skip_special_tokens``
        drops the others (a tool or reasoning parser's markers, :meth:`special_ids`).
        ``algorithm`` (``"table"``, ``"decode_stream"`` or ``"offsets"``) overrides
        :attr:`detokenizer_algorithm`, for measurements and tests.
        """
        algorithm = algorithm or self.detokenizer_algorithm
        kept = frozenset(keep) & self._special if skip_special_tokens else frozenset()
        if kept:
            return self._detokenizer_keeping(prompt_ids, kept, algorithm)
        if algorithm == "table":
            if not self._tables:
                raise TextError(
                    f"model {self.name!r} has a decoder the table algorithm does not support "
                    f"({self.tokenizer.decoder}): use algorithm='decode_stream'"
                )
            return TableDetokenizer(self._tables[skip_special_tokens], prompt_ids)
        if algorithm == "decode_stream":
            if self._decode_stream is None:
                raise TextError(
                    "this tokenizers package has no DecodeStream: pip install 'tokenizers>=0.21.4'"
                )
            return StreamDetokenizer(
                self.tokenizer,
                self._decode_stream,
                prompt_ids,
                skip_special_tokens,
                self._id_limit,
            )
        if algorithm == "offsets":
            return StreamDetokenizer(
                self.tokenizer, None, prompt_ids, skip_special_tokens, self._id_limit
            )
        raise TextError(f"algorithm={algorithm!r}: use 'table', 'decode_stream' or 'offsets'")

    def _detokenizer_keeping(
        self, prompt_ids: Sequence[int] | None, kept: frozenset[int], algorithm: str
    ) -> Detokenizer:
        # Special tokens skipped but ``kept``: a table of its own (made once per set), or the
        # other special ids dropped before decoding.
        if algorithm == "table" and self._tables:
            table = self._kept_tables.get(kept)
            if table is None:
                table = self._kept_tables[kept] = kept_table(self._tables, kept)
            return TableDetokenizer(table, prompt_ids)
        stream = self._decode_stream if algorithm != "offsets" else None
        drop = self._special - kept
        return StreamDetokenizer(self.tokenizer, stream, prompt_ids, False, self._id_limit, drop)

    def special_ids(self, texts: Iterable[str]) -> frozenset[int]:
        """The ids of the special tokens whose text is one of ``texts`` (``skip_special_tokens``
        drops them; other texts are not single special tokens here)."""
        wanted = set(texts)
        return frozenset(
            i
            for i, t in self.tokenizer.get_added_tokens_decoder().items()
            if t.special and t.content in wanted
        )

    def token_text(self, token_id: int) -> str:
        """The text of one token as it shows inside a stream, for logprobs display (cached).

        Decoded after an ordinary token, so a SentencePiece ``▁the`` shows as ``" the"`` (on
        its own the decoder would strip the space, as it does at the start of a text).
        """
        text = self._token_text.get(token_id)
        if text is None:
            decode = self.tokenizer.decode
            if self._byte_level:
                text = decode([token_id], skip_special_tokens=False)
            else:
                anchor = self._anchor()
                base = decode(anchor, skip_special_tokens=False)
                full = decode([*anchor, token_id], skip_special_tokens=False)
                text = full[len(base) :] if full.startswith(base) else decode([token_id])
            if len(self._token_text) < _TOKEN_TEXT_CACHE:
                self._token_text[token_id] = text
        return text

    def _anchor(self) -> list[int]:
        if self._anchor_ids is None:
            self._anchor_ids = self.tokenizer.encode("a", add_special_tokens=False).ids
        return self._anchor_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs ``bytes``): exact for byte-level
        BPE and for ``<0xNN>`` byte-fallback tokens, else the UTF-8 of :meth:`token_text`."""
        if self._byte_level:
            pieces = self._tables[False].pieces
            return pieces[token_id] if 0 <= token_id < len(pieces) else b""
        token = self.tokenizer.id_to_token(token_id)
        if token is not None and len(token) == 6 and token.startswith("<0x") and token[5] == ">":
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        return self.token_text(token_id).encode("utf-8")

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        *,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Render ``messages`` with the model's chat template (or ``chat_template``).

        Raises :class:`ChatTemplateError` when the model has no template, the template
        refuses the messages (its ``raise_exception``) or fails on them, or ``kwargs`` names a
        variable the renderer sets itself (`template_names`).
        """
        taken = self.template_names.intersection(kwargs)
        if taken:
            raise ChatTemplateError(
                f"{', '.join(sorted(taken))}: set by the renderer itself, not by extra template "
                "variables; drop them"
            )
        source = chat.select_template(
            chat_template if chat_template is not None else self.chat_template, tools
        )
        if not source:
            raise ChatTemplateError(
                f"model {self.name!r} has no chat template: add chat_template to its "
                "tokenizer_config.json (or a chat_template.jinja), or use /v1/completions"
            )
        if not isinstance(messages, list):
            raise ChatTemplateError(
                f"messages must be a list of objects, got {type(messages).__name__}"
            )
        variables: dict[str, Any] = {**self.special_tokens, **kwargs}
        variables["messages"] = messages
        variables["tools"] = tools
        variables["add_generation_prompt"] = add_generation_prompt
        return chat.render(source, variables)
