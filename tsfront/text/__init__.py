"""tsfront.text: the text side of a server on tsfront.

Tokenizers and chat templates from a model folder, incremental detokenization per stream, and
stop strings matched in the streamed text (the engine refuses stop strings, so the frontend
matches them and aborts the request). ``tokenizers`` and ``jinja2`` come with the ``text``
extra (``pip install '.[text]'`` in tsfront's checkout); :class:`StopMatcher` needs neither.

Per output chunk a worker does::

    detok = model.detokenizer(prompt_ids, skip_special_tokens=True)
    stop = StopMatcher(["\\n\\n"], include_stop_str_in_output=False)
    ...
    text, matched = stop.feed(detok.step(chunk.token_ids))
    if matched:
        stream.abort()        # the engine stops generating
    ...
    tail = stop.feed(detok.flush())[0] + stop.flush()   # at the end of the stream
"""

from tsfront.text.detok import Detokenizer, StreamDetokenizer, TableDetokenizer
from tsfront.text.errors import (
    ChatTemplateError,
    TextDependencyMissing,
    TextError,
    TokenizerNotFound,
)
from tsfront.text.model import TextModel
from tsfront.text.stop import StopMatcher, StopSet

__all__ = [
    "ChatTemplateError",
    "Detokenizer",
    "StopMatcher",
    "StopSet",
    "StreamDetokenizer",
    "TableDetokenizer",
    "TextDependencyMissing",
    "TextError",
    "TextModel",
    "TokenizerNotFound",
]
