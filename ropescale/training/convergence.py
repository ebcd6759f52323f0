"""Whether a training run's held-out curve has levelled off at its last point.

``ropescale train`` evaluates held-out perplexity every ``eval.every`` steps and logs each point to the
run's ``metrics.jsonl`` with every window's mean NLL (``eval_window_nll``). Two points score the same
windows, so the change between them is paired: its noise is that of the windows' differences, not of
the windows themselves. The rule read here, decided for issue 54's CPU fine-tunes and applied to every
run that logs two or more held-out points:

- the change from the point before the last to the last is the mean of the paired window differences,
  with its 95 % t interval (n − 1 degrees of freedom: with 4 windows that is 3.18 standard errors, not 2);
- the curve has **converged** when that interval excludes a fall faster than 0.25 % of perplexity per 40
  steps (``FALL_TOLERANCE``, scaled by the steps between the points);
- otherwise it **may still fall**, and that includes a curve whose windows are too few or too noisy to
  tell: the burden is on the claim "converged";
- a log without two paired windows falls when its perplexity drops by more than 0.5 %.

Why a tolerance: at the floor learning rate a model keeps learning its training text by fractions of a
percent, so a rule without one would never call a fine-tune converged. Why 0.25 % per 40 steps: a quarter
of the 1 % that issue 54's first goal allows between the fine-tune at its target and the control, per
evaluation interval of the shipped CPU recipes. The history and the two runs it was decided on:
docs/experiments/2026-12-05-cpu-finetune-x2-640.md.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: the fastest fall of held-out perplexity a converged curve may still have, per ``TOLERANCE_STEPS`` steps
FALL_TOLERANCE, TOLERANCE_STEPS = 0.0025, 40
#: with fewer than two paired windows there is no spread to measure: a drop larger than this counts
FALLBACK_DROP = 0.005
#: Student's t at 0.975 for 1-30 degrees of freedom (scipy.stats.t.ppf; tests/training/test_convergence.py)
_T975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile at 0.975 for ``df`` ≥ 1 degrees of freedom: the table to 30, then the
    Cornish-Fisher expansion about the normal quantile (within 1e-5 of the exact value past 30)."""
    if df < 1:
        raise ValueError(f"t975: degrees of freedom must be ≥ 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def heldout_records(run: str | Path) -> list[dict[str, Any]]:
    """The held-out evaluations of a training run (``metrics.jsonl`` lines with ``eval_ppl``), by step;
    of a step evaluated twice (a resumed run) the last line counts. ``run`` is the run folder or a copy
    of its log (a shipped ``<run>-metrics.jsonl``); lines cut short by a kill are skipped."""
    path, points = Path(run), {}
    path = path if path.is_file() else path / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "eval_ppl" in rec:
                points[int(rec["step"])] = rec
    return [points[s] for s in sorted(points)]


def paired_change(before: Mapping[str, Any], last: Mapping[str, Any]) -> tuple[float, float, int] | None:
    """The change of the held-out windows' mean NLL (``eval_window_nll``) from ``before`` to ``last``: the
    mean of the paired differences, the half-width of its 95 % t interval and the number of windows n;
    None without two or more windows scored at both points (no spread to measure)."""
    a, b = before.get("eval_window_nll") or [], last.get("eval_window_nll") or []
    if not len(a) == len(b) >= 2:
        return None
    d = [y - x for x, y in zip(a, b)]
    return statistics.fmean(d), t975(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d)), len(d)


def fall_tolerance(steps: float) -> float:
    """The tolerance in nats of window NLL over ``steps`` training steps (``FALL_TOLERANCE``)."""
    return math.log1p(FALL_TOLERANCE) * steps / TOLERANCE_STEPS


def curve_falling(records: Sequence[Mapping[str, Any]]) -> tuple[bool | None, str]:
    """Whether a held-out curve may still fall at its last point (True: not converged; False: flat within
    the tolerance; None: fewer than two points), and the numbers that say so."""
    if len(records) < 2:
        return None, "fewer than two held-out points"
    before, last = records[-2], records[-1]
    trend = f"{before['eval_ppl']:.3f} at step {before['step']} → {last['eval_ppl']:.3f} at step {last['step']}"
    change = paired_change(before, last)
    if change is not None:
        mean, half, n = change
        tolerance = fall_tolerance(int(last["step"]) - int(before["step"]))
        falling = mean - half < -tolerance
        said = "does not exclude" if falling else "excludes"
        return falling, (
            f"{trend} (mean window ΔNLL {mean:+.4f}, 95 % t interval {mean - half:+.4f} to {mean + half:+.4f}, "
            f"{n} windows: {said} a fall beyond {-tolerance:+.4f}, {100 * FALL_TOLERANCE:g} % per "
            f"{TOLERANCE_STEPS} steps)"
        )
    drop = 1 - last["eval_ppl"] / before["eval_ppl"]
    return drop > FALLBACK_DROP, f"{trend} ({100 * drop:+.2f} %, no paired windows: 0.5 % rule)"


def convergence_line(run: str | Path) -> str | None:
    """What ``ropescale train`` says of a run's held-out curve at its end: one line, or None where the
    run's log has fewer than two held-out points."""
    falling, text = curve_falling(heldout_records(run))
    if falling is None:
        return None
    if falling:
        return (
            f"held-out curve may still fall: {text}; not converged: raise train.max_steps and --resume "
            "before reading its numbers as the recipe's result"
        )
    return f"held-out curve flat at its last point: {text}"


__all__ = [
    "FALL_TOLERANCE",
    "TOLERANCE_STEPS",
    "convergence_line",
    "curve_falling",
    "fall_tolerance",
    "heldout_records",
    "paired_change",
    "t975",
]
