"""Self-Extend as an attention function (method and formula: :mod:`ropescale.methods.self_extend`).

Every score needs one of two rotations: neighbour (query i, key j) when i − j < W, grouped
(i // G + W − W // G, j // G) beyond. Rather than computing both score matrices and merging them
(LongLM's eager path, O(q·kv) memory), this runs one SDPA call per block of queries over a
doubled head dimension: queries are ``[q_neighbour, q_grouped]``, each key appears as
``[k_neighbour, 0]`` and/or ``[0, k_grouped]``, and a boolean mask admits for every (i, j)
exactly the copy of its region. The dot products, and so the softmax, are exactly Self-Extend's;
memory stays O(block·kv), and a decoding step (one query) needs no mask at all.

Keys are cached before rotation (:mod:`ropescale.attention.rotary`), so decoding after a long
prefill sees the same positions as a full forward pass.
"""

from __future__ import annotations

from typing import Any

import torch

from ..methods.self_extend import grouped_positions
from .rotary import at, key_positions, rotary_of, rotate

NAME = "ropescale_self_extend"
QUERY_BLOCK = 1024  # queries per SDPA call in prefill: the mask is [block, ≤ kv + block]


def self_extend_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
):
    """Self-Extend attention over unrotated q/k (the layer's cos/sin were the identity).

    Args:
        query: [b, h, q, head_dim]; key, value: [b, h_kv, kv, head_dim] (the whole cache).
        attention_mask: SDPA's boolean mask [b, 1, q, kv] (padding, sliding window) or None.
        scaling: softmax scale of the layer (1/sqrt(head_dim)); kept although the SDPA head
            dimension is doubled.
        **kwargs: ``position_ids`` [b, q] and the rest, as transformers passes them.

    Returns:
        ``(attn_output [b, q, h, head_dim], None)``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rotary = rotary_of(module)
    G, W = rotary.group_size, rotary.window
    position_ids = kwargs.pop("position_ids")  # [b, q]
    q_len, kv_len, head_dim = query.shape[2], key.shape[2], query.shape[-1]
    k_pos = key_positions(position_ids, kv_len)
    k_pos = torch.arange(kv_len, device=query.device)[None] if k_pos is None else k_pos  # [b or 1, kv]
    q_group, k_group = grouped_positions(position_ids, k_pos, G, W)
    cos, sin = rotary.table(max(kv_len, int(position_ids.max()) + 1, W + 1), query.dtype, query.device)
    query = torch.cat(
        (
            rotate(query, at(cos, position_ids, q_len), at(sin, position_ids, q_len)),
            rotate(query, at(cos, q_group, q_len), at(sin, q_group, q_len)),
        ),
        dim=-1,
    )  # [b, h, q, 2hd]
    zeros = torch.zeros_like(key)
    near = torch.cat((rotate(key, at(cos, k_pos, kv_len), at(sin, k_pos, kv_len)), zeros), dim=-1)  # [b, h_kv, kv, 2hd]
    far = torch.cat((zeros, rotate(key, at(cos, k_group, kv_len), at(sin, k_group, kv_len))), dim=-1)
    value = torch.cat((value, torch.zeros_like(value)), dim=-1)  # SDPA's fast kernels want equal head dims

    outputs = []
    for r0 in range(0, q_len, QUERY_BLOCK):
        r1 = min(q_len, r0 + QUERY_BLOCK)
        t = torch.arange(kv_len - q_len + r0, kv_len - q_len + r1, device=query.device)  # key index of each query
        far_end = max(0, int(t[-1]) - W + 1)  # keys j <= t - W are grouped for some query
        near_start = max(0, int(t[0]) - W + 1)  # keys j > t - W are neighbours for some query
        near_end = int(t[-1]) + 1
        keys = torch.cat((far[:, :, :far_end], near[:, :, near_start:near_end]), dim=2)
        values = torch.cat((value[:, :, :far_end], value[:, :, near_start:near_end]), dim=2)
        mask = None
        if r1 - r0 > 1 or attention_mask is not None:
            j_far = torch.arange(far_end, device=query.device)
            j_near = torch.arange(near_start, near_end, device=query.device)
            distance_near = t[:, None] - j_near[None, :]
            mask = torch.cat((t[:, None] - j_far[None, :] >= W, (distance_near >= 0) & (distance_near < W)), dim=1)
            mask = mask[None, None]  # [1, 1, block, keys]
            if attention_mask is not None:
                rows = attention_mask[:, :, r0:r1] if attention_mask.shape[2] > 1 else attention_mask
                mask = mask & torch.cat((rows[..., :far_end], rows[..., near_start:near_end]), dim=-1)
        out, _ = sdpa_attention_forward(
            module, query[:, :, r0:r1], keys, values, mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs
        )
        outputs.append(out[..., :head_dim])  # [b, block, h, hd]
    return torch.cat(outputs, dim=1).contiguous(), None


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, self_extend_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
