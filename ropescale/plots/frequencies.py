"""Seeing the frequencies: per-pair wavelength (or turns over L) before and after each method.

One curve for plain RoPE and one per method, on a log scale; horizontal lines at the original
context L and at the extended one(s); when a YaRN method is plotted, its kept / blended /
interpolated pair bands (from :func:`ropescale.methods.yarn.correction_range`) are shaded.
Dynamic methods are drawn at their extended context. matplotlib is imported here only, through
``matplotlib.figure.Figure`` (no pyplot state), so the math modules stay light.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from ..methods.base import RotarySpec, ScalingMethod
from ..methods.yarn import Yarn, correction_range
from . import figure, save_png

METRICS = ("wavelength", "rotations")
#: gid of every per-method curve (and of the original), so callers and tests can tell them from
#: the reference lines, which are Line2D artists too.
CURVE_GID = "ropescale-curve"
_BANDS = (("kept", "#2ca02c"), ("blended", "#ff7f0e"), ("interpolated", "#1f77b4"))


def method_label(method: ScalingMethod, spec: RotarySpec) -> str:
    """``"yarn ×4 (attention 1.139)"``: name, factor and what else changes the curve or logits."""
    label = f"{method.name} ×{method.factor:g}"
    _, attention = method.compute(spec, method.extended_context(spec))
    extra = []
    if method.dynamic:
        extra.append(f"at {method.extended_context(spec):,} tokens")
    if abs(attention - 1.0) > 1e-6:
        extra.append(f"attention ×{attention:.3f}")
    return label + (f" ({', '.join(extra)})" if extra else "")


def _values(inv_freq: Sequence[float], metric: str, L: int) -> list[float]:
    if metric == "wavelength":
        return [2 * math.pi / f for f in inv_freq]  # tokens per full turn
    return [L * f / (2 * math.pi) for f in inv_freq]  # full turns over the original context


def plot_frequencies(
    spec: RotarySpec,
    methods: Sequence[ScalingMethod],
    path: str | os.PathLike | None = None,
    metric: str = "wavelength",
    title: str | None = None,
) -> Any:
    """Draw per-pair wavelengths (or turns over L) of plain RoPE and of each method.

    Args:
        spec: the model's original rotary geometry.
        methods: validated methods (``get_method(...)``); ``default`` ones add nothing to the
            original curve and are skipped.
        path: write the PNG here, atomically (temporary file in the same folder, then rename).
        metric: ``"wavelength"`` (tokens per turn, 2π/θ'_i) or ``"rotations"`` (turns over the
            original context, L·θ'_i/2π).
        title: figure title (default: the geometry and the factors).

    Returns:
        The ``matplotlib.figure.Figure``; its curves carry ``gid == CURVE_GID`` (1 + one per
        non-default method).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    methods = [m for m in methods if m.name != "default"]
    for m in methods:
        m.validate_for(spec)
    L, n = spec.original_max_position_embeddings, spec.dim // 2
    pairs = list(range(n))
    fig = figure(figsize=(9, 5.2), dpi=120, layout="constrained")
    ax = fig.add_subplot()

    yarn = next((m for m in methods if isinstance(m, Yarn)), None)
    if yarn is not None:
        low, high = correction_range(spec, yarn.beta_fast, yarn.beta_slow, yarn.truncate)
        # pair i is kept while i <= low and fully interpolated once i >= high (the ramp between)
        edges = (-0.5, min(math.floor(low) + 0.5, n - 0.5), min(math.ceil(high) - 0.5, n - 0.5), n - 0.5)
        why = {
            "kept": f", ≥ {yarn.beta_fast:g} turns in L",
            "blended": "",
            "interpolated": f", ≤ {yarn.beta_slow:g} turn{'s' if yarn.beta_slow != 1 else ''} in L",
        }
        for (band, color), start, stop in zip(_BANDS, edges, edges[1:]):
            if stop > start:
                first, last = math.ceil(start), math.floor(stop)
                pairs_text = f"pair {first}" if first == last else f"pairs {first}–{last}"
                ax.axvspan(start, stop, color=color, alpha=0.09, lw=0, label=f"YaRN {band}: {pairs_text}{why[band]}")

    original = _values(spec.base_inv_freq().tolist(), metric, L)
    ax.plot(pairs, original, color="black", lw=2.4, ls="--", label="original RoPE", gid=CURVE_GID, zorder=5)
    markers = "osD^v<>p"
    for k, m in enumerate(methods):
        inv_freq, _ = m.compute(spec, m.extended_context(spec))
        # each curve thinner than the one before, so methods that coincide (yarn and dynamic_yarn
        # at the extended length, the kept pairs of most methods) stay visible underneath
        ax.plot(
            pairs,
            _values(inv_freq.tolist(), metric, L),
            lw=max(2.6 - 0.4 * k, 1.0),
            marker=markers[k % len(markers)],
            ms=max(6.0 - 0.8 * k, 2.5),
            label=method_label(m, spec),
            gid=CURVE_GID,
            zorder=6,
        )

    # reference lines: the original context and every extended one (one per distinct factor)
    contexts = sorted({m.extended_context(spec) for m in methods} - {L})
    # (in turns over L, a wavelength of c tokens is L / c turns: one full turn over c tokens)
    to_metric = (lambda c: c) if metric == "wavelength" else (lambda c: L / c)
    prefix = "" if metric == "wavelength" else "1 turn over the "
    slot, previous = 0, None
    for c, color, text in [(L, "0.25", f"original context L = {L:,}")] + [
        (c, "firebrick", f"extended context {c:,} (×{c / L:g})") for c in contexts
    ]:
        ax.axhline(to_metric(c), color=color, lw=1, ls=":", gid="context")
        # labels of lines closer than 1.6× apart would overlap: move each one further right
        slot = slot + 1 if previous is not None and c / previous < 1.6 else 0
        previous = c
        ax.annotate(
            prefix + text,
            (0.01 + 0.3 * slot, to_metric(c)),
            xycoords=("axes fraction", "data"),
            xytext=(0, 3),
            textcoords="offset points",
            fontsize=8,
            color=color,
        )

    ax.set_yscale("log")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_xlabel(f"rotary pair i (θ_i = b^(−2i/d), d = {spec.dim}; fast → slow)")
    if metric == "wavelength":
        ax.set_ylabel("wavelength 2π/θ_i (tokens, log)")
    else:
        ax.set_ylabel(f"full turns over the original context L = {L:,} (log)")
    factors = sorted({m.factor for m in methods})
    ax.set_title(
        title
        or (
            f"RoPE {metric} per pair: base {spec.base:g}, L = {L:,}"
            + (f", factor {'/'.join(f'{f:g}' for f in factors)}" if factors else "")
        ),
        fontsize=10,
    )
    ax.grid(True, which="major", alpha=0.3)
    # the empty corner: short wavelengths of the slow pairs do not exist (nor many turns of them)
    ax.legend(fontsize=8, loc="lower right" if metric == "wavelength" else "upper right", framealpha=0.9)
    if path is not None:
        save_png(fig, path)
    return fig


def curve_count(fig: Any) -> int:
    """How many frequency curves ``fig`` holds (the original plus one per method)."""
    return sum(line.get_gid() == CURVE_GID for ax in fig.axes for line in ax.get_lines())


__all__ = ["METRICS", "CURVE_GID", "curve_count", "method_label", "plot_frequencies", "save_png"]
