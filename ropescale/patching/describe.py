"""How a method changes each rotary pair: the table ``ropescale patch`` prints."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..methods.base import RotarySpec, ScalingMethod


@dataclass(frozen=True)
class PairChange:
    index: int  # rotary pair i (dims i and i + d/2 in the half layout)
    wavelength_before: float  # tokens per full turn, 2π/θ_i
    wavelength_after: float
    rotations_over_context: float  # turns over the original context L before scaling
    status: str  # "kept", "interpolated", "blended", "extrapolated"


def pair_changes(method: ScalingMethod, spec: RotarySpec, seq_len: int | None = None) -> list[PairChange]:
    """Per-pair wavelengths before and after ``method`` (dynamic methods at ``seq_len``,
    default: the extended context)."""
    seq_len = seq_len or method.extended_context(spec)
    before = spec.base_inv_freq()
    after, _ = method.compute(spec, seq_len)
    rows = []
    scale = max(method.factor, 1.0)
    for i, (b, a) in enumerate(zip(before.tolist(), after.tolist())):
        ratio = b / a
        if abs(ratio - 1) < 1e-3:
            status = "kept"
        elif scale > 1 and abs(ratio - scale) / scale < 1e-3:
            status = "interpolated"
        elif ratio > 1:
            status = "blended"
        else:
            status = "extrapolated"
        rows.append(
            PairChange(
                i, 2 * math.pi / b, 2 * math.pi / a, spec.original_max_position_embeddings * b / (2 * math.pi), status
            )
        )
    return rows


def sample_rows(rows: list[PairChange], limit: int = 12) -> list[PairChange]:
    """A short, evenly spread selection that always keeps the first and last pair and every
    pair where the status changes."""
    if len(rows) <= limit:
        return rows
    n = len(rows)
    keep = {0, n - 1}
    for i in range(1, n):
        if rows[i].status != rows[i - 1].status:
            keep |= {i - 1, i}  # both sides of every boundary
    spare = max(0, limit - len(keep))
    if spare:
        keep |= {round(j * (n - 1) / (spare + 1)) for j in range(1, spare + 1)}
    return [rows[i] for i in sorted(keep)]
