"""The simulated scheduler's deterministic rules, shared by the harness and the tests.

Pure standard-library code (no engine import), so tests running in tsfront's
main venv can compute exactly which tokens, logprobs and finish reasons the
harness (running in ``.interop-venv``) will produce.
"""

from __future__ import annotations

#: Vocabulary size the harness reports to the engine's own ``verify()``.
DEFAULT_VOCAB_SIZE = 1000
#: Lowest token id the simulated model ever emits (0..2 are left for specials).
FIRST_TOKEN = 3
#: Cap the engine substitutes for ``max_new_tokens=None`` before context clamping.
UNBOUNDED_MAX_NEW = 1 << 30
#: Non-stream requests still get a frame at these multiples (engine: DEFAULT_FORCE_STREAM_INTERVAL).
FORCE_STREAM_INTERVAL = 50


def token_at(prompt_len: int, index: int, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    """Token the simulated model emits as output number ``index`` (0-based) for a prompt."""
    return FIRST_TOKEN + (prompt_len + index) % (vocab_size - FIRST_TOKEN)


def logprob_of(token: int) -> float:
    """Sampled-token logprob reported for ``token`` (an exact binary fraction)."""
    return -((token % 7) + 1) / 8.0


def effective_max_new(max_new_tokens: int | None, prompt_len: int, max_model_len: int) -> int:
    """The engine's clamp: ``min(requested or 2**30, max_model_len - prompt_len - 2)``."""
    requested = UNBOUNDED_MAX_NEW if max_new_tokens is None else max_new_tokens
    return min(requested, max_model_len - prompt_len - 2)


def should_emit(stream: bool, output_length: int, stream_interval: int) -> bool:
    """Whether an unfinished request gets a frame after reaching ``output_length`` tokens.

    Mirrors the engine's cadence: streaming requests every ``stream_interval``
    tokens (``% interval == 1`` when the interval is above 1), non-streaming
    ones on the first token and every 50th.
    """
    if stream:
        if stream_interval > 1:
            return output_length % stream_interval == 1
        return True
    return output_length == 1 or output_length % FORCE_STREAM_INTERVAL == 0


def expected_tokens(
    prompt_len: int,
    max_new_tokens: int | None,
    *,
    stop_token_ids: set[int] | None = None,
    eos_token_id: int | None = None,
    ignore_eos: bool = False,
    max_model_len: int = 4096,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> tuple[list[int], str]:
    """All tokens a request will get and its finish reason (``"length"`` or ``"stop"``).

    Same order as the engine's ``check_finished``: the length cap first, then
    (unless ``ignore_eos``, which in the engine also disables
    ``stop_token_ids``) stop tokens and EOS.
    """
    limit = effective_max_new(max_new_tokens, prompt_len, max_model_len)
    tokens: list[int] = []
    while True:
        token = token_at(prompt_len, len(tokens), vocab_size)
        tokens.append(token)
        if len(tokens) >= limit:
            return tokens, "length"
        if not ignore_eos:
            if stop_token_ids and token in stop_token_ids:
                return tokens, "stop"
            if eos_token_id is not None and token == eos_token_id:
                return tokens, "stop"
