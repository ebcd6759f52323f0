"""The goal of the CPU fine-tune (issue 54), part by part, and whether its run converged.

At ×s on a model of trained context L (×2: to 16k), the fine-tuned YaRN model meets the goal when:

1. its held-out perplexity at the target (s·L) is at most 1.01 × its control's at L;
2. its perplexity at every length ≤ L keeps at least 98.5 % of the unscaled model's (retained =
   unscaled PPL / fine-tuned PPL ≥ 0.985), as the issue states the bar;
3. and the same share against the control, which learned the same text unscaled. Training on the text
   mix lowers every perplexity by itself (adaptation, not extension: SmolLM2's control sits ~20 % below
   the unscaled model at 8k), so part 2 is met by any fine-tune on these books and cannot tell what the
   scaling costs at short lengths; this part can, and it counts in the verdict (decided in issue 54,
   session 14: a bar that cannot fail is not a measurement);
4. on the four countable RULER tasks (docs/battery.md) at the target, 30 prompts each, its mean score
   is at least 85 % of the unscaled model's mean at 4k. The verdict is the goal's, on the measured
   share; where the cells carry each prompt's score, the detail adds the share's 95 % interval
   (:func:`share_interval`) and each task's share, so a verdict the prompts cannot carry is seen.

A run whose held-out curve is still falling at its last point is "not converged": its numbers are
reported, not as the recipe's result. "Still falling" is read as a demanding reader would: a curve has
converged only when its last step is shown to fall no faster than a small tolerance, not merely when its
fall is lost in the noise (ropescale/training/convergence.py states the rule and why; ``ropescale
train`` says it of every run at its end). Training-free YaRN and
Self-Extend stand beside it on the same RULER prompts (their cells are listed, not judged).

Pure functions of numbers; tests/evals/test_extension_cpu_goal.py checks them on synthetic ones.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Measured, length_text
from ropescale.training.convergence import (  # the rule, shared with `ropescale train`'s last line
    FALL_TOLERANCE,
    TOLERANCE_STEPS,
    curve_falling,
    fall_tolerance,
    heldout_records,
    paired_change,
    t975,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the drivers beside it, run from anywhere
from extension_goal import MET, MISSING, NOT_MET, GoalPart  # noqa: E402

#: the four countable RULER tasks: those the unscaled SmolLM2-135M scores ≥ 30 % at 4k, one per skill
#: (evals/measured/ruler/smollm2-135m-x4-cpu/; docs/battery.md)
COUNTABLE = ("niah_single_1", "niah_single_2[austen]", "niah_multikey_1[austen]", "niah_multivalue[austen]")
PPL_SLACK, RETAINED, RULER_SHARE, RULER_PROMPTS, RULER_BASE_LENGTH = 1.01, 0.985, 0.85, 30, 4096
NOT_CONVERGED = "not converged"


def window_ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float, float, int] | None:
    """PPL(a) / PPL(b) on the same tokens, and its 95 % interval from the paired windows.

    ``a`` and ``b`` are perplexity cells' results (``window_nll``: each window's summed NLL;
    ``window_tokens``: its scored tokens). Each of ``a``'s windows is paired with the consecutive windows of
    ``b`` that score the same tokens: one to one at one length, one to two for the fine-tune at 16k
    against the control at 8k. The pair's difference is the difference of their mean NLLs; the interval is
    Student's t over those differences, taken through exp. ``(ratio, low, high, pairs)``; None where ``b``'s
    windows do not tile ``a``'s or fewer than two pairs are left.
    """
    b_nll, b_tokens = iter(b["window_nll"]), iter(b["window_tokens"])
    diffs = []
    for nll, tokens in zip(a["window_nll"], a["window_tokens"]):
        other, covered = 0.0, 0
        while covered < tokens:
            step = next(b_tokens, None)
            if step is None:
                return None
            other, covered = other + next(b_nll), covered + step
        if covered != tokens:
            return None
        diffs.append((nll - other) / tokens)
    if next(b_tokens, None) is not None or len(diffs) < 2:
        return None
    mean, n = statistics.fmean(diffs), len(diffs)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    ratio = math.exp((sum(a["window_nll"]) - sum(b["window_nll"])) / sum(a["window_tokens"]))
    return ratio, math.exp(mean - half), math.exp(mean + half), n


def convergence_part(curves: Mapping[str, list[dict[str, Any]]]) -> GoalPart:
    """Both held-out curves (fine-tune at its target, control at L) flat at their last point."""
    said, falling, missing = [], [], []
    for role in (FINE_TUNED, CONTROL):
        ok, text = curve_falling(curves.get(role, []))
        said.append(f"{role}: {text}")
        (missing if ok is None else falling if ok else []).append(role)
    ask = (
        f"held-out curves flat at their last point (a fall beyond {100 * FALL_TOLERANCE:g} % per "
        f"{TOLERANCE_STEPS} steps excluded)"
    )
    if missing:
        return GoalPart(ask, MISSING, "; ".join(said))
    return GoalPart(ask, NOT_CONVERGED if falling else MET, "; ".join(said))


def share_interval(
    mine: Mapping[str, list[float]], bar: Mapping[str, list[float]], reps: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The 95 % interval of (mean over tasks of the fine-tune's prompt scores) / (the same of the unscaled
    model's), by a percentile bootstrap that redraws each task's prompts of each model independently (the
    two are measured at different lengths, so their prompts are not paired)."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def means(scores: Mapping[str, list[float]]):
        per_task = [np.asarray(v, dtype=float) for v in scores.values()]
        return np.mean([v[rng.integers(0, len(v), size=(reps, len(v)))].mean(axis=1) for v in per_task], axis=0)

    a, b = means(mine), means(bar)
    share = np.divide(a, b, out=np.full(reps, np.inf), where=b > 0)
    low, high = np.percentile(share, [2.5, 97.5])
    return float(low), float(high)


def _mean(scores: Mapping[str, Mapping[int, tuple[float, int]]], length: int, tasks: tuple[str, ...]):
    got = [scores.get(t, {}).get(length) for t in tasks]
    if any(g is None for g in got):
        return None, 0
    return sum(g[0] for g in got) / len(got), min(g[1] for g in got)


def goal_parts(
    rows: list[Measured],
    original_context: int,
    target: int,
    ruler_ft: Mapping[str, Mapping[int, tuple[float, int]]],
    ruler_base: Mapping[str, Mapping[int, tuple[float, int]]],
    curves: Mapping[str, list[dict[str, Any]]],
    tasks: tuple[str, ...] = COUNTABLE,
    base_length: int = RULER_BASE_LENGTH,
    windows: Mapping[tuple[str, int], Mapping[str, Any]] | None = None,
) -> list[GoalPart]:
    """The goal's four parts and the convergence part.

    Args:
        rows: the experiment's rows (``none``, ``fine-tuned yarn``, ``control``; others ignored).
        original_context: L.
        target: the fine-tune's target length (s·L).
        ruler_ft: the fine-tune's RULER cells, ``{task: {length: (score 0-1, prompts)}}``, or
            ``(score, prompts, each prompt's score)`` where the interval is to be given.
        ruler_base: the unscaled model's, the same shape (its cells at ``base_length``, 4k).
        curves: each role's held-out records (:func:`heldout_records`).
        windows: ``(role, length) -> perplexity cell result`` (window NLLs and tokens), where the perplexity
            parts are to give their 95 % intervals (:func:`window_ratio`); the verdicts stay the goal's, on
            the measured ratio, and a verdict the interval does not carry is said.
    """
    windows = windows or {}

    def interval(a: tuple[str, int], b: tuple[str, int], invert: bool = False) -> tuple[float, float, str]:
        """The paired interval of PPL(a) / PPL(b) (of its inverse), and its text; (nan, nan, "") without it."""
        got = window_ratio(windows[a], windows[b]) if a in windows and b in windows else None
        if got is None:
            return math.nan, math.nan, ""
        _, low, high, n = got
        low, high = (1 / high, 1 / low) if invert else (low, high)
        scale, digits = (100, 2) if invert else (1, 4)
        return low, high, f" [{scale * low:.{digits}f}, {scale * high:.{digits}f}] ({n} windows paired)"

    by = {r.label: r for r in rows}
    ft, control, none = by.get(FINE_TUNED), by.get(CONTROL), by.get("none")
    L, parts = original_context, []
    ask = f"PPL({length_text(target)}) ≤ {PPL_SLACK:g} × control's PPL({length_text(L)})"
    if not ft or target not in ft.ppl or not control or L not in control.ppl:
        parts.append(GoalPart(ask, MISSING, "the fine-tune's cell at the target or the control's at L missing"))
    else:
        a, b = ft.ppl[target], control.ppl[L]
        _, high, said = interval((FINE_TUNED, target), (CONTROL, L))
        status = MET if a <= PPL_SLACK * b else NOT_MET
        beyond = " (the interval reaches above the goal)" if status == MET and high > PPL_SLACK else ""
        parts.append(
            GoalPart(ask, status, f"{a:.2f} vs {b:.2f} = {a / b:.4f}×" + (f", 95 %{said}" if said else "") + beyond)
        )
    short = sorted(n for n in (ft.ppl if ft else {}) if n <= L)

    def kept_part(ask: str, base: Any, whose: str, label: str | None, digits: int) -> GoalPart:
        """PPL at every length ≤ L: ``base``'s / the fine-tune's ≥ RETAINED (with the paired interval where
        ``label`` names the baseline's windows)."""
        if not short or not base or any(n not in base.ppl for n in short):
            return GoalPart(ask, MISSING, f"the fine-tune's or {whose} cells ≤ L missing")
        kept = {n: base.ppl[n] / ft.ppl[n] for n in short}
        text = ", ".join(
            f"{length_text(n)} {ft.ppl[n]:.2f} vs {base.ppl[n]:.2f} = {100 * k:.{digits}f} %"
            + (interval((FINE_TUNED, n), (label, n), invert=True)[2] if label else "")
            for n, k in kept.items()
        )
        return GoalPart(ask, MET if all(k >= RETAINED for k in kept.values()) else NOT_MET, text)

    short = sorted(n for n in (ft.ppl if ft else {}) if n <= L)
    ask = f"PPL at ≤ {length_text(L)} keeps ≥ {100 * RETAINED:g} % of the unscaled model's"
    parts.append(kept_part(ask, none, "the unscaled model's", None, 1))
    # the same text learned unscaled: what the scaling costs at short lengths
    ask = f"PPL at ≤ {length_text(L)} keeps ≥ {100 * RETAINED:g} % of the control's (adaptation to the text removed)"
    parts.append(kept_part(ask, control, "the control's", CONTROL, 2))
    ask = (
        f"RULER mean of {len(tasks)} tasks at {length_text(target)} ≥ {100 * RULER_SHARE:g} % of the unscaled "
        f"model's at {length_text(base_length)}"
    )
    (mine, n_mine), (bar, _) = _mean(ruler_ft, target, tasks), _mean(ruler_base, base_length, tasks)
    if mine is None or bar is None:
        parts.append(GoalPart(ask, MISSING, "a cell missing (" + ", ".join(tasks) + ")"))
    elif n_mine < RULER_PROMPTS:
        parts.append(GoalPart(ask, "in progress", f"{100 * mine:.1f} vs {100 * bar:.1f} on {n_mine} prompts"))
    else:
        share = mine / bar if bar else float("inf")
        status = MET if share >= RULER_SHARE else NOT_MET
        text = f"{100 * mine:.1f} vs {100 * bar:.1f} = {100 * share:.0f} %"
        cells = [(ruler_ft[t][target], ruler_base[t][base_length]) for t in tasks]
        if all(len(a) > 2 and len(b) > 2 for a, b in cells):  # each prompt's score: the interval and each task
            low, high = share_interval(
                {t: a[2] for t, (a, _) in zip(tasks, cells)}, {t: b[2] for t, (_, b) in zip(tasks, cells)}
            )
            text += f", 95 % [{100 * low:.0f}, {100 * high:.0f}] %"
            met_by_point_only = status == MET and low < RULER_SHARE
            text += (" (the interval reaches below the goal)" if met_by_point_only else "") + "; by task: "
            text += ", ".join(f"{t} {100 * a[0] / b[0]:.0f} %" if b[0] else f"{t} -" for t, (a, b) in zip(tasks, cells))
        parts.append(GoalPart(ask, status, text))
    parts.append(convergence_part(curves))
    return parts


def retrieval_line(
    ruler_ft: Mapping[str, Mapping[int, tuple]],
    ruler_base: Mapping[str, Mapping[int, tuple]],
    ruler_free: Mapping[str, Mapping[int, tuple]],
    target: int,
    free: str,
    tasks: tuple[str, ...] = COUNTABLE,
    base_length: int = RULER_BASE_LENGTH,
) -> str:
    """The fine-tune's retrieval in one line, as the evidence file's ``retrieval`` (``recommend --budget
    fine-tune`` quotes it): RULER's mean over ``tasks`` at the target as a share of the unscaled model's
    at ``base_length``, with its interval where each prompt's score is known, and ``free`` (training-free
    YaRN at its factor: at ×2 its scaling untrained) on the same prompts where ``ruler_free`` has every task
    there. Empty where a cell is missing."""
    (mine, n), (bar, _) = _mean(ruler_ft, target, tasks), _mean(ruler_base, base_length, tasks)
    if mine is None or not bar:
        return ""
    text = (
        f"RULER's {len(tasks)} countable tasks at {length_text(target)}: {100 * mine / bar:.0f} % of the unscaled "
        f"model's score at {length_text(base_length)} ({100 * mine:.1f} vs {100 * bar:.1f}, {n} prompts a task"
    )
    cells = [(ruler_ft[t][target], ruler_base[t][base_length]) for t in tasks]
    if all(len(a) > 2 and len(b) > 2 for a, b in cells):
        low, high = share_interval(
            {t: a[2] for t, (a, _) in zip(tasks, cells)}, {t: b[2] for t, (_, b) in zip(tasks, cells)}
        )
        text += f", 95 % [{100 * low:.0f}, {100 * high:.0f}]"
    text += f"; goal ≥ {100 * RULER_SHARE:g} %)"
    untrained, _ = _mean(ruler_free, target, tasks)
    if untrained is not None:
        text += f"; {free} on the same prompts: {100 * untrained / bar:.0f} %"
    return text


def verdict(parts: list[GoalPart]) -> str:
    """One line: not converged (the numbers are not the recipe's result), met, or the parts not met."""
    if any(p.status == NOT_CONVERGED for p in parts):
        return (
            "goal: not judged: the run is not converged (a held-out curve may still fall faster than the "
            "tolerance); not the recipe's result"
        )
    if all(p.status == MET for p in parts):
        return "goal: met (every part)"
    left = [p.part for p in parts if p.status != MET]
    return f"goal: not met yet ({len(left)} of {len(parts)} parts: {'; '.join(left)})"


__all__ = [
    "COUNTABLE",
    "FALL_TOLERANCE",
    "TOLERANCE_STEPS",
    "NOT_CONVERGED",
    "convergence_part",
    "curve_falling",
    "fall_tolerance",
    "goal_parts",
    "heldout_records",
    "paired_change",
    "retrieval_line",
    "verdict",
    "window_ratio",
]
