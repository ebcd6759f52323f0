"""evals/tasks/proportions.py against scipy.stats and against values worked by hand."""

from __future__ import annotations

import math

import pytest

from ropescale.evals.tasks.proportions import paired_exact_p, paired_split, wilson_interval

scipy_stats = pytest.importorskip("scipy.stats")


@pytest.mark.parametrize(("k", "n"), [(0, 6), (1, 6), (3, 6), (6, 6), (12, 30), (23, 30), (30, 30), (1, 1)])
def test_wilson_interval_equals_scipys_on_whole_counts(k, n):
    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-6)


def test_wilson_interval_by_hand():
    """24 of 30: p = 0.8, z² = 3.8415; centre (0.8 + z²/60) / (1 + z²/30) = 0.86402 / 1.12805 = 0.76595,
    half-width z / 1.12805 * sqrt(0.16 / 30 + z² / 3600) = 1.73748 * 0.08000 = 0.13900: [0.6269, 0.9049]."""
    assert wilson_interval(24, 30) == pytest.approx((0.6269, 0.9049), abs=1e-4)
    # 7.5 of 10 (an effective n: scipy's interval takes whole counts only): centre 0.94207 / 1.38415
    # = 0.68062, half-width 1.41601 * sqrt(0.01875 + 0.0096036) = 0.23844: [0.4422, 0.9191]
    assert wilson_interval(7.5, 10.0) == pytest.approx((0.4422, 0.9191), abs=1e-4)


@pytest.mark.parametrize(("a", "b"), [(0, 0), (1, 0), (3, 1), (7, 0), (9, 0), (6, 2), (5, 5), (10, 22), (2, 6)])
def test_paired_exact_p_is_the_two_sided_binomial_tail(a, b):
    """Exact McNemar by hand: 2 * P(X <= min(a, b)) for X ~ Bin(a + b, 1/2), capped at 1."""
    n, k = a + b, min(a, b)
    by_hand = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    assert paired_exact_p(a, b) == pytest.approx(by_hand, rel=1e-12)


def test_paired_exact_p_hand_checked_values():
    assert paired_exact_p(7, 0) == pytest.approx(0.015625)  # 2 / 2**7: docs' "7 lost, none gained, p = 0.016"
    assert paired_exact_p(9, 0) == pytest.approx(0.00390625)  # "p = 0.004"
    assert paired_exact_p(3, 1) == pytest.approx(0.625)  # "3 against 1, p = 0.63"


def test_paired_split_counts_the_prompts_each_scored_higher_and_tests_that_split():
    # 0/1 scores: McNemar's discordant prompts; ties (both right, both wrong) say nothing
    assert paired_split([1, 1, 0, 0, 1], [0, 1, 0, 1, 0]) == (2, 1, pytest.approx(paired_exact_p(2, 1)))
    # fractional scores (share of values found): the sign test over the prompts that differ
    assert paired_split([0.5, 0.25, 1.0], [0.25, 0.25, 0.75])[:2] == (2, 0)
    assert paired_split([True, False], [False, False])[:2] == (1, 0)  # bools count as 1 and 0
    with pytest.raises(ValueError, match="not the same prompts"):
        paired_split([1, 0], [1])
