"""``tsfront bench serve --repeat N``: the ratios taken round by round, beside the ratios of
the medians.

Built from `Figures` of made-up rounds (the arithmetic is what is tested; the system test in
tests/system/test_bench_serve.py runs the command): each round's ratio uses that round's
figures only, a round that lost one side of a ratio (a target that failed to start) does
not count for it, and the table prints every round with the median and the range.
"""

from __future__ import annotations

import pytest

from tsfront.bench.serve import Figures, median_ratios, print_table, ratios_by_round


def _fig(target: str, per_token: float, round_no: int) -> Figures:
    return Figures(
        target=target,
        cpu_us_per_token=per_token,
        tokens_per_s=1000.0,
        ttft_p50_ms=1.0,
        ttft_p99_ms=2.0,
        tokens=128,
        requests=64,
        errors=0,
        cpu_s=0.1,
        processes=3,
        extra={
            "round": round_no,
            "cpu_us_per_request": per_token * 2,
            "us_per_token_by_process": {},
        },
    )


def _rounds() -> list[Figures]:
    # Three rounds; SMG failed to start in the third, so it has no SMG figure.
    return [
        _fig("tsfront serve W=1", 70.0, 1),
        _fig("tsfront serve W=2", 84.0, 1),
        _fig("SMG gateway", 100.0, 1),
        _fig("tsfront serve W=1", 90.0, 2),
        _fig("tsfront serve W=2", 99.0, 2),
        _fig("SMG gateway", 120.0, 2),
        _fig("tsfront serve W=1", 50.0, 3),
        _fig("tsfront serve W=2", 100.0, 3),
    ]


def test_each_round_is_its_own_ratio_with_median_and_range() -> None:
    by = ratios_by_round(_rounds())
    smg = by["tsfront serve W=1 / SMG (CPU per token)"]
    assert smg["by_round"] == pytest.approx([0.7, 0.75])  # round 3 has no SMG: left out
    assert (smg["median"], smg["min"], smg["max"]) == pytest.approx((0.725, 0.7, 0.75))
    assert by["tsfront serve W=2 / SMG (CPU per token)"]["by_round"] == pytest.approx([0.84, 0.825])
    w2 = by["W=2 / W=1 (CPU per token)"]
    assert w2["by_round"] == pytest.approx([1.2, 1.1, 2.0])
    assert (w2["median"], w2["min"], w2["max"]) == pytest.approx((1.2, 1.1, 2.0))
    # Not the ratio of the medians, which mixes rounds: W=1's median 70 over SMG's 110.
    of_medians = median_ratios(_rounds())["tsfront serve W=1 / SMG (CPU per token)"]
    assert of_medians == pytest.approx(70 / 110)


def test_a_single_round_has_ratios_but_prints_no_spread(capsys) -> None:
    one = [f for f in _rounds() if f.extra["round"] == 1]
    by = ratios_by_round(one)
    assert by["W=2 / W=1 (CPU per token)"]["by_round"] == pytest.approx([1.2])
    report = {"targets": [], "ratios": median_ratios(one), "ratios_by_round": by, "skipped": []}
    print_table(report)
    assert "round by round" not in capsys.readouterr().out


def test_the_table_prints_every_round(capsys) -> None:
    results = _rounds()
    report = {
        "targets": [],
        "ratios": median_ratios(results),
        "ratios_by_round": ratios_by_round(results),
        "skipped": [],
    }
    print_table(report)
    out = capsys.readouterr().out
    assert (
        "- tsfront serve W=1 / SMG (CPU per token), round by round: 0.70, 0.75 "
        "(median 0.72, range 0.70 to 0.75)" in out
    )
    assert "- W=2 / W=1 (CPU per token), round by round: 1.20, 1.10, 2.00 (median 1.20" in out


def test_no_ratio_without_both_sides() -> None:
    assert ratios_by_round([_fig("tsfront serve W=1", 70.0, 1)]) == {}
