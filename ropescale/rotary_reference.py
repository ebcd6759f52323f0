"""Reference rotary embedding: plain PyTorch, cos/sin always in fp32.

Two layouts exist in the wild. ``"half"`` (GPT-NeoX, Llama/Mistral in transformers) pairs
dimension i with i + d/2 and uses ``emb = cat(freqs, freqs)``; ``"interleaved"`` (GPT-J, the
original Meta Llama checkpoints, RoFormer) pairs 2i with 2i+1. Both rotate each pair by
position × θ_i; they differ only in which coordinates form a pair.
"""

from __future__ import annotations

from typing import Literal

import torch

Layout = Literal["half", "interleaved"]


def cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, attention_factor: float = 1.0, layout: Layout = "half"
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position × θ_i, scaled by ``attention_factor``, in fp32.

    Args:
        inv_freq: θ_i, shape [d/2].
        positions: integer or float positions, shape [..., s].
        attention_factor: multiplies cos and sin (YaRN's mscale), so q·k scales by its square.
        layout: ``"half"`` or ``"interleaved"`` (see module docstring).

    Returns:
        ``(cos, sin)``, each of shape [..., s, d], fp32.
    """
    freqs = positions[..., None].float() * inv_freq.float()  # [..., s, d/2]
    emb = torch.cat((freqs, freqs), dim=-1) if layout == "half" else freqs.repeat_interleave(2, dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor  # [..., s, d]


def _rotate(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: Layout = "half"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys. The math runs in fp32; results come back in the inputs' dtype.

    Args:
        q: [b, h, s, d] (or any shape ending in [s, d] that broadcasts with cos/sin).
        k: [b, h_kv, s, d].
        cos, sin: [b, s, d] or [s, d] from :func:`cos_sin`; broadcast over heads.
        layout: ``"half"`` or ``"interleaved"``; must match how cos/sin were built.

    Returns:
        Rotated ``(q, k)``. Only the first ``cos.shape[-1]`` dims are rotated (partial rotary);
        the rest pass through.
    """
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # [b, 1, s, d]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        d = cos.shape[-1]
        x_rot, x_pass = x[..., :d].float(), x[..., d:]
        out = x_rot * cos + _rotate(x_rot, layout) * sin
        return torch.cat((out.to(x.dtype), x_pass), dim=-1)

    return rotate(q), rotate(k)
