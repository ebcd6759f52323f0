"""Base RoPE, position interpolation and NTK-aware scaling (static and dynamic).

- RoFormer (Su et al., arXiv 2104.09864): θ_i = b^(−2i/d).
- Position Interpolation (Chen et al., arXiv 2306.15595): θ'_i = θ_i / s.
- NTK-aware (bloc97, r/LocalLLaMA 2023): b' = b · s^(d/(d−2)).
- Dynamic NTK (emozilla, r/LocalLLaMA 2023; transformers ``_compute_dynamic_ntk_parameters``):
  b' = b · α(ℓ)^(d/(d−2)) for ℓ > L, with α(ℓ) = s·ℓ/L − (s−1) (``alpha="transformers"``, the
  default: at ℓ = 4L and s = 4 the base is static NTK's at s = 13) or α(ℓ) = ℓ/L
  (``alpha="length"``: the base at ℓ is static NTK's at s = ℓ/L, whatever the target s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RotarySpec, ScalingMethod
from .types import RopeParameters


@dataclass(frozen=True, init=False)
class Default(ScalingMethod):
    """Plain RoPE, no scaling."""

    name = "default"
    training_free = "no scaling"
    runs_in = "every loader"
    summary = "plain RoPE, no scaling (factor must be 1)"
    rope_keys = ()

    def validate(self) -> None:
        if self.factor != 1.0:
            raise ValueError(f"factor must be 1 for method 'default', got {self.factor:g}")

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(device=device), 1.0


@dataclass(frozen=True, init=False)
class Linear(ScalingMethod):
    """Position interpolation: every frequency divided by the factor."""

    name = "linear"
    training_free = "no: fine-tune"
    runs_in = "transformers, vLLM, SGLang, llama.cpp"
    summary = "position interpolation (PI): every frequency / factor"
    rope_keys = ("factor",)

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(device=device) / self.factor, 1.0


@dataclass(frozen=True, init=False)
class NTK(ScalingMethod):
    """NTK-aware static base change; transformers expresses it as plain RoPE with a larger base."""

    name = "ntk"
    training_free = "yes"
    runs_in = "transformers, vLLM, SGLang, TGI, llama.cpp"
    summary = "NTK-aware: base b·s^(d/(d-2)), highest frequency kept, lowest scaled like PI"

    def scaled_base(self, spec: RotarySpec) -> float:
        d = spec.dim
        return spec.base * self.factor ** (d / (d - 2))

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(base=self.scaled_base(spec), device=device), 1.0

    def rope_parameters(self, spec: RotarySpec) -> RopeParameters:
        return {"rope_type": "default", "rope_theta": self.scaled_base(spec)}


#: dynamic NTK's schedules of α(ℓ): what each means (``ropescale methods`` shows them)
DYNAMIC_NTK_ALPHAS = {
    "transformers": "alpha=transformers: base as static NTK at s·ℓ/L−(s−1) (x4: 13 at 4L)",
    "length": "alpha=length: as static NTK at ℓ/L",
}


@dataclass(frozen=True, init=False)
class DynamicNTK(ScalingMethod):
    """NTK-aware base recomputed from the current length ℓ; plain RoPE while ℓ ≤ L.

    ``alpha`` picks the schedule (module docstring). Both save natively: transformers' ``dynamic``
    rope type computes α(ℓ) = f·ℓ/L − (f−1) from its ``factor`` f, which is s for ``transformers``
    and 1 for ``length``; ``factor`` itself stays the target s = extended context / L.
    """

    name = "dynamic_ntk"
    training_free = "yes"
    runs_in = "transformers, TGI; vLLM < 0.22/SGLang approximate; vLLM ≥ 0.22 fails past L"
    summary = "dynamic NTK: base recomputed from the current length ℓ, plain RoPE up to L; " + "; ".join(
        DYNAMIC_NTK_ALPHAS.values()
    )
    dynamic = True

    alpha: str = "transformers"

    def validate(self) -> None:
        if self.alpha not in DYNAMIC_NTK_ALPHAS:
            raise ValueError(f"alpha must be one of {', '.join(DYNAMIC_NTK_ALPHAS)}, got {self.alpha!r}")

    @property
    def native_factor(self) -> float:
        """transformers' ``factor`` f that gives this schedule: α(ℓ) = f·ℓ/L − (f−1)."""
        return self.factor if self.alpha == "transformers" else 1.0

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        L = spec.original_max_position_embeddings
        length = max(seq_len or L, L)
        d, f = spec.dim, self.native_factor
        base = spec.base * ((f * length / L) - (f - 1)) ** (d / (d - 2))
        return spec.base_inv_freq(base=base, device=device), 1.0

    def rope_parameters(self, spec: RotarySpec) -> RopeParameters:
        # transformers reads L from max_position_embeddings, which patching keeps at L.
        return {"rope_type": "dynamic", "rope_theta": spec.base, "factor": self.native_factor}
