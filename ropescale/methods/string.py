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
so within the trained context L the rarely-trained tail [L − S + W, L) is never used (the
reference's defaults, here too: S = int(0.33·L) and W = 128, from HKUNLP/STRING's README; W falls
back to L/64 where 128 would not stay below S, a tiny model's L: ours).

The reference multiplies the query and key cos/sin by 0.1·ln 2 + 1 at every length
(``string_for_llama.py``; ``string_for_qwen2.py`` too, in place of YaRN's own factor when it rotates
with YaRN's frequencies): logits × (0.1·ln 2 + 1)² ≈ 1.143. That is ``temperature=string``, the
default. ``temperature=frequencies`` keeps the frequency method's own factor instead (1 for plain
RoPE, YaRN's 0.1·ln s + 1): ours.

Alone, STRING reaches L + S − W tokens before a distance leaves the trained range. Beyond that it
combines with a frequency method: ``frequencies=yarn`` (or ``linear``, ``ntk``) rotates with that
method's frequencies at the same ``factor``, and STRING shifts the positions it sees. The attention
function is :mod:`ropescale.attention.string` (Self-Extend's two-region kernel with these positions).

On a checkpoint its maker already extended (Llama 3.1: ``llama3`` RoPE, ``max_position_embeddings``
131072 against 8192 trained) the authors' README takes ``S = int(0.33 · max_position_embeddings)``
(43253) and ``string_for_llama.py`` keeps the ``llama3`` frequencies it finds in ``rope_scaling``;
composed there (:mod:`ropescale.methods.composed`), ropescale does the same: the shipped frequencies,
S and W measured in the shipped context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..rope_math import yarn_mscale
from .base import RotarySpec, ScalingMethod
from .basic import NTK, Default, Linear
from .self_extend import _check_int
from .types import MethodParams
from .yarn import Yarn

#: the frequency methods STRING can rotate with (static; ``default`` is plain RoPE)
FREQUENCIES: dict[str, type[ScalingMethod]] = {"default": Default, "linear": Linear, "ntk": NTK, "yarn": Yarn}
_ALIASES = {"none": "default", "pi": "linear", "ntk_aware": "ntk"}  # the registry's spellings
#: the reference's cos/sin factor (``attention_factor`` in HKUNLP/STRING's string_for_llama.py / string_for_qwen2.py)
STRING_FACTOR = yarn_mscale(2)
#: ``temperature``: the reference's factor, or the frequency method's own (ours)
TEMPERATURES = ("string", "frequencies")


@dataclass(frozen=True, init=False)
class String(ScalingMethod):
    """STRING with shift ``shift`` (S, default int(0.33·L)) and local window ``local_window`` (W,
    default 128, or L/64 when 128 ≥ S); ``frequencies`` picks the rotary frequencies (default plain
    RoPE); ``temperature`` the cos/sin factor (default the reference's 0.1·ln 2 + 1)."""

    name = "string"
    training_free = "yes"
    runs_in = "ropescale"
    summary = "STRING: distances >= shift moved back by shift - local_window (attention-level; + frequencies)"
    #: patching installs ``ropescale.attention.string`` (and the frequencies below)
    attention = "string"

    shift: int | None = None
    local_window: int | None = None
    frequencies: str = "default"
    #: scale each query beyond the trained context L by log(p + 1) / log(L) (:func:`~ropescale.attention.function.logn_scale`);
    #: ropescale's own addition (the STRING reference has none)
    logn: bool = False
    #: one of :data:`TEMPERATURES`
    temperature: str = "string"

    def validate(self) -> None:
        object.__setattr__(self, "shift", _check_int("shift", self.shift))
        object.__setattr__(self, "local_window", _check_int("local_window", self.local_window))
        key = str(self.frequencies).strip().lower()
        key = _ALIASES.get(key, key)
        if key not in FREQUENCIES:
            raise ValueError(f"frequencies must be one of {', '.join(FREQUENCIES)}, got {self.frequencies!r}")
        object.__setattr__(self, "frequencies", key)
        temperature = str(self.temperature).strip().lower()
        if temperature not in TEMPERATURES:
            raise ValueError(f"temperature must be one of {', '.join(TEMPERATURES)}, got {self.temperature!r}")
        object.__setattr__(self, "temperature", temperature)

    def resolved_shift(self, spec: RotarySpec) -> int:
        return self.shift if self.shift is not None else max(1, int(0.33 * spec.original_max_position_embeddings))

    def resolved_local_window(self, spec: RotarySpec) -> int:
        if self.local_window is not None:
            return self.local_window
        return 128 if 128 < self.resolved_shift(spec) else max(1, spec.original_max_position_embeddings // 64)

    def reach(self, spec: RotarySpec) -> int:
        """The longest sequence whose shifted distances all stay below L (plain-RoPE frequencies)."""
        return spec.original_max_position_embeddings + self.resolved_shift(spec) - self.resolved_local_window(spec)

    def resolved_params(self, spec: RotarySpec) -> MethodParams:
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
        inv_freq, own = self.frequency_method().compute(spec, seq_len, device)
        return inv_freq, STRING_FACTOR if self.temperature == "string" else own
