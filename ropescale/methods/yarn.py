"""YaRN: NTK-by-parts interpolation plus attention temperature, static and dynamic.

Peng, Quesnelle, Fan, Shippole, "YaRN: Efficient Context Window Extension of Large Language
Models", arXiv 2309.00071; reference code jquesnelle/yarn (``scaled_rope/``) and transformers
``_compute_yarn_parameters`` (which adds ``attention_factor``, ``mscale``/``mscale_all_dim`` from
DeepSeek, and ``truncate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..rope_math import yarn_mscale
from .base import RotarySpec, ScalingMethod, bounded


def correction_range(spec: RotarySpec, beta_fast: float, beta_slow: float, truncate: bool) -> tuple[float, float]:
    """Pair indices (low, high) between which YaRN ramps from keeping θ_i to dividing it by s.

    dim(r) = d·ln(L/(2πr)) / (2·ln b) is the pair index that turns r times over L.
    """
    d, L, b = spec.dim, spec.original_max_position_embeddings, spec.base

    def dim_for(rotations: float) -> float:
        return d * math.log(L / (2 * math.pi * rotations)) / (2 * math.log(b))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def yarn_inv_freq(
    spec: RotarySpec,
    factor: float,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
    device: torch.device | None = None,
) -> torch.Tensor:
    """NTK-by-parts frequencies: fast pairs keep θ_i, slow pairs get θ_i/s, a linear ramp between."""
    low, high = correction_range(spec, beta_fast, beta_slow, truncate)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    theta = spec.base_inv_freq(device=device)  # [d/2]
    index = torch.arange(spec.dim // 2, dtype=torch.float32, device=device)
    ramp = torch.clamp((index - low) / (high - low), 0, 1)  # 0 = keep, 1 = interpolate
    return theta / factor * ramp + theta * (1 - ramp)


@dataclass(frozen=True, init=False)
class Yarn(ScalingMethod):
    """Static YaRN at a fixed factor s."""

    name = "yarn"
    training_free = "yes, or fine-tune"
    runs_in = "transformers, vLLM, SGLang, TGI, llama.cpp"
    summary = "YaRN: NTK-by-parts (fast dims kept, slow dims / s) + attention temperature 0.1 ln s + 1"
    rope_keys = (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "truncate",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
    )

    beta_fast: float = bounded(32.0, above_field="beta_slow")
    beta_slow: float = bounded(1.0)
    attention_factor: float | None = bounded(None)
    mscale: float | None = bounded(None, together=("mscale_all_dim", "DeepSeek's attention factor"))
    mscale_all_dim: float | None = bounded(None)
    truncate: bool = True

    def attention_scale(self, factor: float) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(factor, self.mscale) / yarn_mscale(factor, self.mscale_all_dim)
        return yarn_mscale(factor)

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        inv_freq = yarn_inv_freq(spec, self.factor, self.beta_fast, self.beta_slow, self.truncate, device)
        return inv_freq, self.attention_scale(self.factor)


@dataclass(frozen=True, init=False)
class DynamicYarn(Yarn):
    """YaRN recomputed at s = max(1, ℓ/L) from the current length ℓ (jquesnelle/yarn,
    ``LlamaDynamicYaRNScaledRotaryEmbedding``), frequencies and temperature alike.

    ``factor`` is the extension the user targets (reported, used to size evaluations); it does not
    cap s. Unlike the reference module, whose cache only grows, the frequencies here are a pure
    function of the current length, so a result never depends on what ran before.
    """

    name = "dynamic_yarn"
    training_free = "yes"
    runs_in = "ropescale"
    summary = "dynamic YaRN: YaRN at s = current length / L, plain RoPE up to L"
    dynamic = True
    rope_keys = None  # transformers has no dynamic YaRN: ropescale swaps the rotary module

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        L = spec.original_max_position_embeddings
        scale = max(1.0, (seq_len or L) / L)
        inv_freq = yarn_inv_freq(spec, scale, self.beta_fast, self.beta_slow, self.truncate, device)
        return inv_freq, self.attention_scale(scale)
