"""Dynamic scaling that is consistent with the KV cache.

With dynamic NTK or dynamic YaRN the frequencies follow the current length ℓ. transformers
rotates each key once, when it enters the cache, so after a few decoding steps the cache holds
keys rotated with many different bases while the new query uses the newest one
(transformers #25104; caching keys before rotation was declined there as too slow). A cached
generation then differs from a full forward pass over the same tokens.

Here the cache holds keys before rotation (see :mod:`ropescale.attention.rotate_on_read`) and every call
rotates the queries and *all* keys with the frequencies of the current ℓ, then runs the model's
own attention kernel (SDPA or eager). Cached generation equals recomputation; the price is one
rotation of the cached keys per layer and step, measured by ``benchmarks/bench_kv_consistency.py``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .rotate_on_read import at, key_positions, rotary_of, rotate

#: the model's own implementation → the name this mode registers for it
NAMES = {"sdpa": "ropescale_kv_consistent", "eager": "ropescale_kv_consistent_eager"}


def kv_consistent_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    inner: str,
    **kwargs: Any,
):
    """Rotate queries and every cached key with the current frequencies, then attend.

    Args:
        module: the attention layer (``LlamaAttention``, ``MistralAttention``, ...).
        query: [b, h, q, head_dim], key/value: [b, h_kv, kv, head_dim], all *unrotated*.
        attention_mask: the mask built by the inner implementation's mask function, or None.
        inner: ``"sdpa"`` or ``"eager"``.
        **kwargs: as transformers passes them (``position_ids`` [b, q], ``scaling``, ``dropout``...).

    Returns:
        ``(attn_output [b, q, h, head_dim], attn_weights or None)`` from the inner kernel.
    """
    rotary = rotary_of(module)
    position_ids = kwargs["position_ids"]  # [b, q]
    q_len, kv_len = query.shape[2], key.shape[2]
    cos, sin = rotary.table(max(kv_len, int(position_ids.max()) + 1), query.dtype, query.device)  # [n, d]
    query = rotate(query, at(cos, position_ids, q_len), at(sin, position_ids, q_len))
    positions = key_positions(position_ids, kv_len)
    key = rotate(key, at(cos, positions, kv_len), at(sin, positions, kv_len))
    if inner == "eager":
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None and 1 < q_len < kv_len:  # SDPA's is_causal would align top-left
        attention_mask = causal_mask(q_len, kv_len, query.device)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Bottom-right aligned causal mask: query i is key kv − q + i. # [1, 1, q, kv] bool"""
    rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return (torch.arange(kv_len, device=device)[None, :] <= rows)[None, None]


def register() -> None:
    """Register the mode's attention functions and masks with transformers (idempotent)."""
    from functools import partial

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    masks = {"sdpa": sdpa_mask, "eager": eager_mask}
    for inner, name in NAMES.items():
        AttentionInterface.register(name, partial(kv_consistent_attention, inner=inner))
        AttentionMaskInterface.register(name, masks[inner])
