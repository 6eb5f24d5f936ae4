"""The simulator accepts a request its frontend already normalised, as the engine does.

SMG sends ``is_normalized=True`` with the engine's own "top_k disabled" value (``1 << 30``);
TokenSpeed skips normalisation for it and its ``verify()`` passes, so the simulated rank must
serve it too (the bench runs SMG against simulated ranks), while still refusing what
``verify()`` refuses.
"""

from __future__ import annotations

from tsfront.sim.scheduler import engine_rejection
from tsfront.wire import SamplingParams, TokenizedGenerateReqInput


def request(**sampling: object) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(
        rid="r1", input_ids=[5, 6], stream=True, sampling_params=SamplingParams(**sampling)
    )


def test_normalized_request_with_top_k_disabled_is_served() -> None:
    assert engine_rejection(request(max_new_tokens=4, top_k=1 << 30, is_normalized=True)) is None


def test_normalized_request_still_checked_by_verify_rules() -> None:
    why = engine_rejection(request(max_new_tokens=4, top_k=0, is_normalized=True))
    assert why is not None and "top_k" in why
    why = engine_rejection(request(max_new_tokens=4, top_p=3.0, is_normalized=True))
    assert why is not None and "top_p" in why
