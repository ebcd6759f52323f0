"""STRING as an attention function (positions: :mod:`ropescale.methods.string`).

Pairs closer than the shift S are neighbours at their true positions; pairs at distance S or more
rotate their query at i − S + W. That is Self-Extend's two-region structure with other far
positions, so it runs on :func:`.self_extend.banded_attention`: the far region is one causal call
on the sub-square (queries from S on, keys up to n − S), the band two batched block calls, merged
exactly by their log-sum-exp; decoding takes two key slices. Both regions rotate keys at their own
positions, so one set of rotated keys (kept beside the cache, :mod:`.rotated_cache`) serves both.
"""

from __future__ import annotations

import torch

from .function import attention_function, register_attention
from .self_extend import banded_attention

NAME = "ropescale_string"


def _string(query, key, value, attention_mask, position_ids, rotary, scale, cached=None) -> torch.Tensor:
    S, W = rotary.shift, rotary.local_window
    return banded_attention(
        query,
        key,
        value,
        attention_mask,
        position_ids,
        rotary,
        width=S,
        far_query=lambda p: (p - S + W).clamp(min=0),  # rows nearer than S have no far keys: any valid row
        far_key=None,  # keys keep their positions: both regions read one set of rotated keys
        scale=scale,
        cached=cached,
    )


string_attention = attention_function(_string, "string")


def register() -> None:
    """Register the attention function and SDPA's mask function under :data:`NAME` (idempotent)."""
    register_attention(NAME, string_attention)
