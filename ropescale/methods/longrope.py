"""LongRoPE: searched per-dimension rescale factors (Ding et al., arXiv 2402.13753; reference
microsoft/LongRoPE and transformers ``_compute_longrope_parameters``, as used by Phi-3).

θ'_i = θ_i / λ_i with ``short_factor`` while ℓ ≤ L and ``long_factor`` beyond;
attention factor sqrt(1 + ln s / ln L) unless given.

The switch at L makes the frequencies depend on the current length: a generation that crosses L
holds keys cached with the short factors while new ones use the long factors (transformers' own
module does exactly that). Patching therefore installs the KV-consistent mode for LongRoPE by
default (``ropescale.attention``: cached keys rotated with the current factors, so cached
generation equals recomputation); ``kv_consistent=False`` gives transformers' behaviour. With
``short_factor`` equal to ``long_factor`` nothing switches and no mode is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import RotarySpec, ScalingMethod, check_number
from .types import RopeParameters


@dataclass(frozen=True, init=False)
class LongRope(ScalingMethod):
    name = "longrope"
    training_free = "yes, searched"
    runs_in = "transformers, vLLM, SGLang, TGI, llama.cpp (not Qwen)"
    summary = "LongRoPE: per-dimension factors (short_factor up to L, long_factor beyond), sqrt(1+ln s/ln L)"

    long_factor: tuple[float, ...] | None = None
    short_factor: tuple[float, ...] | None = None
    attention_factor: float | None = None

    def validate(self) -> None:
        if self.long_factor is None:
            raise ValueError("long_factor is required for longrope: one rescale factor per rotary pair (d/2 values)")
        for name in ("long_factor", "short_factor"):
            for i, v in enumerate(getattr(self, name) or ()):
                check_number(f"{name}[{i}]", v, minimum=0, strict=True)
        if self.attention_factor is not None:
            check_number("attention_factor", self.attention_factor, minimum=0, strict=True)

    def validate_for(self, spec: RotarySpec) -> None:
        n = spec.dim // 2
        for name in ("long_factor", "short_factor"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} must have {n} entries (rotary dim {spec.dim} / 2), got {len(value)}")

    def varies_with_length(self) -> bool:
        short = self.short_factor or tuple(1.0 for _ in self.long_factor)
        return tuple(short) != tuple(self.long_factor)

    def factors(self, spec: RotarySpec, seq_len: int | None) -> tuple[float, ...]:
        self.validate_for(spec)
        if seq_len and seq_len > spec.original_max_position_embeddings:
            return self.long_factor
        return self.short_factor or (1.0,) * (spec.dim // 2)

    def attention_scale(self, spec: RotarySpec) -> float:
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(spec.original_max_position_embeddings))

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        ext = torch.tensor(self.factors(spec, seq_len), dtype=torch.float32, device=device)  # [d/2]
        return spec.base_inv_freq(device=device) / ext, self.attention_scale(spec)

    def rope_parameters(self, spec: RotarySpec) -> RopeParameters:
        self.validate_for(spec)
        params = {
            "rope_type": "longrope",
            "rope_theta": spec.base,
            "factor": self.factor,
            "original_max_position_embeddings": spec.original_max_position_embeddings,
            "long_factor": list(self.long_factor),
            "short_factor": list(self.short_factor or (1.0,) * (spec.dim // 2)),
        }
        if self.attention_factor is not None:
            params["attention_factor"] = self.attention_factor
        return params
