"""Intervals and tests for proportions: how sure a retrieval accuracy is, and whether two differ.

Wilson's score interval for one accuracy, Newcombe's interval for the difference of two, the design
effect of trials that share a position (a passkey depth's trials at fixed placement answer alike),
and the exact McNemar test of two models on the same prompts.

The exact McNemar test is scipy's binomial test on the discordant prompts. Wilson's interval stays
written out here: scipy's (``binomtest(k, n).proportion_ci(method="wilson")``) takes whole counts only,
and this module's callers pass fractional ones (partial-credit needle scores, and the effective number
of trials of :func:`group_agreement`); on whole counts the two agree to 1e-6 (tests/evals/test_proportions.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict


def wilson_interval(successes: float, trials: float, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% for the default ``z``).

    Unlike the normal approximation it stays inside [0, 1] and is not degenerate at 0/n or n/n:
    6 successes of 6 trials give about [0.61, 1], 0 of 6 about [0, 0.39].

    Args:
        successes: number of successes; a mean of fractional scores times ``trials`` is taken as is
            (an approximation for partial-credit needle tasks).
        trials: number of trials (0 gives the uninformative [0, 1]); may be fractional, an
            effective number of trials (:func:`group_agreement`).
        z: the normal quantile of the interval's confidence.

    Returns:
        ``(low, high)``.
    """
    if trials <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, successes / trials))
    denominator = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    low = 0.0 if p == 0 else max(0.0, center - half)  # exact ends: no 1e-17 from rounding
    return low, 1.0 if p == 1 else min(1.0, center + half)


def difference_interval(successes_a: float, trials_a: int, successes_b: float, trials_b: int) -> tuple[float, float]:
    """95% interval of the difference of two proportions p_a − p_b, from their Wilson intervals
    (Newcombe's hybrid score method): it excludes 0 only when the two differ beyond their noise.

    6/6 against 5/6 gives about [−0.25, 0.56] (not different), 6/6 against 2/6 about [0.13, 0.90].

    Returns:
        ``(low, high)``.
    """
    pa, pb = successes_a / trials_a, successes_b / trials_b
    (la, ua), (lb, ub) = wilson_interval(successes_a, trials_a), wilson_interval(successes_b, trials_b)
    d = pa - pb
    return d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2), d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)


class GroupAgreement(TypedDict):
    """:func:`group_agreement`: the trials, groups and unanimous groups, the intra-class correlation
    (None where every score is the same), the design effect and effective trials, and the accuracy
    with its plain and effective Wilson intervals."""

    n: int
    groups: int
    unanimous: int
    icc: float | None
    design_effect: float
    effective_n: float
    accuracy: float
    interval: tuple[float, float]
    effective_interval: tuple[float, float]


class ScoredPrompt(TypedDict, total=False):
    """The keys :func:`depth_groups` reads of a retrieval cell's record (a prompt: its depth and whether
    it was answered right; the task's record has more)."""

    depth: float
    correct: bool


def group_agreement(groups: Sequence[Sequence[float]]) -> GroupAgreement:
    """How far the trials of a cell are independent measurements: its groups (the trials of one
    depth, which share a position unless placement is jittered) and how alike they answer.

    Trials that share everything but the key are close to one measurement: when a group is all
    right or all wrong, the cell's ``n`` trials weigh about as much as its number of groups. This
    gives the share of groups that agree throughout, the intra-class correlation ``icc`` of the
    scores (one-way ANOVA estimator, groups of equal size, floored at 0), the design effect
    ``1 + (m - 1) icc`` of groups of ``m``, the effective number of trials ``n / design_effect``
    and the Wilson interval of the accuracy on that number (Kish's correction; equal to the plain
    interval when the groups are no more alike than chance).

    Args:
        groups: each group's scores in [0, 1]; all groups of one size >= 2.

    Returns:
        ``{"n", "groups", "unanimous", "icc", "design_effect", "effective_n", "accuracy",
        "interval", "effective_interval"}``; ``icc`` is None (design effect 1) when every score is
        the same, where nothing can be said about the correlation.

    Raises:
        ValueError: fewer than two groups, or groups of unequal size or of size < 2.
    """
    sizes = {len(g) for g in groups}
    if len(groups) < 2 or len(sizes) != 1 or min(sizes) < 2:
        raise ValueError(f"need two or more groups of one size >= 2, got sizes {[len(g) for g in groups]}")
    m, k = sizes.pop(), len(groups)
    n = m * k
    means = [sum(g) / m for g in groups]
    mean = sum(means) / k
    between = m * sum((x - mean) ** 2 for x in means) / (k - 1)
    within = sum((y - x) ** 2 for g, x in zip(groups, means) for y in g) / (k * (m - 1))
    denominator = between + (m - 1) * within
    icc = None if denominator == 0 else max(0.0, (between - within) / denominator)
    design = 1 + (m - 1) * (icc or 0.0)
    effective = n / design
    return {
        "n": n,
        "groups": k,
        "unanimous": sum(1 for g in groups if len(set(g)) == 1),
        "icc": icc,
        "design_effect": design,
        "effective_n": effective,
        "accuracy": mean,
        "interval": wilson_interval(mean * n, n),
        "effective_interval": wilson_interval(mean * effective, effective),
    }


def depth_groups(records: Sequence[ScoredPrompt]) -> list[list[float]]:
    """A retrieval cell's scores grouped by depth, in depth order (the groups :func:`group_agreement`
    takes): each record's ``correct`` (passkey) as 0/1."""
    groups: dict[float, list[float]] = {}
    for r in records:
        groups.setdefault(r["depth"], []).append(float(bool(r["correct"])))
    return [groups[d] for d in sorted(groups)]


def paired_exact_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value of two models on the same prompts: the chance, were both
    equally good, of a split of the discordant prompts (right for one model only) at least as uneven
    as ``only_a`` against ``only_b``. Prompts both get right or both get wrong say nothing, so a paired
    test separates models whose unpaired Wilson intervals overlap when their misses nest.

    Returns:
        The p-value in [0, 1] (1 when no prompt is discordant).
    """
    from scipy.stats import binomtest  # the eval extra; imported here so the module loads without it

    if only_a + only_b == 0:
        return 1.0
    return float(binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired_split(a: Sequence[float], b: Sequence[float]) -> tuple[int, int, float]:
    """Two models' scores on the same prompts, in the same order: the prompts ``a`` scored higher, those
    ``b`` did, and :func:`paired_exact_p` of that split. With scores of 0 or 1 this is McNemar's exact
    test; with fractional scores (the share of a prompt's values found), the sign test. Ties say nothing.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_split: {len(a)} scores against {len(b)}: not the same prompts")
    above = sum(x > y for x, y in zip(a, b))
    below = sum(y > x for x, y in zip(a, b))
    return above, below, paired_exact_p(above, below)


__all__ = [
    "GroupAgreement",
    "ScoredPrompt",
    "depth_groups",
    "difference_interval",
    "group_agreement",
    "paired_exact_p",
    "paired_split",
    "wilson_interval",
]
