"""Candidate spaces of the search: what a candidate is, its constraints, its seeds and its moves.

A candidate is a plain JSON dict of the method's parameters (without ``factor``, which the target
length fixes). Two spaces:

* :class:`LongRopeSpace` — LongRoPE (Ding et al., arXiv 2402.13753, §3.2; microsoft/LongRoPE
  ``evolution/``): one rescale factor λ_i per rotary pair (θ'_i = θ_i/λ_i, transformers'
  ``long_factor``) plus the attention factor (LongRoPE's mscale). Constraints: λ non-decreasing
  over pairs, 1 ≤ λ_i ≤ ``max_ratio``·s, and — where the search cannot see the target length —
  λ_i ≥ s for the pairs whose wavelength exceeds the trained context L (see ``floor``).
  LongRoPE's n̂ (first positions left unscaled) is not part of the space: it is a position-dependent
  rotation that ``rope_parameters`` cannot express, so the result would no longer load in plain
  transformers. The short factors (used while ℓ ≤ L) are a choice of the space, ``short``:
  ``"long"`` (default) uses the searched schedule at every length — the schedule the search
  measured, with the attention factor it was measured with; nothing switches at L, so cached
  generation across L is consistent even in plain transformers — and ``"original"`` keeps the
  model's own frequencies up to L (short factors 1; the switch at L then needs ropescale's
  KV-consistent mode, on by default, for cached generation to equal recomputation).
* :class:`YarnSpace` — YaRN's own parameters: beta_fast, beta_slow, attention_factor.

Seeds are the closed-form methods expressed exactly in the space: for LongRoPE, λ_i = θ_i/θ'_i of
PI (``linear``), ``ntk`` and ``yarn`` as computed by the method registry, with their own attention
factors (1, 1, 0.1 ln s + 1). A seed that breaks an active constraint (NTK under the floor) is
projected and marked so in the history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..methods import RotarySpec, get_method
from ..rope_math import yarn_mscale
from .records import LongRopeCandidate, MethodParams, YarnCandidate

#: LongRoPE's short factors: the searched schedule itself, or the model's own frequencies (ones)
SHORT_CHOICES = ("long", "original")
#: candidates are rounded to these steps (LongRoPE searches λ on a 0.01 grid; ours is finer)
FACTOR_STEP = 1e-3
ATTENTION_STEP = 1e-4


def pair_factors(
    method_name: str, spec: RotarySpec, factor: float, seq_len: int, **params: Any
) -> tuple[list[float], float]:
    """A registry method as LongRoPE per-pair factors: (λ_i = θ_i/θ'_i at ``seq_len``, attention factor).

    Computed in float64 from the method's own fp32 frequencies and rounded to 1e-6, which removes
    the fp32 noise (PI gives exactly s) and keeps the frequencies equal to ~1e-7 relative.
    """
    inv_freq, attention = get_method(method_name, factor=factor, **params).compute(spec, seq_len)
    ratio = spec.base_inv_freq().double() / inv_freq.double()  # [d/2]
    return [round(float(v), 6) for v in ratio], float(attention)


@dataclass(frozen=True)
class LongRopeSpace:
    """Per-pair rescale factors (monotone, bounded) and an attention factor.

    Args:
        spec: the model's original rotary geometry.
        factor: s = target length / L.
        max_ratio: upper bound of every λ_i as a multiple of s (LongRoPE: 1.25).
        floor: require λ_i ≥ s on pairs whose wavelength 2π/θ_i exceeds L. Those pairs never
            completed a turn in training; below s, positions up to s·L rotate them past any angle
            seen in training. A search at the target length sees that in its metric; a cheaper
            search does not, so the floor keeps its candidates safe for the target length.
        attention: the attention factor (LongRoPE's mscale): ``"search"`` it, keep each ``"seed"``'s
            own (PI/NTK 1, YaRN 0.1 ln s + 1), or fix it for every candidate, seeds included: a number,
            or ``"yarn"`` for 0.1 ln s + 1. Fixing it suits a search on windows shorter than the
            target: fewer keys per query than at the target length under-rate the temperature.
        attention_bounds: (low, high) of a searched attention factor.
        short: the short factors (ℓ ≤ L): ``"long"`` the searched schedule, ``"original"`` ones
            (see the module docstring).
    """

    spec: RotarySpec
    factor: float
    max_ratio: float = 1.25
    floor: bool = True
    attention: str | float = "search"
    attention_bounds: tuple[float, float] = (1.0, 1.35)
    short: str = "long"

    method = "longrope"

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"target length must exceed the original context (factor > 1), got factor {self.factor:g}")
        if not self.max_ratio >= 1:
            raise ValueError(f"max_ratio must be >= 1, got {self.max_ratio:g}")
        if self.short not in SHORT_CHOICES:
            raise ValueError(f"short must be one of {', '.join(SHORT_CHOICES)}, got {self.short!r}")
        low, high = self.attention_bounds
        if not 0 < low <= high:
            raise ValueError(f"attention bounds must satisfy 0 < low <= high, got {self.attention_bounds}")
        if self.attention not in ("search", "seed", "yarn"):
            try:
                value = float(self.attention)
            except (TypeError, ValueError):
                value = math.nan
            if not (math.isfinite(value) and value > 0):
                raise ValueError(
                    f"attention must be 'search', 'seed', 'yarn' or a positive number, got {self.attention!r}"
                )
            object.__setattr__(self, "attention", value)

    @property
    def search_attention(self) -> bool:
        return self.attention == "search"

    @property
    def fixed_attention(self) -> float | None:
        """The attention factor every candidate uses, or None when it varies."""
        if self.attention == "yarn":
            return yarn_mscale(self.factor)
        return self.attention if isinstance(self.attention, float) else None

    @property
    def n_pairs(self) -> int:
        return self.spec.dim // 2

    @property
    def upper(self) -> float:
        return self.max_ratio * self.factor

    def lower(self) -> np.ndarray:
        """Per-pair lower bound: 1, or s beyond the critical pair when ``floor`` is on. # [d/2]"""
        low = np.ones(self.n_pairs)
        if self.floor:
            wavelength = 2 * math.pi / self.spec.base_inv_freq().double().numpy()
            low[wavelength > self.spec.original_max_position_embeddings] = self.factor
        return low

    # -- seeds -------------------------------------------------------------------------------------
    def seeds(self) -> list[tuple[str, LongRopeCandidate]]:
        target = int(round(self.factor * self.spec.original_max_position_embeddings))
        out = []
        for name in ("linear", "ntk", "yarn"):
            lam, attention = pair_factors(name, self.spec, self.factor, target)
            fixed = self.fixed_attention
            out.append(
                (name, {"long_factor": lam, "attention_factor": attention if fixed is None else round(fixed, 6)})
            )
        return out

    # -- constraints -------------------------------------------------------------------------------
    def project(self, params: LongRopeCandidate, round_values: bool = True) -> LongRopeCandidate:
        """Nearest-in-spirit valid candidate: clip to the bounds, then a running maximum (monotone)."""
        lam = np.asarray(params["long_factor"], dtype=float)
        lam = np.maximum.accumulate(np.clip(lam, self.lower(), self.upper))
        if round_values:
            lam = np.round(lam / FACTOR_STEP) * FACTOR_STEP
            lam = np.maximum.accumulate(np.clip(lam, self.lower(), self.upper))
        attention = float(params["attention_factor"]) if self.fixed_attention is None else self.fixed_attention
        if self.search_attention:
            attention = float(np.clip(attention, *self.attention_bounds))
            if round_values:
                attention = round(attention / ATTENTION_STEP) * ATTENTION_STEP
        return {"long_factor": [round(float(v), 6) for v in lam], "attention_factor": round(attention, 6)}

    def violations(self, params: LongRopeCandidate, tol: float = 1e-9) -> list[str]:
        """Which constraints ``params`` breaks (empty when valid)."""
        lam = np.asarray(params["long_factor"], dtype=float)
        problems = []
        if lam.shape != (self.n_pairs,):
            return [f"long_factor must have {self.n_pairs} entries, got {lam.size}"]
        if np.any(np.diff(lam) < -tol):
            problems.append("long_factor is not non-decreasing")
        if np.any(lam < self.lower() - tol):
            problems.append("long_factor below its lower bound (1, or s past the critical pair)")
        if np.any(lam > self.upper + tol):
            problems.append(f"long_factor above {self.max_ratio:g}·s = {self.upper:g}")
        attention = float(params["attention_factor"])
        low, high = self.attention_bounds
        if self.search_attention and not low - tol <= attention <= high + tol:
            problems.append(f"attention_factor {attention:g} outside [{low:g}, {high:g}]")
        if self.fixed_attention is not None and abs(attention - self.fixed_attention) > 1e-6:
            problems.append(f"attention_factor {attention:g} is not the fixed {self.fixed_attention:g}")
        return problems

    def key(self, params: LongRopeCandidate) -> tuple:
        """Identity of a candidate for de-duplication (on the rounding grid)."""
        return (
            tuple(round(v / FACTOR_STEP) for v in params["long_factor"]),
            round(float(params["attention_factor"]) / ATTENTION_STEP),
        )

    # -- moves -------------------------------------------------------------------------------------
    def mutate(
        self, params: LongRopeCandidate, rng: np.random.Generator, scale: float
    ) -> tuple[LongRopeCandidate, str]:
        """A smooth change of log λ over a random band of pairs (or a tilt, or the attention factor)."""
        lam = np.log(np.asarray(params["long_factor"], dtype=float))
        attention = float(params["attention_factor"])
        index = np.arange(self.n_pairs)
        kind = rng.choice(["band", "band", "tilt", "attention"] if self.search_attention else ["band", "band", "tilt"])
        if kind == "band":
            center = rng.uniform(0, self.n_pairs - 1)
            width = rng.uniform(1.5, self.n_pairs / 3)
            lam = lam + rng.normal(0, scale) * np.exp(-0.5 * ((index - center) / width) ** 2)
            what = f"band@{center:.0f}±{width:.0f}"
        elif kind == "tilt":
            lam = lam + rng.normal(0, scale) * (index / (self.n_pairs - 1) - 0.5)
            what = "tilt"
        else:
            attention *= math.exp(rng.normal(0, scale / 4))
            what = "attention"
        if self.search_attention and kind != "attention" and rng.random() < 0.3:
            attention *= math.exp(rng.normal(0, scale / 8))
            what += "+attention"
        return self.project({"long_factor": np.exp(lam), "attention_factor": attention}), what

    def crossover(self, a: LongRopeCandidate, b: LongRopeCandidate, rng: np.random.Generator) -> LongRopeCandidate:
        """Geometric blend of two candidates (a blend of monotone vectors stays monotone)."""
        w = rng.uniform(0.2, 0.8)
        lam = np.exp(w * np.log(a["long_factor"]) + (1 - w) * np.log(b["long_factor"]))
        attention = math.exp(w * math.log(a["attention_factor"]) + (1 - w) * math.log(b["attention_factor"]))
        return self.project({"long_factor": lam, "attention_factor": attention})

    # -- the method ----------------------------------------------------------------------------------
    def method_params(self, params: LongRopeCandidate) -> MethodParams:
        """Keyword arguments of ``ropescale.patch`` for a candidate (short factors as ``short`` says)."""
        long = list(params["long_factor"])
        return {
            "factor": self.factor,
            "long_factor": long,
            "short_factor": list(long) if self.short == "long" else [1.0] * self.n_pairs,
            "attention_factor": float(params["attention_factor"]),
        }

    def factors(self, params: LongRopeCandidate) -> list[float]:
        return list(params["long_factor"])


@dataclass(frozen=True)
class YarnSpace:
    """YaRN's parameters: beta_fast, beta_slow (log scale) and attention_factor.

    Only YaRN itself is representable here (PI and NTK are not YaRN settings), so YaRN's defaults
    seed the search, with the attention factor at 1 as a second seed.
    """

    spec: RotarySpec
    factor: float
    beta_fast_bounds: tuple[float, float] = (2.0, 256.0)
    beta_slow_bounds: tuple[float, float] = (0.125, 16.0)
    attention_bounds: tuple[float, float] = (1.0, 1.35)

    method = "yarn"

    def __post_init__(self) -> None:
        if not self.factor > 1:
            raise ValueError(f"target length must exceed the original context (factor > 1), got factor {self.factor:g}")

    def seeds(self) -> list[tuple[str, YarnCandidate]]:
        default = get_method("yarn", factor=self.factor)
        base = {
            "beta_fast": default.beta_fast,
            "beta_slow": default.beta_slow,
            "attention_factor": round(default.attention_scale(self.factor), 6),
        }
        return [("yarn", base), ("yarn-af1", {**base, "attention_factor": 1.0})]

    def project(self, params: YarnCandidate, round_values: bool = True) -> YarnCandidate:
        fast = float(np.clip(params["beta_fast"], *self.beta_fast_bounds))
        slow = float(np.clip(params["beta_slow"], *self.beta_slow_bounds))
        if slow >= fast / 1.5:  # keep a ramp: beta_fast > beta_slow with some room
            slow = fast / 1.5
        attention = float(np.clip(params["attention_factor"], *self.attention_bounds))
        digits = 3 if round_values else 9
        return {
            "beta_fast": round(fast, digits),
            "beta_slow": round(slow, digits),
            "attention_factor": round(attention, 4 if round_values else 9),
        }

    def violations(self, params: YarnCandidate, tol: float = 1e-9) -> list[str]:
        problems = []
        for name, (low, high) in (
            ("beta_fast", self.beta_fast_bounds),
            ("beta_slow", self.beta_slow_bounds),
            ("attention_factor", self.attention_bounds),
        ):
            if not low - tol <= params[name] <= high + tol:
                problems.append(f"{name} {params[name]:g} outside [{low:g}, {high:g}]")
        if params["beta_fast"] <= params["beta_slow"]:
            problems.append("beta_fast must be > beta_slow")
        return problems

    def key(self, params: YarnCandidate) -> tuple:
        return (round(params["beta_fast"], 3), round(params["beta_slow"], 3), round(params["attention_factor"], 4))

    def mutate(self, params: YarnCandidate, rng: np.random.Generator, scale: float) -> tuple[YarnCandidate, str]:
        """Coordinate move: one parameter changed in log space."""
        name = str(rng.choice(["beta_fast", "beta_slow", "attention_factor"]))
        step = scale / 4 if name == "attention_factor" else 2 * scale
        new = dict(params)
        new[name] = params[name] * math.exp(rng.normal(0, step))
        return self.project(new), name

    def crossover(self, a: YarnCandidate, b: YarnCandidate, rng: np.random.Generator) -> YarnCandidate:
        w = rng.uniform(0.2, 0.8)
        return self.project({k: math.exp(w * math.log(a[k]) + (1 - w) * math.log(b[k])) for k in a})

    def method_params(self, params: YarnCandidate) -> MethodParams:
        return {"factor": self.factor, **{k: float(v) for k, v in params.items()}}

    def factors(self, params: YarnCandidate) -> list[float]:
        target = int(round(self.factor * self.spec.original_max_position_embeddings))
        return pair_factors("yarn", self.spec, self.factor, target, **params)[0]


def make_space(method: str, spec: RotarySpec, factor: float, **options: Any) -> Any:
    """The search space of ``method``: ``longrope``, ``yarn``, or an attention-level method's grid
    (``self_extend``, ``dca``, ``string``: :class:`ropescale.search.grid.AttentionSpace`)."""
    from .grid import ATTENTION_METHODS, AttentionSpace

    spaces = {"longrope": LongRopeSpace, "yarn": YarnSpace}
    key = str(method).strip().lower()
    if key in ATTENTION_METHODS:
        return AttentionSpace(key, spec, float(factor), **options)
    if key not in spaces:
        raise ValueError(f"search method must be one of {', '.join([*spaces, *ATTENTION_METHODS])}, got {method!r}")
    return spaces[key](spec, float(factor), **options)
