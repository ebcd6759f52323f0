"""The per-pair rescale factors of a searched configuration against the closed-form methods."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, TypedDict

from ..errors import MissingDependencyError
from . import figure, save_png


class PlotLine(TypedDict):
    """The searched factors the plot draws (λ_i per rotary pair), and their legend."""

    lam: list[float]
    label: str


def plot_factors(path: Path, space: Any, best: PlotLine, seeds: dict[str, list[float]], title: str) -> Path | None:
    """Per-pair λ_i = θ_i/θ'_i of the best candidate against the closed-form methods (log scale)."""
    try:
        fig = figure(figsize=(7.5, 4.2))
    except MissingDependencyError:  # plots are optional (matplotlib comes with ropescale[eval])
        return None
    spec = space.spec
    ax = fig.add_subplot()
    styles = {"linear": ":", "ntk": "--", "yarn": "-."}
    for name, lam in seeds.items():
        ax.plot(
            range(len(lam)),
            lam,
            styles.get(name, ":"),
            color="gray" if name != "yarn" else "tab:orange",
            label={"linear": "PI", "ntk": "NTK", "yarn": "YaRN"}.get(name, name),
        )
    ax.plot(range(len(best["lam"])), best["lam"], "o-", color="tab:blue", ms=3.5, label=best["label"])
    wavelengths = [2 * math.pi / t for t in spec.base_inv_freq().tolist()]
    critical = next((i for i, w in enumerate(wavelengths) if w > spec.original_max_position_embeddings), None)
    if critical is not None:
        ax.axvline(critical - 0.5, color="k", lw=0.6, alpha=0.5)
        ax.text(critical - 0.3, 1.02, "wavelength > L", fontsize=8, alpha=0.7, va="bottom")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(_ticks(max(max(best["lam"]), *(max(v) for v in seeds.values()))))
    ax.set_xlabel("rotary pair i (high → low frequency)")
    ax.set_ylabel("rescale factor λ_i = θ_i / θ'_i")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return save_png(fig, path, dpi=120)


def _ticks(upper: float) -> list[float]:
    return [t for t in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32) if t <= upper * 1.05]
