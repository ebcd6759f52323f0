"""STRING, shifted rotary positions (An et al., "Why Does the Effective Context Length of LLMs Fall
Short?", arXiv 2410.18745): training-free, attention-level.

The paper traces short effective contexts to the largest relative positions being the least trained
(few pretraining documents are long enough to produce them). STRING gives up the largest ones:
pairs closer than the shift S keep their true distance, and every pair at distance S or more is
moved back by S − W, onto distances the model has seen most::

    near  (i − j < S):  query i,          key j       relative i − j
    far   (i − j ≥ S):  query i − S + W,  key j       relative i − j − S + W

The local window W keeps the shifted pairs from landing on distance 0..W−1, which the model reads
as "right next to me". At length n the largest relative position is n − 1 − S + W instead of n − 1,
so within the trained context L the rarely-trained tail [L − S + W, L) is never used (the paper's
defaults, here too: S = L/3 (its 0.33 L), W = 128, or L/64 for small L).

Alone, STRING reaches L + S − W tokens before a distance leaves the trained range. Beyond that it
combines with a frequency method: ``frequencies=yarn`` (or ``linear``, ``ntk``) rotates with that
method's frequencies at the same ``factor``, and STRING shifts the positions it sees. The attention
function is :mod:`ropescale.attention.string` (Self-Extend's two-region kernel with these positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .base import RotarySpec, ScalingMethod
from .basic import NTK, Default, Linear
from .self_extend import _check_int
from .yarn import Yarn

#: the frequency methods STRING can rotate with (static; ``default`` is plain RoPE)
FREQUENCIES: dict[str, type[ScalingMethod]] = {"default": Default, "linear": Linear, "ntk": NTK, "yarn": Yarn}
_ALIASES = {"none": "default", "pi": "linear", "ntk_aware": "ntk"}  # the registry's spellings


@dataclass(frozen=True)
class String(ScalingMethod):
    """STRING with shift ``shift`` (S, default L/3) and local window ``local_window`` (W, default
    min(128, L/64)); ``frequencies`` picks the rotary frequencies (default plain RoPE)."""

    name = "string"
    summary = "STRING: distances >= shift moved back by shift - local_window (attention-level; + frequencies)"
    #: patching installs ``ropescale.attention.string`` (and the frequencies below)
    attention = "string"

    shift: int | None = None
    local_window: int | None = None
    frequencies: str = "default"
    #: scale each query beyond the trained context L by log(p + 1) / log(L) (:func:`~ropescale.attention.function.logn_scale`)
    logn: bool = False

    def validate(self) -> None:
        object.__setattr__(self, "shift", _check_int("shift", self.shift))
        object.__setattr__(self, "local_window", _check_int("local_window", self.local_window))
        key = str(self.frequencies).strip().lower()
        key = _ALIASES.get(key, key)
        if key not in FREQUENCIES:
            raise ValueError(f"frequencies must be one of {', '.join(FREQUENCIES)}, got {self.frequencies!r}")
        object.__setattr__(self, "frequencies", key)

    def resolved_shift(self, spec: RotarySpec) -> int:
        return self.shift if self.shift is not None else max(1, spec.original_max_position_embeddings // 3)

    def resolved_local_window(self, spec: RotarySpec) -> int:
        L = spec.original_max_position_embeddings
        return self.local_window if self.local_window is not None else max(1, min(128, L // 64))

    def reach(self, spec: RotarySpec) -> int:
        """The longest sequence whose shifted distances all stay below L (plain-RoPE frequencies)."""
        return spec.original_max_position_embeddings + self.resolved_shift(spec) - self.resolved_local_window(spec)

    def resolved_params(self, spec: RotarySpec) -> dict[str, Any]:
        return dict(self.params(), shift=self.resolved_shift(spec), local_window=self.resolved_local_window(spec))

    def validate_for(self, spec: RotarySpec) -> None:
        L, S, W = spec.original_max_position_embeddings, self.resolved_shift(spec), self.resolved_local_window(spec)
        if S >= L:
            raise ValueError(f"shift must be smaller than the original context {L}, got {S}")
        if W >= S:
            raise ValueError(f"local_window must be smaller than shift {S}, got {W}")
        if self.frequencies == "default" and self.factor * L > self.reach(spec):
            raise ValueError(
                f"STRING with plain RoPE reaches {self.reach(spec)} tokens (L + shift - local_window), less than "
                f"factor {self.factor:g} x {L}; add frequencies=yarn, or use a smaller factor"
            )

    def frequency_method(self) -> ScalingMethod:
        """The frequency method STRING rotates with, at the same factor."""
        cls = FREQUENCIES[self.frequencies]
        return cls() if cls is Default else cls(factor=self.factor)

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        return self.frequency_method().compute(spec, seq_len, device)
