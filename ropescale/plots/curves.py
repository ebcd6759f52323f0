"""Perplexity against evaluation length, one curve per method (suite reports)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import figure, length_label, save_png


def plot_perplexity_curves(
    curves: Mapping[str, Mapping[int, float]], lengths: Sequence[int], path: str | os.PathLike
) -> Path | None:
    """Perplexity (log) against length (log2) for each labelled curve ``{label: {length: ppl}}``.

    Returns:
        The written path, or None when no curve has a point (nothing is written).
    """
    if not any(curves.values()):
        return None
    fig = figure(figsize=(7, 4.5), dpi=120)
    ax = fig.add_subplot()
    for label, points in curves.items():
        xs = [n for n in lengths if n in points]
        if xs:
            ax.plot(xs, [points[n] for n in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [length_label(n) for n in lengths])
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title("Perplexity vs evaluation length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return save_png(fig, path, bbox_inches="tight")
