"""STRING as an attention function (positions: :mod:`ropescale.methods.string`).

Pairs closer than the shift S are neighbours at their true positions; pairs at distance S or more
rotate their query at i − S + W. That is Self-Extend's two-region structure with other far
positions, so it runs on :func:`.self_extend.banded_attention`: the far region is one causal call
on the sub-square (queries from S on, keys up to n − S), the band two batched block calls, merged
exactly by their log-sum-exp; decoding takes two key slices.
"""

from __future__ import annotations

from typing import Any

import torch

from .rotary import rotary_of
from .self_extend import _scale, banded_attention

NAME = "ropescale_string"


def string_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """STRING attention over unrotated q/k (the layer's cos/sin were the identity).

    Args:
        query: [b, h, q, head_dim]; key, value: [b, h_kv, kv, head_dim] (the whole cache).
        attention_mask: SDPA's boolean mask [b, 1, q, kv] (padding, sliding window) or None.
        scaling: softmax scale of the layer (1/sqrt(head_dim) if None).
        dropout: must be 0 (attention-level methods are for inference).
        **kwargs: ``position_ids`` [b, q] and the rest, as transformers passes them.

    Returns:
        ``(attn_output [b, q, h, head_dim], None)``.
    """
    rotary = rotary_of(module)
    S, W = rotary.shift, rotary.local_window
    out = banded_attention(
        query,
        key,
        value,
        attention_mask,
        kwargs["position_ids"],
        rotary,
        width=S,
        far_query=lambda p: (p - S + W).clamp(min=0),  # rows nearer than S have no far keys: any valid row
        far_key=lambda p: p,
        scale=_scale(scaling, query, dropout),
    )
    return out, None


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, string_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
