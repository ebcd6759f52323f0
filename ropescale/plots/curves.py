"""Perplexity against evaluation length, one curve per method (suite reports).

What the picture must not leave to guessing: a method a suite ran at one length only is a marker
named "(only at 16k)" in the legend with its value beside it, never an unexplained dot; a length a
method skipped (n/r) breaks its line instead of being drawn across, and the legend names it; the
trained context L is a labelled dashed line, since the point of the plot is what happens past it;
the axes read in plain numbers (30, 40, 60, 100; 2k, 8k, 16k), not 3×10¹.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import figure, length_label, save_png

#: markers of the methods measured at one length, in turn: several may share that length, so each
#: gets its own shape, drawn hollow and beneath the lines, so no value hides another
_LONE_MARKERS = ("D", "s", "^", "v", "P", "X")


def plot_perplexity_curves(
    curves: Mapping[str, Mapping[int, float]],
    lengths: Sequence[int],
    path: str | os.PathLike,
    *,
    model: str | None = None,
    factor: float | None = None,
    trained_context: int | None = None,
) -> Path | None:
    """Perplexity (log) against length (log2) for each labelled curve ``{label: {length: ppl}}``.

    Args:
        curves: measured perplexity by label and length; a length a method skipped is absent.
        lengths: every length of the suite, in order (the x ticks).
        path: where the PNG goes.
        model: named in the title when given.
        factor: the scaling factor of the methods, named in the title when given.
        trained_context: the model's trained context L, drawn as a dashed line when given.

    Returns:
        The written path, or None when no curve has a point (nothing is written).
    """
    # a perplexity that overflowed (inf) or is missing cannot sit on a log axis: named in the legend instead
    drawn = {k: {n: v for n, v in p.items() if v is not None and math.isfinite(v) and v > 0} for k, p in curves.items()}
    if not any(drawn.values()):
        return None
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    from .labels import place_labels

    fig = figure(figsize=(7.5, 4.8), dpi=120)
    ax = fig.add_subplot()
    handles, lone = [], []
    for i, (label, points) in enumerate(drawn.items()):
        xs = [n for n in lengths if n in points]
        color = f"C{i % 10}"
        wild = [n for n in lengths if n not in points and n in curves[label]]  # measured, not drawable
        label += f" ({', '.join(f'{curves[label][n]} at {length_label(n)}' for n in wild)})" if wild else ""
        missing = [n for n in lengths if n not in points and n not in wild]
        if not xs:
            if wild:  # nothing to draw, still named
                handles.append(Line2D([], [], ls="none", marker="x", color=color, label=label))
            continue
        if len(xs) == 1:
            marker = _LONE_MARKERS[len(lone) % len(_LONE_MARKERS)]
            ax.plot(xs, [points[xs[0]]], ls="none", marker=marker, ms=8, mfc="none", mew=1.6, color=color, zorder=1.9)
            handles.append(
                Line2D([], [], ls="none", marker=marker, ms=8, mfc="white", mew=1.6, color=color,
                       label=f"{label} (only at {length_label(xs[0])})")
            )  # fmt: skip
            lone.append((xs[0], points[xs[0]], label, color))
            continue
        for run in _runs(lengths, points):  # a skipped length breaks the line
            ax.plot(run, [points[n] for n in run], marker="o", color=color)
        suffix = f" (not run at {', '.join(length_label(n) for n in missing)})" if missing else ""
        handles.append(Line2D([], [], marker="o", color=color, label=label + suffix))
    if trained_context:
        handles.append(
            ax.axvline(
                trained_context,
                color="0.35",
                ls="--",
                lw=1,
                label=f"trained context L = {length_label(trained_context)}",
            )
        )
    values = [v for points in drawn.values() for v in points.values()]
    low, high = min(values) / 1.12, max(values) * 1.12
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    shown = sorted({*lengths, *([trained_context] if trained_context else [])})
    ax.set_xlim(shown[0] / 2**0.35, shown[-1] * 2**0.35)
    ax.xaxis.set_major_locator(FixedLocator(list(lengths)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: length_label(int(round(x)))))
    ax.yaxis.set_major_locator(FixedLocator(log_ticks(low, high)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    for axis in (ax.xaxis, ax.yaxis):  # no minor labels: they are what printed 3×10¹
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(_title(model, factor))
    ax.grid(True, which="major", alpha=0.3)
    if lone:  # name and value beside each lone marker, highest first (so above the next), covering no other
        lone.sort(key=lambda p: -p[1])
        notes = place_labels(ax, [(x, y) for x, y, _, _ in lone], [f"{t} {y:.2f}" for _, y, t, _ in lone])
        for note, (_, _, _, color) in zip(notes, lone, strict=True):
            note.set_color(color)
    ax.legend(handles=handles, loc="best", fontsize=8)
    return save_png(fig, path, bbox_inches="tight")


def _title(model: str | None, factor: float | None) -> str:
    """``"smollm2-135m: perplexity vs length, factor 4"``; the parts not given are left out."""
    head = f"{model}: perplexity vs length" if model else "Perplexity vs evaluation length"
    return head + (f", factor {factor:g}" if factor else "")


def _runs(lengths: Sequence[int], points: Mapping[int, float]) -> list[list[int]]:
    """The measured lengths in runs of consecutive suite lengths (a skipped one ends a run)."""
    runs: list[list[int]] = [[]]
    for n in lengths:
        if n in points:
            runs[-1].append(n)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def log_ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Round tick values (20, 30, 40, 60, 100, ...) inside ``[low, high]`` for a log axis.

    The densest of a few mantissa sets that gives at most ``most`` ticks; where the range is too
    narrow for two of them, evenly spaced round values (as a linear axis would have them).
    """
    exponents = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for mantissas in ((1, 1.5, 2, 3, 4, 5, 6, 8), (1, 2, 3, 4, 6), (1, 2, 3, 5), (1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0**e for e in exponents for m in mantissas if low <= m * 10.0**e <= high]
        if 2 <= len(ticks) <= most:
            return ticks
        if len(ticks) < 2:
            break
    from matplotlib.ticker import MaxNLocator

    return [t for t in MaxNLocator(nbins=4).tick_values(low, high) if low <= t <= high]


__all__ = ["log_ticks", "plot_perplexity_curves"]
