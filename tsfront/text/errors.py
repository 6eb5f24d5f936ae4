"""The errors of the text layer.

They are :class:`ValueError`\\ s so that a server can turn any of them into a 400 for a request
that caused it; every message says what was wrong and what to do.
"""

from __future__ import annotations


class TextError(ValueError):
    """A model folder, a chat template or a text-layer argument cannot be used as given."""


class ChatTemplateError(TextError):
    """The model has no chat template, or its template refused the messages.

    A template's own ``raise_exception("...")`` arrives here with the template's message.
    """


class TokenizerNotFound(TextError):
    """The model folder has no ``tokenizer.json`` (a "fast" tokenizer) that can be loaded."""


class TextDependencyMissing(TextError, ImportError):
    """``tokenizers`` or ``jinja2`` is not installed: the ``text`` extra brings them (the
    message says how: `tsfront.install.install_line`)."""
