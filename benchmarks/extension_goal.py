"""The goal of the long fine-tune (issue 41), part by part, read from the experiment's results.

At ×s on a model of trained context L, the fine-tuned YaRN model meets the goal when:

1. its perplexity at every length beyond L (16k and 32k at ×4) is at most 1.01 × the control's at L,
   measured where BOTH models are still improving on held-out text: a ratio met because the control
   has started to overfit (its held-out perplexity rising again) compares a fine-tune with a control
   that got worse, and does not count;
2. its perplexity at the shortest length (2k) is at most 1.01 × the control's there;
3. on the battery's RULER tasks (evals/tasks/ruler/, tasks it never trained on) its mean score at every
   length beyond L is at least the unscaled model's at L;
4. passkey as the experiment has always asked: at the shortest length at least the unscaled model's,
   at L and beyond at least the unscaled model's at L.

The held-out curves are each model's perplexity on held-out text (Emma, in no training source) every
``eval.every`` steps during training, read from the run's ``metrics.jsonl`` (:func:`heldout_curve`);
the fine-tune's at its target length, the control's at L. "Still improving" at the measured step: the
curve's point there is below the point before it and the lowest of the curve (:func:`still_improving`).

Everything here is a pure function of numbers (tests/evals/test_extension_goal.py checks it on
synthetic ones: met, not met, and met only because the control overfits).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Measured, length_text

MET, NOT_MET, NOT_COUNTED, MISSING = "met", "NOT met", "not counted", "not measured yet"


@dataclass(frozen=True)
class CurvePoint:
    """One held-out evaluation during training: the step, the window length and the perplexity."""

    step: int
    length: int
    ppl: float


@dataclass(frozen=True)
class GoalPart:
    """One part of the goal: what it asks, its status (met / NOT met / not counted / not measured yet)
    and the numbers that decide it."""

    part: str
    status: str
    detail: str

    def line(self) -> str:
        return f"- {self.part}: {self.status} ({self.detail})"


def heldout_curve(run_dir: str | Path) -> list[CurvePoint]:
    """The held-out evaluations of a training run (``metrics.jsonl`` lines with ``eval_ppl``), by step;
    of a step evaluated twice (a resumed run) the last line counts. Empty where there are none."""
    path = Path(run_dir) / "metrics.jsonl"
    points: dict[int, CurvePoint] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by a kill: the run rewrites it on resume
                continue
            if isinstance(rec, dict) and "eval_ppl" in rec:
                step = int(rec["step"])
                points[step] = CurvePoint(step, int(rec["eval_length"]), float(rec["eval_ppl"]))
    return [points[s] for s in sorted(points)]


def still_improving(curve: list[CurvePoint], step: int | None = None) -> tuple[bool | None, str]:
    """Whether the curve still improves at ``step`` (default: its last point): the point there is below
    the one before it and the lowest so far. None (with the reason) where there are fewer than two
    points up to ``step`` or no point at it."""
    upto = [p for p in curve if step is None or p.step <= step]
    if len(upto) < 2 or (step is not None and upto[-1].step != step):
        return None, "fewer than two held-out points" if len(upto) < 2 else f"no held-out point at step {step}"
    last, before = upto[-1], upto[-2]
    best = min(upto, key=lambda p: p.ppl)
    ok = last.ppl < before.ppl and best is last
    trend = f"{before.ppl:.3f} at step {before.step} → {last.ppl:.3f} at step {last.step}"
    if not ok and best is not last:
        trend += f"; lowest {best.ppl:.3f} at step {best.step}"
    return ok, trend


def _ruler_mean(scores: Mapping[str, Mapping[int, float]], length: int, tasks: list[str]) -> float | None:
    vals = [scores[t][length] for t in tasks if length in scores.get(t, {})]
    return sum(vals) / len(vals) if tasks and len(vals) == len(tasks) else None


def goal_parts(
    rows: list[Measured],
    original_context: int,
    curves: Mapping[str, list[CurvePoint]] | None = None,
    ruler: Mapping[str, Mapping[str, Mapping[int, float]]] | None = None,
    full_passkey: int = 30,
    step: int | None = None,
    slack: float = 1.01,
    lengths: Mapping[str, list[int]] | None = None,
) -> list[GoalPart]:
    """The goal's parts as :class:`GoalPart` s.

    Args:
        rows: the experiment's rows (``none``, ``fine-tuned yarn``, ``control``; others ignored).
        original_context: L, the unscaled model's trained context.
        curves: each role's held-out curve (:func:`heldout_curve`), ``fine-tuned yarn`` and ``control``.
        ruler: each role's RULER scores, ``{role: {task: {length: score 0-1}}}`` (complete cells only).
        full_passkey: prompts in a complete passkey cell (fewer: in progress, not judged).
        step: the training step the rows measure (the exported checkpoint); default the curves' last.
        slack: the ratio allowed (1.01).
        lengths: the lengths the protocol asks for, ``{"ppl": [...], "passkey": [...], "ruler": [...]}``
            (each optional): a length asked for and not measured leaves its part not measured, rather
            than judged on the lengths there are. Default: the lengths the rows and RULER cells hold.
    """
    by = {r.label: r for r in rows}
    ft, control, none = by.get(FINE_TUNED), by.get(CONTROL), by.get("none")
    L, parts = original_context, []
    curves, ruler, asked = curves or {}, ruler or {}, lengths or {}
    ppl_lengths = asked.get("ppl") or sorted(ft.ppl if ft else {})
    long = sorted(n for n in ppl_lengths if n > L)
    ask = f"PPL at {', '.join(map(length_text, long)) or 'lengths > L'} ≤ {slack:g} × control's PPL({length_text(L)})"
    if not long or not ft or any(n not in ft.ppl for n in long) or not control or L not in control.ppl:
        parts.append(GoalPart(ask, MISSING, "fine-tuned cells beyond L or the control's at L missing"))
    else:
        bar, worst = slack * control.ppl[L], max(ft.ppl[n] for n in long)
        ratio = f"worst {worst:.2f} = {worst / control.ppl[L]:.3f} × {control.ppl[L]:.2f}"
        trends = {role: still_improving(curves.get(role, []), step) for role in (FINE_TUNED, CONTROL)}
        said = "; ".join(f"{role} held-out {text}" for role, (_, text) in trends.items())
        if worst > bar:
            parts.append(GoalPart(ask, NOT_MET, f"{ratio}; {said}"))
        elif any(ok is None for ok, _ in trends.values()):
            parts.append(GoalPart(ask, MISSING, f"{ratio}, but both held-out curves are needed: {said}"))
        elif not all(ok for ok, _ in trends.values()):
            worse = " and ".join(role for role, (ok, _) in trends.items() if not ok)
            why = "the control overfits" if worse == CONTROL else f"{worse} no longer improves"
            parts.append(GoalPart(ask, NOT_COUNTED, f"{ratio}, met only where {why}: {said}"))
        else:
            parts.append(GoalPart(ask, MET, f"{ratio}; both still improving: {said}"))
    short = min((n for n in ppl_lengths if n < L), default=None)
    if short is None or not ft or short not in ft.ppl or not control or short not in control.ppl:
        parts.append(GoalPart(f"PPL(short) ≤ {slack:g} × control's", MISSING, "cells missing"))
    else:
        a, b = ft.ppl[short], control.ppl[short]
        parts.append(
            GoalPart(
                f"PPL({length_text(short)}) ≤ {slack:g} × control's",
                MET if a <= slack * b else NOT_MET,
                f"{a:.2f} vs {b:.2f} = {a / b:.3f}×",
            )
        )
    parts.append(_ruler_part(ruler, L, asked.get("ruler")))
    parts += _passkey_parts(ft, none, L, full_passkey, asked.get("passkey"))
    return parts


def _ruler_part(ruler: Mapping[str, Mapping[str, Mapping[int, float]]], L: int, asked: list[int] | None) -> GoalPart:
    """The battery's mean score at each length beyond L against the unscaled model's at L, over the
    tasks both measured."""
    ft, base = ruler.get(FINE_TUNED, {}), ruler.get("none", {})
    tasks = sorted(t for t in ft if L in base.get(t, {}))
    lengths = sorted(n for n in asked if n > L) if asked else sorted({n for t in tasks for n in ft[t] if n > L})
    ask = f"RULER mean at {', '.join(map(length_text, lengths)) or 'lengths > L'} ≥ the unscaled model's at {length_text(L)}"
    bar = _ruler_mean(base, L, tasks)
    means = {n: _ruler_mean(ft, n, tasks) for n in lengths}
    if bar is None or not lengths or any(m is None for m in means.values()):
        return GoalPart(ask, MISSING, "fine-tuned cells beyond L or the unscaled model's at L missing")
    text = ", ".join(f"{length_text(n)} {100 * m:.1f}" for n, m in means.items())
    detail = f"{text} vs {100 * bar:.1f} (%, mean of {len(tasks)} tasks: {', '.join(tasks)})"
    return GoalPart(ask, MET if all(m >= bar for m in means.values()) else NOT_MET, detail)


def _passkey_parts(
    ft: Measured | None, none: Measured | None, L: int, full: int, asked: list[int] | None
) -> list[GoalPart]:
    """Passkey as today: the shortest length against the unscaled model's there, every length ≥ L
    against the unscaled model's at L; a cell of fewer than ``full`` prompts is in progress."""
    if ft is None or none is None or not ft.passkey:
        return [GoalPart("passkey", MISSING, "cells missing")]
    out = []
    measured = sorted(asked or ft.passkey)
    first = measured[0]
    checks = [(first, first)] + [(n, L) for n in measured if n >= L and n != first]
    for n, ref in checks:
        ask = f"passkey at {length_text(n)} ≥ the unscaled model's at {length_text(ref)}"
        if ref not in none.passkey or n not in ft.passkey:
            out.append(GoalPart(ask, MISSING, "a cell missing"))
            continue
        k = ft.passkey_trials.get(n, full)
        status = "in progress" if k < full else MET if ft.passkey[n] >= none.passkey[ref] else NOT_MET
        out.append(GoalPart(ask, status, f"{ft.passkey[n]:.2f} on {k} prompts vs {none.passkey[ref]:.2f}"))
    return out


def verdict(parts: list[GoalPart]) -> str:
    """One line: the goal met (every part), or which parts are not."""
    if all(p.status == MET for p in parts):
        return "goal: met (every part)"
    left = [p.part for p in parts if p.status != MET]
    return f"goal: not met yet ({len(left)} of {len(parts)} parts: {'; '.join(left)})"


__all__ = ["CurvePoint", "GoalPart", "goal_parts", "heldout_curve", "still_improving", "verdict"]
