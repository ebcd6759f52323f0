"""Short-context retention and effective length, as pure functions of per-length scores.

Both read ``{length: score}`` maps (any scale, the same for both arguments), so they serve every
task and perplexity alike:

* **retention** (LongRoPE2, arXiv 2502.20082, asks ≥ 98.5 %): a scaled model's score at each length
  within the trained context L as a percentage of the unscaled model's there. For a metric where
  lower is better (perplexity) it is the unscaled value over the scaled one, so 100 % still
  means "as good" and less means worse.
* **effective length, absolute** (RULER, arXiv 2404.06654): the longest length whose score
  reaches 85.6 (RULER's bar: Llama-2-7B's score at 4k, on a 0-100 scale). As in
  :attr:`ropescale.evals.tasks.generation.GridResult.effective_context`, shorter lengths need not pass.
* **effective length, relative** (NoLiMa, arXiv 2502.05167): the longest length whose score
  reaches 85 % of a base score, the mean of the scores at lengths ≤ L (the model's own, or the
  unscaled model's when given) — the meaningful one for a small model that never reaches 85.6. A
  base below ``floor`` (default 0.3 of the scale's top: the task is beyond the model at any
  length) gives no effective length: it is reported, not counted.
"""

from __future__ import annotations

from collections.abc import Mapping

from ropescale.evals.tasks.ruler.tasks import RULER_THRESHOLD

#: NoLiMa's share of the base score a length must keep
RELATIVE_SHARE = 0.85
#: LongRoPE2's bar for short-context retention, in %
RETENTION_BAR = 98.5


def reaches(value: float, bar: float) -> bool:
    """``value >= bar`` up to rounding: a base that is exactly the floor as a fraction of counts (the
    mean of 25/30, 1/30 and 1/30 is 30 %, computed 29.999999999999996) reaches it."""
    return value >= bar - 1e-9 * max(1.0, abs(bar))


def retention(
    scores: Mapping[int, float], baseline: Mapping[int, float], original_context: int, higher_is_better: bool = True
) -> dict[int, float | None]:
    """Per length ≤ ``original_context`` measured in both maps: ``scores`` as % of ``baseline``.

    Returns:
        ``{length: percent}``, ascending; None where the baseline is 0 (nothing to keep) or, for a
        lower-is-better metric, where the score is 0.
    """
    out: dict[int, float | None] = {}
    for n in sorted(set(scores) & set(baseline)):
        if n > original_context:
            continue
        num, den = (scores[n], baseline[n]) if higher_is_better else (baseline[n], scores[n])
        out[n] = None if den == 0 else 100.0 * num / den
    return out


def worst_retention(percent: Mapping[int, float | None]) -> float | None:
    """The lowest retention of a :func:`retention` map (None if it has no number)."""
    values = [v for v in percent.values() if v is not None]
    return min(values) if values else None


def effective_length_absolute(scores: Mapping[int, float], threshold: float = RULER_THRESHOLD) -> int | None:
    """The longest length whose score is ≥ ``threshold`` (RULER's 85.6 on a 0-100 scale), or None."""
    passing = [n for n, s in scores.items() if s >= threshold]
    return max(passing) if passing else None


def base_score(scores: Mapping[int, float], original_context: int) -> float | None:
    """Mean score at the lengths ≤ ``original_context`` (None if none was measured)."""
    short = [s for n, s in scores.items() if n <= original_context]
    return sum(short) / len(short) if short else None


def effective_length_relative(
    scores: Mapping[int, float],
    original_context: int,
    base: Mapping[int, float] | None = None,
    share: float = RELATIVE_SHARE,
    floor: float | None = 0.3,
) -> tuple[int | None, str]:
    """The longest length whose score is ≥ ``share`` × the base score (NoLiMa's rule).

    Args:
        scores: the model's scores per length.
        original_context: the trained context L.
        base: whose scores at ≤ L give the base (default: ``scores`` themselves; pass the unscaled
            model's to ask "how long does the scaled model keep what the model could do").
        share: the share of the base to keep.
        floor: a base below this (on the scores' scale) means the task is beyond the model;
            None to count every task.

    Returns:
        ``(length or None, why)``: ``why`` is ``""`` when a length passed, else the reason there is none.
    """
    ref = base_score(base if base is not None else scores, original_context)
    if ref is None:
        return None, f"no score at a length ≤ {original_context} to compare with"
    if floor is not None and not reaches(ref, floor):
        return None, f"base score {ref:.3g} < {floor:g}: beyond the model at any length (not counted)"
    passing = [n for n, s in scores.items() if reaches(s, share * ref)]
    if not passing:
        return None, f"no length reaches {share:.0%} of the base score {ref:.3g}"
    return max(passing), ""


__all__ = [
    "RELATIVE_SHARE",
    "RETENTION_BAR",
    "base_score",
    "effective_length_absolute",
    "effective_length_relative",
    "reaches",
    "retention",
    "worst_retention",
]
