"""llama.cpp's Self-Extend as an attention function (schedule: :mod:`ropescale.methods.self_extend_llamacpp`).

llama.cpp moves the positions of the keys in its cache between batches; within a batch every
query and every key has one position. So each batch is one plain attention, with the queries and
keys rotated at the positions the cache holds while that batch is decoded
(:func:`~ropescale.methods.self_extend_llamacpp.llamacpp_positions`); no two-region merge is
needed. Keys are cached unrotated (:mod:`.rotate_on_read`) and rotated here at the batch's positions, which
is what llama.cpp's K-shift does to its rotated keys, up to rounding (with its ``seq_div`` sign:
``kshift``).

A forward call is cut into llama.cpp's batches: a call of one token (a decoding step) is a batch
of its own; a longer call (a prompt) is cut into ``n_batch``-token batches from its smallest
position, as ``llama-completion`` cuts a prompt. Batches with the same number of grouped blocks
share one call; with a padding mask each row keeps its own positions.
"""

from __future__ import annotations

import torch

from ..methods.self_extend_llamacpp import llamacpp_positions
from .function import attention_function, register_attention
from .merge import attend, merge
from .rotate_on_read import key_positions, rotate

NAME = "ropescale_self_extend_llamacpp"


def batch_starts(position_ids: torch.Tensor, n_batch: int) -> torch.Tensor:
    """Index of the first token of the llama.cpp batch each query is decoded in. # [b, q]

    One query (a decoding step): its own position. More: ``n_batch``-token batches counted from
    the call's smallest position (padded queries carry small positions and are masked anyway).
    """
    if position_ids.shape[1] == 1:
        return position_ids
    start = position_ids.min(dim=1, keepdim=True).values.clamp(min=0)  # [b, 1]
    return start + (position_ids - start).clamp(min=0) // n_batch * n_batch


def _llamacpp(query, key, value, attention_mask, position_ids, rotary, scale, cached=None) -> torch.Tensor:
    G, W = rotary.group_size, rotary.window
    q_len, kv_len, device = query.shape[2], key.shape[2], query.device
    k_pos = key_positions(position_ids, kv_len)
    p_k = torch.arange(kv_len, device=device)[None] if k_pos is None else k_pos  # [1 or b, kv]
    # shipped K-shift: a grouped key turns to 2j − j // G, up to twice the sequence
    cos, sin = rotary.table(2 * max(kv_len, int(position_ids.max()) + 1), query.dtype, device)
    blocks = batch_starts(position_ids, rotary.n_batch) // W  # [b, q]: blocks grouped when each query runs
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2  # additive mask
    parts = []
    for k in torch.unique(blocks).tolist():
        rows = (blocks == k).any(0).nonzero()  # query rows decoded with k blocks grouped, in some batch row
        r0, r1 = int(rows[0]), int(rows[-1]) + 1
        end = kv_len - q_len + r1  # keys after the last of these queries are never visible
        q_p, k_p = llamacpp_positions(k * W, position_ids[:, r0:r1], p_k[:, :end], G, W, rotary.kshift)
        q_rot = rotate(query[:, :, r0:r1], cos[q_p][:, None], sin[q_p][:, None])  # [b, h, rows, d]
        k_rot = rotate(key[:, :, :end], cos[k_p][:, None], sin[k_p][:, None])  # [b, h_kv, end, d]
        own = blocks[:, r0:r1] == k  # [b, rows]
        start = end - (r1 - r0)  # first key of these queries' own tokens
        if attention_mask is None and bool(own.all()):  # all earlier keys, then a causal square
            parts.append((*attend(q_rot, k_rot[:, :, :start], value[:, :, :start], scale), r0))
            parts.append((*attend(q_rot, k_rot[:, :, start:], value[:, :, start:end], scale, causal=True), r0))
            continue
        if attention_mask is None:  # causal, bottom-right aligned: query r is key start + r
            allowed = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
            allowed = allowed[None, None]
        else:
            allowed = attention_mask[:, :, r0:r1, :end] if attention_mask.shape[2] > 1 else attention_mask[..., :end]
        parts.append((*attend(q_rot, k_rot, value[:, :, :end], scale, mask=allowed & own[:, None, :, None]), r0))
    return merge(parts, q_len).to(query.dtype).transpose(1, 2).contiguous()


self_extend_llamacpp_attention = attention_function(_llamacpp, "self_extend_llamacpp")


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    register_attention(NAME, self_extend_llamacpp_attention)
