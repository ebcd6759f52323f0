"""A scaling built on top of the one a checkpoint ships with (Llama 3.1's llama3 ×8, a ropescale fine-tune).

No paper defines a composition, so this module writes the rule down (docs/methods.md, "Composing on
a shipped scaling") and the tests check it against a reference written from that text:

1. The shipped scaling (``base``) turns the pretraining frequencies θ_i into the frequencies the
   weights were trained with, θ'_i, and an attention factor a₁ (``base.compute(spec)``).
2. The second method (``on_top``, factor s) treats each pair as the plain-RoPE pair *of the same
   wavelength* in a model trained at the **shipped context** L_s (131,072 for Llama 3.1), not at the
   pretraining context L. A pair's place on the method's ramp is its effective index
   i* = −d·ln θ'_i / (2·ln b), the index a plain-RoPE pair of that frequency would have; YaRN's
   correction range, NTK's per-pair exponent 2i*/(d−2) and llama3's wavelength bands are all measured
   from it (or from the wavelength directly) against L_s. With an identity ``base`` (θ' = θ, L_s = L)
   i* = i and the composition is exactly the second method: the tests check that for every method.
3. The frequencies are θ''_i = θ'_i · r_i(i*), r_i the second method's per-pair ratio; the attention
   factor is a₁ · a₂(s): each factor multiplies cos and sin, so logits scale by both squares, as they
   would running one scaling after the other.

The result has per-pair frequencies no single standard rope type expresses, so it is saved as LongRoPE
with equal short and long factors λ_i = θ_i / θ''_i (transformers and vLLM build exactly those
frequencies; nothing switches with the length) and its attention factor written for every reader
(``attention_factor`` for transformers, ``short_mscale``/``long_mscale`` for vLLM and SGLang); a
second method whose frequencies follow the length (dynamic NTK/YaRN) is run by ropescale's rotary
module instead. The extended context is s × L_s.

An attention-level second method (Self-Extend, DCA, STRING, llama.cpp's grouped attention:
:data:`ATTENTION_ON_TOP`) remaps positions instead of frequencies. Composed, it rotates q and k at its
remapped positions with the shipped frequencies θ'_i and attention factor a₁ (the model's trained
rotary, as LongLM's Self-Extend does by calling the model's own rotary module), times its own factor a₂
on plain RoPE (1, or STRING's 0.1·ln 2 + 1); STRING's ``frequencies=yarn|linear|ntk`` goes on top of θ'
by the frequency rule above. Its window, group, chunk and shift sizes and its log-length/temperature
context are measured in L_s (:meth:`Composed.attention_view`), so its defaults on Llama 3.1 are those of
a model trained at 131,072 (STRING's shift int(0.33 · 131072) = 43253, the authors' README value). It runs
in ropescale's attention functions only (nothing to save in config.json for an engine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import RotarySpec, ScalingMethod, check_number
from .types import MethodRef, RopeParameters

#: frequency methods a composition takes (their frequencies go on top of the shipped ones)
ON_TOP = ("linear", "ntk", "yarn", "llama3", "dynamic_ntk", "dynamic_yarn")
#: attention-level methods a composition takes (their positions, rotated with the shipped frequencies)
ATTENTION_ON_TOP = ("self_extend", "dca", "string", "self_extend_llamacpp")
#: every second method a composition takes
COMPOSABLE = ON_TOP + ATTENTION_ON_TOP


def effective_index(theta: torch.Tensor, spec: RotarySpec) -> torch.Tensor:
    """i* = −d·ln θ / (2·ln b): the pair index a plain-RoPE pair of frequency θ has (fractional). # [d/2]"""
    return -spec.dim * torch.log(theta) / (2 * math.log(spec.base))


def on_top_ratio(
    method: ScalingMethod, theta: torch.Tensor, spec: RotarySpec, context: int, seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """(r [d/2], a₂): what ``method`` does to each pair of frequencies ``theta`` in a model trained at
    ``context`` tokens (the rule of the module docstring), and its attention factor."""
    from .yarn import correction_range

    name, s, d = method.name, float(method.factor), spec.dim
    index = effective_index(theta, spec)  # [d/2]
    if name == "linear":
        return torch.full_like(theta, 1.0 / s), 1.0
    if name in ("ntk", "dynamic_ntk"):
        if name == "dynamic_ntk":  # transformers' α(ℓ) = f·ℓ/L − (f−1) from the shipped context
            length = max(seq_len or context, context)
            f = method.native_factor
            s = (f * length / context) - (f - 1)
        return s ** (-2 * index / (d - 2)), 1.0
    if name == "llama3":
        wavelen = 2 * math.pi / theta
        smooth = (
            (context / wavelen - method.low_freq_factor) / (method.high_freq_factor - method.low_freq_factor)
        ).clamp(0, 1)
        return (1 - smooth) / s + smooth, 1.0
    if name in ("yarn", "dynamic_yarn"):
        if name == "dynamic_yarn":
            s = max(1.0, (seq_len or context) / context)
        shipped = RotarySpec(spec.head_dim, spec.base, int(context), spec.partial_rotary_factor)
        low, high = correction_range(shipped, method.beta_fast, method.beta_slow, method.truncate)
        if low == high:
            high += 0.001  # as yarn_inv_freq: no zero-width ramp
        ramp = torch.clamp((index - low) / (high - low), 0, 1)  # 0 = keep, 1 = interpolate
        return ramp / s + (1 - ramp), method.attention_scale(s)
    raise ValueError(f"'{name}' cannot be composed on a shipped scaling; composable: {', '.join(ON_TOP)}")


class _FollowsOnTop:
    """``Composed.dynamic`` and ``Composed.attention``: the base class's value on the class (a registry scan
    sees a static frequency method, as the composition of static ones is), the second method's on an
    instance (dynamic NTK/YaRN on top follow the length; Self-Extend on top installs its attention)."""

    def __init__(self, attribute: str, default: Any):
        self.attribute, self.default = attribute, default

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return self.default if obj is None else getattr(obj.outer, self.attribute)


@dataclass(frozen=True, init=False)
class Composed(ScalingMethod):
    """``on_top`` (factor s) applied over the frequencies of ``base`` (the shipped scaling), measured
    from the shipped context: the extended context is s × ``shipped_context``.

    Args:
        factor: s, the second method's factor (from the shipped context).
        base: the shipped scaling, ``{"method": "llama3", "params": {"factor": 8, ...}}``.
        on_top: the second method, ``{"method": "yarn", "params": {...}}`` (its factor is ``factor``).
        shipped_context: L_s, the context the checkpoint serves as shipped.
    """

    name = "composed"
    summary = "a frequency method on top of the scaling a checkpoint ships with, from its shipped context (--compose)"
    training_free = "yes, or fine-tune"
    runs_in = "transformers, vLLM ≥ 0.19.1, llama.cpp (not Qwen); older vLLM/SGLang approximate"

    #: both required: their empty defaults are refused by :meth:`validate`, naming the shape
    base: MethodRef = field(default_factory=dict)  # type: ignore[assignment]
    on_top: MethodRef = field(default_factory=dict)  # type: ignore[assignment]
    shipped_context: int = 0

    def validate(self) -> None:
        for key in ("base", "on_top"):
            value = getattr(self, key)
            if not isinstance(value, dict) or not isinstance(value.get("method"), str):
                raise ValueError(f"{key} must be {{'method': NAME, 'params': {{...}}}}, got {value!r}")
        from .registry import method_class

        name = method_class(self.on_top["method"]).name
        if name not in COMPOSABLE:
            raise ValueError(f"'{name}' cannot be composed on a shipped scaling; composable: {', '.join(COMPOSABLE)}")
        if isinstance(self.shipped_context, bool) or not isinstance(self.shipped_context, int):
            raise ValueError(f"shipped_context must be a positive integer, got {self.shipped_context!r}")
        check_number("shipped_context", self.shipped_context, minimum=1)
        self.inner  # noqa: B018 - builds (validates) the shipped scaling

    @property
    def inner(self) -> ScalingMethod:
        """The shipped scaling as a method."""
        from .registry import get_method

        return get_method(self.base["method"], **dict(self.base.get("params") or {}))

    @property
    def outer(self) -> ScalingMethod:
        """The second method, at ``factor``."""
        from .registry import get_method

        params = {k: v for k, v in dict(self.on_top.get("params") or {}).items() if k != "factor"}
        return get_method(self.on_top["method"], factor=self.factor, **params)

    dynamic = _FollowsOnTop("dynamic", False)  # type: ignore[assignment]
    attention = _FollowsOnTop("attention", None)  # type: ignore[assignment]

    def shipped_spec(self, spec: RotarySpec) -> RotarySpec:
        """``spec`` measured from the shipped context L_s: the geometry a model trained at L_s would have."""
        return RotarySpec(spec.head_dim, spec.base, int(self.shipped_context), spec.partial_rotary_factor)

    def attention_view(self, spec: RotarySpec) -> tuple[ScalingMethod, RotarySpec]:
        """(the attention-level method, the geometry its sizes are measured in: L_s) that the attention
        functions read (window, group, chunk, shift, logn and temperature contexts)."""
        return self.outer, self.shipped_spec(spec)

    def validate_for(self, spec: RotarySpec) -> None:
        self.inner.validate_for(spec)
        if self.shipped_context < spec.original_max_position_embeddings:
            raise ValueError(
                f"shipped_context {self.shipped_context} is below the pretraining context "
                f"{spec.original_max_position_embeddings}"
            )
        if self.attention:  # its sizes against L_s, naming themselves
            try:
                self.outer.validate_for(self.shipped_spec(spec))
            except ValueError as error:
                raise ValueError(
                    f"{self.outer.name} on the shipped {self.inner.name} x{self.inner.factor:g}, measured in the shipped "
                    f"context {self.shipped_context} (its 'original context' below): {error}"
                ) from None

    def varies_with_length(self) -> bool:
        return self.outer.varies_with_length() or self.inner.varies_with_length()

    def compute(self, spec: RotarySpec, seq_len: int | None = None, device: torch.device | None = None):
        theta, a1 = self.inner.compute(spec, None, device)  # [d/2]: what the weights were trained with
        if self.attention:
            return _attention_on_top(self.outer, theta, a1, self.shipped_spec(spec), seq_len)
        ratio, a2 = on_top_ratio(self.outer, theta, spec, self.shipped_context, seq_len)
        return theta * ratio, a1 * a2

    def extended_context(self, spec: RotarySpec) -> int:
        if self.attention:  # Self-Extend at factor 1 reaches what its group gives, from L_s
            return self.outer.extended_context(self.shipped_spec(spec))
        return int(round(self.factor * self.shipped_context))

    def on_top_summary(self, spec: RotarySpec) -> str:
        """The second method's parameters as ``patch`` prints them (``group_size=3, window=1024, ...``): an
        attention-level method's resolved sizes (from L_s), a frequency method's as given."""
        if self.attention:
            params = self.outer.resolved_params(self.shipped_spec(spec))
        else:
            params = dict(self.on_top.get("params") or {})
        return ", ".join(f"{k}={v}" for k, v in params.items() if k != "factor" and v is not None)

    def max_position_embeddings(self, spec: RotarySpec) -> int:
        """s × L_s, or L_s for a dynamic second method (transformers' convention for dynamic rope)."""
        return self.shipped_context if self.dynamic else self.extended_context(spec)

    def per_pair_factors(self, spec: RotarySpec) -> list[float]:
        """λ_i = θ_i / θ''_i: LongRoPE's rescale factors that give exactly the composed frequencies."""
        inv_freq, _ = self.compute(spec)
        return (spec.base_inv_freq() / inv_freq).tolist()

    def rope_parameters(self, spec: RotarySpec) -> RopeParameters | None:
        """LongRoPE with equal short and long factors (nothing switches), the attention factor under
        every name a loader reads it by; None for a dynamic second method (ropescale's rotary runs it)."""
        if self.varies_with_length() or self.attention:
            return None  # an attention-level remapping lives in ropescale's attention functions
        factors = self.per_pair_factors(spec)
        _, attention = self.compute(spec)
        return {
            "rope_type": "longrope",
            "rope_theta": spec.base,
            "factor": self.extended_context(spec) / spec.original_max_position_embeddings,
            "original_max_position_embeddings": spec.original_max_position_embeddings,
            "long_factor": factors,
            "short_factor": list(factors),
            "attention_factor": attention,
            # vLLM's and SGLang's LongRoPE read these, not attention_factor (their get_rope)
            "short_mscale": attention,
            "long_mscale": attention,
        }

    def label(self) -> str:
        """``yarn x4 on llama3 x8``."""
        inner = self.inner
        return f"{self.on_top['method']} x{self.factor:g} on {inner.name} x{inner.factor:g}"


def _attention_on_top(
    method: ScalingMethod, theta: torch.Tensor, a1: float, shipped: RotarySpec, seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """An attention-level method's frequencies and factor on the shipped θ' (a₁): θ' itself, or STRING's
    ``frequencies`` method on top of θ' by :func:`on_top_ratio`; a₁ times the method's own factor (what
    it multiplies plain RoPE's cos/sin by at the shipped context)."""
    frequency = getattr(method, "frequency_method", None)
    inner = frequency() if frequency is not None else None
    ratio = torch.ones_like(theta)
    if inner is not None and inner.name != "default":
        ratio, _ = on_top_ratio(inner, theta, shipped, shipped.original_max_position_embeddings, seq_len)
    _, a2 = method.compute(shipped, seq_len, theta.device)
    return theta * ratio, a1 * a2


__all__ = ["ATTENTION_ON_TOP", "COMPOSABLE", "ON_TOP", "Composed", "effective_index", "on_top_ratio"]
