"""transformers' attention-function contract around a region kernel, and its registration.

Self-Extend, DCA and STRING differ only in their kernel ``(query, key, value, mask, position_ids,
rotary, scale) -> out``; the wrapper that transformers calls (through ``AttentionInterface``) and
the registration under a name are the same for all three.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .rotate_on_read import rotary_of
from .rotated_cache import lookup

#: ``(query, key, value, attention_mask, position_ids, rotary, scale, cached) -> [b, q, h, d]``
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, torch.Tensor, Any, float, Any], torch.Tensor]


def softmax_scale(scaling: float | None, query: torch.Tensor, dropout: float) -> float:
    """The layer's softmax scale (1/sqrt(head_dim) if None); attention dropout is refused."""
    if dropout:
        raise ValueError(f"attention-level methods do not apply attention dropout (got {dropout}); use eval()")
    return scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])


def logn_scale(positions: torch.Tensor, context: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The log-length query scale: ``max(1, ln(p + 1) / ln(L))`` for a query at position p.

    A query beyond the trained context L sees more keys than any query in training, so its softmax
    spreads thinner over them and a single far key (a needle) draws less weight than it would at
    L. Scaling the query (hence its scores) by ln(p + 1) / ln(L) keeps the softmax's entropy where
    training left it (Chiang & Cholak, arXiv 2202.12172; Qwen's "logn attention"). Positions up to
    L − 1 get exactly 1: every prompt within the trained context is computed as without it.

    Args:
        positions: query positions (any shape, 0-based).
        context: the trained context L (> 1).
        dtype: dtype of the result.
    """
    p = positions.to(torch.float64) + 1.0
    return (p.log() / math.log(context)).clamp(min=1.0).to(dtype)


def attention_function(kernel: Kernel, method: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """An attention function with transformers' signature that runs ``kernel`` on unrotated q/k.

    The function returned takes ``(module, query [b, h, q, d], key/value [b, h_kv, kv, d] (the whole
    cache), attention_mask (SDPA's boolean [b, 1, q, kv] or None), scaling=None, dropout=0.0,
    position_ids=[b, q], ...)`` — the layer's cos/sin were the identity, so q/k arrive unrotated —
    and returns ``(attn_output [b, q, h, d], None)``.

    The kernel also gets the layer's rotated-key buffers (:func:`.rotated_cache.lookup`, or None).

    Args:
        kernel: the method's attention over unrotated q/k.
        method: the method's name, for the function's name and docstring.
    """

    def attention(
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        scale = softmax_scale(scaling, query, dropout)
        rotary = rotary_of(module)
        if rotary.logn_context is not None:
            query = query * logn_scale(kwargs["position_ids"], rotary.logn_context, query.dtype)[:, None, :, None]
        cached = lookup(module, rotary, key)  # the layer's rotated keys, when they provably match its cache
        return kernel(query, key, value, attention_mask, kwargs["position_ids"], rotary, scale, cached), None

    attention.__name__ = attention.__qualname__ = f"{method}_attention"
    attention.__doc__ = f"{method} attention over unrotated q/k (see :func:`attention_function`)."
    return attention


def register_attention(name: str, function: Callable[..., Any]) -> None:
    """Register ``function`` and SDPA's mask function under ``name`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
