"""A drop-in rotary embedding module for methods transformers cannot build from its config.

It has the same contract as ``LlamaRotaryEmbedding.forward(x, position_ids) -> (cos, sin)``
(half layout, cos/sin computed in fp32, scaled by the attention factor, returned in x's dtype),
so it replaces ``model.model.rotary_emb`` and nothing else changes.
"""

from __future__ import annotations

import torch
from torch import nn

from ..methods import RotarySpec, ScalingMethod
from ..rotary_reference import cos_sin


class ScaledRotaryEmbedding(nn.Module):
    """Rotary embedding driven by a ropescale :class:`ScalingMethod`.

    For methods whose frequencies depend on the current length ℓ = max(position_ids) + 1 (dynamic
    methods, LongRoPE's switch at L) they are recomputed when ℓ changes, so results do not depend
    on the order of earlier calls.
    """

    def __init__(self, method: ScalingMethod, spec: RotarySpec, device: torch.device | None = None):
        super().__init__()
        self.method, self.spec = method, spec
        self.rope_type = "ropescale_" + method.name
        inv_freq, self.attention_scaling = method.compute(spec, None, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [d/2] fp32
        self._seq_len: int | None = None

    def _update(self, seq_len: int, device: torch.device) -> None:
        if not self.method.varies_with_length():
            return
        if seq_len <= self.spec.original_max_position_embeddings:
            seq_len = self.spec.original_max_position_embeddings  # all lengths up to L are identical
        if seq_len != self._seq_len:
            inv_freq, self.attention_scaling = self.method.compute(self.spec, seq_len, device)
            self.inv_freq = inv_freq.float()
            self._seq_len = seq_len

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [b, s, hidden] (only its dtype/device matter); position_ids: [b, s]
        self._update(int(position_ids.max()) + 1, x.device)
        cos, sin = cos_sin(self.inv_freq.to(x.device), position_ids, self.attention_scaling)  # [b, s, d]
        return cos.to(x.dtype), sin.to(x.dtype)

    def extra_repr(self) -> str:
        return f"method={self.method.name}, params={self.method.params()}, dim={self.spec.dim}"
