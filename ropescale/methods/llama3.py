"""Llama 3.1 frequency scaling (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783;
reference ``apply_scaling`` in meta-llama/llama-models and transformers
``_compute_llama3_parameters``).

Wavelengths shorter than L/high_freq_factor keep θ_i, longer than L/low_freq_factor get θ_i/s,
and in between the two are blended by smooth = (L/λ − low)/(high − low). No temperature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import RotarySpec, ScalingMethod, check_number


@dataclass(frozen=True, init=False)
class Llama3(ScalingMethod):
    name = "llama3"
    training_free = "no: Meta's recipe"
    runs_in = "transformers, vLLM, SGLang, TGI, llama.cpp (not Qwen)"
    summary = "Llama 3.1: long wavelengths / s, short kept, smooth blend between (no temperature)"
    rope_keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    def validate(self) -> None:
        check_number("low_freq_factor", self.low_freq_factor, minimum=0, strict=True)
        check_number("high_freq_factor", self.high_freq_factor, minimum=0, strict=True)
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor must be > low_freq_factor, got {self.high_freq_factor:g} <= {self.low_freq_factor:g}"
            )

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        L = spec.original_max_position_embeddings
        theta = spec.base_inv_freq(device=device)  # [d/2]
        wavelen = 2 * math.pi / theta
        smooth = ((L / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)).clamp(0, 1)
        # smooth = 1 for wavelen < L/high (kept), 0 for wavelen > L/low (interpolated)
        return (1 - smooth) * theta / self.factor + smooth * theta, 1.0
