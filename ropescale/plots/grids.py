"""Accuracy per (prompt length, needle depth) as a heatmap: passkey, needle and suite reports."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from . import figure, length_label, save_png


def plot_accuracy_grid(
    lengths: Sequence[int],
    depths: Sequence[float],
    grid: Sequence[Sequence[float]],
    path: str | os.PathLike,
    title: str,
    texts: Sequence[Sequence[str | None]] | None = None,
) -> Path:
    """Draw ``grid[depth][length]`` (accuracy in 0..1) as a heatmap and write it atomically.

    Lengths run along x and depths down y in the order given; the colour encodes accuracy on a fixed
    0..1 scale and each cell shows its value.

    Args:
        lengths: prompt lengths in tokens (the columns).
        depths: needle depths in 0..1 (the rows).
        grid: accuracy per depth row and length column; NaN where not measured (drawn blank, "n/m").
        path: output file; the format follows its suffix (png if none).
        title: the title (may hold two lines).
        texts: per cell, shaped as ``grid``, what to write instead of the value (None: the value), e.g.
            "3/4" for a cell in progress, whose value alone would read as a finished one.

    Returns:
        The written path.
    """
    n_len, n_dep = len(lengths), len(depths)
    fig = figure(figsize=(1.2 + 0.9 * n_len, 1.2 + 0.5 * n_dep), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for r, row in enumerate(grid):
        for c, acc in enumerate(row):
            if acc != acc:  # NaN: not measured (yet)
                ax.text(c, r, "n/m", ha="center", va="center", fontsize=8, color="grey")
                continue
            # The colour map is dark at both ends: white text there, black in the light middle.
            colour = "white" if acc < 0.2 or acc > 0.8 else "black"
            said = texts[r][c] if texts is not None else None
            ax.text(c, r, said or f"{acc:.2f}", ha="center", va="center", fontsize=9, color=colour)
    ax.set_xticks(range(n_len), [length_label(n) for n in lengths])
    ax.set_yticks(range(n_dep), [f"{d:g}" for d in depths])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy")
    return save_png(fig, path, dpi=120)
