"""Self-Extend: training-free grouped attention (Jin et al., "LLM Maybe LongLM: Self-Extend LLM
Context Window Without Tuning", arXiv 2401.01325; reference code datamllab/LongLM,
``self_extend_patch/Llama.py``).

Keys within the neighbour window W of a query keep their normal positions; beyond it, query and
key positions are floor-divided by the group size G, so no relative position exceeds what the
model saw in training:

    neighbour (i − j < W):  query i,                 key j
    grouped   (i − j ≥ W):  query i // G + W − W // G, key j // G

The frequencies are plain RoPE; the method lives in the attention function
(:mod:`ropescale.attention.self_extend`), which patching installs through transformers'
attention interface. LongLM rotates with the model's own rotary module, so on a checkpoint its maker
already extended (Llama 3.1's ``llama3``) it keeps those frequencies; so does ropescale where the rule
composes (:mod:`ropescale.methods.composed`: the shipped frequencies and attention factor, W and G
measured in the shipped context).

LongLM rounds the grouped query's shift two ways, offered by ``shift``:

* ``floor`` (the default): ``W − W // G``, in ``self_extend_patch/Mistral.py``, ``Qwen2.py``,
  ``Llama_4_40.py`` (whose commit 715c1e3 calls the float "accidental") and every flash decode path;
* ``float``: ``W − W / G``, in ``self_extend_patch/Llama.py``'s ``self_extend_forward`` (prefill and
  decode), the function ``SelfExtend.apply`` installs for Llama without flash attention, and Gemma.py.

They agree when G divides W. Each variant uses its shift in prefill and decoding alike (LongLM's
Llama flash path mixes them: float in prefill, floor in decoding; not offered). ``logn`` is
LongLM's ``scale_base`` (log-length query scale, base L); ``fractional`` is ropescale's own.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from .base import RotarySpec, ScalingMethod
from .types import MethodParams


def _check_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


#: the grouped query's shift: ``floor`` W − W // G, ``float`` W − W / G (LongLM's Llama.py)
SHIFTS = ("floor", "float")


def grouped_positions(
    query_positions: torch.Tensor, key_positions: torch.Tensor, group_size: int, window: int, shift: str = "floor"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-Extend's grouped positions: (query // G + W − W // G, key // G); with ``shift="float"``
    the query's shift is W − W / G (fp32 positions)."""
    G, W = group_size, window
    if shift == "float":
        return (query_positions // G).float() + (W - W / G), key_positions // G
    return query_positions // G + W - W // G, key_positions // G


def fractional_positions(
    query_positions: torch.Tensor, key_positions: torch.Tensor, group_size: int, window: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Self-Extend's far positions without the floor: (query / G + W − W / G, key / G), fp32.

    A far pair's relative position is then W + (i − j − W) / G: continuous with the neighbours' at
    i − j = W, and distinct for every key, so the order of the keys inside a group survives.
    """
    G, W = group_size, window
    return query_positions.float() / G + (W - W / G), key_positions.float() / G


@dataclass(frozen=True, init=False)
class SelfExtend(ScalingMethod):
    """Self-Extend with neighbour window ``window`` (W) and group size ``group_size`` (G).

    Reach: the largest relative grouped position stays below L while the length is at most
    ``G · (L − W + W // G)`` (≈ (L − W)·G + W). ``factor`` sets the target context s·L as for the
    other methods; ``group_size`` defaults to the smallest G that reaches it, ``window`` to
    min(1024, L // 4). With factor 1 (the default) the target is the reach of the given G.
    """

    name = "self_extend"
    training_free = "yes"
    runs_in = "ropescale"
    summary = "Self-Extend: normal positions within `window`, positions // group_size beyond (attention-level)"
    #: patching installs ``ropescale.attention.self_extend`` instead of changing frequencies
    attention = "self_extend"

    group_size: int | None = None
    window: int | None = None
    #: scale each query beyond the trained context L by log(p + 1) / log(L) (:func:`~ropescale.attention.function.logn_scale`)
    logn: bool = False
    #: far pairs at p / G instead of p // G (:func:`fractional_positions`): keys inside a group keep
    #: their order; ropescale's own (LongLM has none)
    fractional: bool = False
    #: the grouped query's shift, one of :data:`SHIFTS`: W − W // G (``floor``) or W − W / G (``float``)
    shift: str = "floor"

    def validate(self) -> None:
        object.__setattr__(self, "group_size", _check_int("group_size", self.group_size))
        object.__setattr__(self, "window", _check_int("window", self.window))
        shift = str(self.shift).strip().lower()
        if shift not in SHIFTS:
            raise ValueError(f"shift must be one of {', '.join(SHIFTS)}, got {self.shift!r}")
        if shift == "float" and self.fractional:
            raise ValueError("shift=float applies to integer grouping; fractional=true already shifts by W - W / G")
        object.__setattr__(self, "shift", shift)

    def resolved_window(self, spec: RotarySpec) -> int:
        L = spec.original_max_position_embeddings
        return self.window if self.window is not None else max(1, min(1024, L // 4))

    def reach(self, spec: RotarySpec, group_size: int | None = None) -> int:
        """The longest sequence whose grouped relative positions all stay below L."""
        G, W = group_size or self.resolved_group_size(spec), self.resolved_window(spec)
        L = spec.original_max_position_embeddings
        if self.fractional:  # (n − 1) / G + W − W / G ≤ L − 1
            return G * (L - 1 - W) + W + 1
        return G * (L - W + W // G)  # shift=float too: (n − 1) // G ≤ ⌊L − 1 − W + W / G⌋, the same bound

    def resolved_group_size(self, spec: RotarySpec) -> int:
        if self.group_size is not None:
            return self.group_size
        L, W = spec.original_max_position_embeddings, self.resolved_window(spec)
        target = self.factor * L
        G = max(1, math.ceil((target - W) / (L - W)))
        while self.reach(spec, G) < target:  # W // G makes the estimate a little short
            G += 1
        return G

    def resolved_params(self, spec: RotarySpec) -> MethodParams:
        return dict(self.params(), group_size=self.resolved_group_size(spec), window=self.resolved_window(spec))

    def validate_for(self, spec: RotarySpec) -> None:
        L, W = spec.original_max_position_embeddings, self.resolved_window(spec)
        if W >= L:
            raise ValueError(f"window must be smaller than the original context {L}, got {W}")
        if self.factor > 1 and self.reach(spec) < self.factor * L:
            raise ValueError(
                f"group_size={self.group_size} with window={W} reaches {self.reach(spec)} tokens, less than "
                f"factor {self.factor:g} x {L}; use group_size >= {_replace_group(self, spec)} or a smaller factor"
            )

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return spec.base_inv_freq(device=device), 1.0  # plain RoPE; grouping happens in attention

    def extended_context(self, spec: RotarySpec) -> int:
        return super().extended_context(spec) if self.factor > 1 else self.reach(spec)


def _replace_group(method: SelfExtend, spec: RotarySpec) -> int:
    return SelfExtend(factor=method.factor, window=method.window).resolved_group_size(spec)
