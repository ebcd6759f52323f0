"""Self-Extend as an attention function (method and formula: :mod:`ropescale.methods.self_extend`).

Self-Extend splits the (query i, key j) pairs in two: neighbours (i − j < W) keep their own
positions, distant pairs (i − j ≥ W) use grouped ones. :func:`banded_attention` computes each
region as its own attention call, with queries and keys rotated at that region's positions, and
merges the partial outputs exactly by their log-sum-exp (:mod:`.merge`). STRING reuses it with
other far positions (:mod:`.string`).

Without a padding mask and with positions 0..kv−1 (prefill of a fresh sequence, or one decoding
step) the regions have shapes the kernels take without a mask:

* far pairs, j ≤ i − W: the queries from W on against the keys up to n − W, a plain causal
  attention on that sub-square;
* neighbours, i − W < j ≤ i: cut the sequence into W-token blocks; a query sees the keys of its
  own block up to itself (causal attention, all blocks batched) and the keys of the previous
  block strictly after its own offset (all blocks batched, one W×W mask broadcast);
* decoding (one query): the neighbours are the last W keys, the far keys all before them.

Both paths read the keys' rotated forms from the cache layer's buffers (:mod:`.rotated_cache`)
when there are any, so a decoding step rotates only its query and its own key.

Anything else (padding, chunked prefill, non-contiguous positions) takes a masked path, cut into
row blocks to bound memory. Keys are cached before rotation (:mod:`.rotary`), so decoding after a
long prefill sees the same positions as a full forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..methods.self_extend import fractional_positions, grouped_positions
from .function import attention_function, register_attention
from .merge import MASK_BUDGET, attend, blockwise, merge
from .rotate_on_read import key_positions, rotate
from .rotated_cache import LayerState, rotated

NAME = "ropescale_self_extend"

Positions = Callable[[torch.Tensor], torch.Tensor]
Part = tuple[torch.Tensor, torch.Tensor, int]


def _self_extend(query, key, value, attention_mask, position_ids, rotary, scale, cached=None) -> torch.Tensor:
    G, W = rotary.group_size, rotary.window
    if rotary.fractional:  # p / G, no floor: every far key keeps a position of its own
        far_query, far_key = (lambda p: fractional_positions(p, p, G, W)[0]), (lambda p: p / G)
    else:
        shift = rotary.method.shift  # LongLM's W − W // G or (Llama.py) W − W / G
        far_query, far_key = (lambda p: grouped_positions(p, p, G, W, shift)[0]), (lambda p: p // G)
    return banded_attention(
        query,
        key,
        value,
        attention_mask,
        position_ids,
        rotary,
        width=W,
        far_query=far_query,
        far_key=far_key,
        scale=scale,
        cached=cached,
    )


self_extend_attention = attention_function(_self_extend, "self_extend")


def banded_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    rotary: Any,
    *,
    width: int,
    far_query: Positions,
    far_key: Positions | None,
    scale: float,
    cached: LayerState | None = None,
) -> torch.Tensor:
    """Attention where pairs closer than ``width`` keep their positions and the rest are remapped.

    Args:
        query: [b, h, q, d]; key, value: [b, h_kv, kv, d], unrotated.
        attention_mask: boolean [b, 1, q, kv] or None (causal, no padding).
        position_ids: [b, q] positions of the queries (keys: :func:`.rotary.key_positions`).
        rotary: the :class:`~.rotary.AttentionRotary` whose cos/sin table rotates.
        width: pairs with position distance < ``width`` are neighbours.
        far_query, far_key: positions → the positions far pairs rotate at (elementwise); ``far_key``
            None: the keys' own positions (the far region then reads the neighbours' rotated keys).
        scale: softmax scale.
        cached: the layer's rotated-key buffers (:func:`.rotated_cache.lookup`), read and extended by
            the mask-free paths; None rotates every key read.

    Returns:
        ``[b, q, h, d]`` in the query's dtype, contiguous.
    """
    q_len, kv_len = query.shape[2], key.shape[2]
    k_pos = key_positions(position_ids, kv_len)
    rot = _rotator(rotary, max(kv_len, int(position_ids.max()) + 1), query)
    if attention_mask is None and k_pos is None and q_len in (1, kv_len):
        n, device = kv_len, query.device

        def near_rows(a: int, b: int) -> torch.Tensor:
            return rot(key[:, :, a:b], slice(a, b))

        def far_rows(a: int, b: int) -> torch.Tensor:
            return rot(key[:, :, a:b], far_key(torch.arange(a, b, device=device)))

        split = max(0, n - width)  # keys before `split` are far from the last query
        if far_key is None:  # far keys rotate at their own positions too: one set of rotated keys
            keys = rotated(cached, "keys", key, 0, n, near_rows)
            near_k, far_k = keys[:, :, split if q_len == 1 else 0 :], keys[:, :, :split]
        else:  # a decoding step reads only the last `width` keys at their own positions
            near_k = rotated(cached, "near", key, split if q_len == 1 else 0, n, near_rows, window=width)
            far_k = rotated(cached, "far", key, 0, split, far_rows) if split else None
        if q_len == 1:  # decoding: the last `width` keys are neighbours, all before them far
            last = torch.arange(n - 1, n, device=device)
            if split:  # the query at both positions in one rotation
                both = rot(query.expand(-1, -1, 2, -1), torch.cat((last, far_query(last))))
                near_q, far_q = both[:, :, :1], both[:, :, 1:]
                parts = [(*attend(far_q, far_k, value[:, :, :split], scale), 0)]
            else:
                near_q, parts = rot(query, last), []
            parts.append((*attend(near_q, near_k, value[:, :, split:], scale), 0))
        else:
            pos = torch.arange(n, device=device)
            parts = band_parts(rot(query, slice(0, n)), near_k, value, width, scale)
            if n > width:  # far pairs j <= i − width: a causal attention on the sub-square
                far_q = rot(query[:, :, width:], far_query(pos[width:]))
                parts.append((*attend(far_q, far_k, value[:, :, :split], scale, causal=True), width))
        return _finish(merge(parts, q_len), query.dtype)

    p_k = torch.arange(kv_len, device=query.device)[None] if k_pos is None else k_pos  # [b or 1, kv]
    near_k = rot(key, p_k)
    far_k = near_k if far_key is None else rot(key, far_key(p_k))
    parts = []
    for r0, r1, allowed in _mask_blocks(attention_mask, q_len, kv_len, query.device):
        p_q = position_ids[:, r0:r1]
        near = (p_q[:, :, None] - p_k[:, None, :] < width)[:, None] & allowed  # [b, 1, rows, kv]
        rows = query[:, :, r0:r1]
        parts.append((*attend(rot(rows, p_q), near_k, value, scale, mask=near), r0))
        parts.append((*attend(rot(rows, far_query(p_q)), far_k, value, scale, mask=allowed & ~near), r0))
    return _finish(merge(parts, q_len), query.dtype)


def band_parts(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, width: int, scale: float) -> list[Part]:
    """Partial attentions over the band i − width < j ≤ i of a fresh sequence (q = kv = n), rotated.

    The sequence is cut into ``width``-token blocks: each query attends to its own block causally,
    and to the previous block's keys after its own offset.
    """
    n = query.shape[2]
    parts = [(*blockwise(query, key, value, width, scale, causal=True), 0)]
    if n > width:
        after = torch.ones(width, width, dtype=torch.bool, device=query.device).triu_(1)  # key offset > query offset
        prev = blockwise(query[:, :, width:], key, value, width, scale, mask=after[None, None])
        parts.append((*prev, width))
    return parts


def _mask_blocks(attention_mask: torch.Tensor | None, q_len: int, kv_len: int, device: torch.device):
    """Row blocks ``(r0, r1, allowed [b or 1, 1, rows, kv] bool)`` of the admitted pairs."""
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2  # additive mask
    step = max(1, MASK_BUDGET // max(1, kv_len))
    for r0 in range(0, q_len, step):
        r1 = min(q_len, r0 + step)
        if attention_mask is not None:
            allowed = attention_mask[:, :, r0:r1] if attention_mask.shape[2] > 1 else attention_mask
        else:  # causal, bottom-right aligned: query r is key kv − q + r
            rows = torch.arange(kv_len - q_len + r0, kv_len - q_len + r1, device=device)[:, None]
            allowed = (torch.arange(kv_len, device=device)[None, :] <= rows)[None, None]
        yield r0, r1, allowed


def _rotator(
    rotary: Any, size: int, query: torch.Tensor
) -> Callable[[torch.Tensor, torch.Tensor | slice], torch.Tensor]:
    """``rot(x, positions)``: x rotated at positions [s] (shared by the batch), [b, s], or a ``slice``
    of consecutive positions, from the rotary module's cos/sin table of at least ``size`` positions
    (query dtype and device); floating-point positions (fractional grouping) are computed, not looked up."""
    cos, sin = rotary.table(size, query.dtype, query.device)

    def rot(x: torch.Tensor, positions: torch.Tensor | slice) -> torch.Tensor:
        if isinstance(positions, torch.Tensor) and positions.is_floating_point():  # fractional: no table rows
            c, s = rotary.rows(positions, query.dtype)
            return rotate(x, *((t[None, None] if positions.dim() == 1 else t[:, None]) for t in (c, s)))
        return rotate(x, _rows(cos, positions), _rows(sin, positions))

    return rot


def _rows(table: torch.Tensor, positions: torch.Tensor | slice) -> torch.Tensor:
    """Table rows for positions [s] (shared by the batch), [b, s] or a slice. # [1 or b, 1, s, d]"""
    if isinstance(positions, slice):  # consecutive positions: a view, no gather
        return table[positions][None, None]
    return table[positions][None, None] if positions.dim() == 1 else table[positions][:, None]


def _finish(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return out.to(dtype).transpose(1, 2).contiguous()


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    register_attention(NAME, self_extend_attention)
