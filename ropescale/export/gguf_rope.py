"""A ropescale scaling as llama.cpp's GGUF rope metadata, or a one-line refusal.

llama.cpp (``src/llama-model.cpp``, ``src/llama-context.cpp``, ggml's ``rope_yarn``) reads, for the
``llama`` architecture:

- ``rope.freq_base`` b, ``rope.dimension_count`` d;
- ``rope.scaling.type``: ``none``, ``linear``, ``yarn`` or ``longrope``; nothing dynamic;
- ``rope.scaling.factor`` s: every frequency is multiplied by 1/s (linear), or only the slow ones
  through YaRN's ramp (yarn, with ``rope.scaling.original_context_length`` L and the ramp ends
  fixed at β_fast = 32, β_slow = 1 for this architecture);
- ``rope.scaling.attn_factor``: multiplies cos and sin; for yarn llama.cpp itself multiplies them
  by 0.1·ln s + 1 already, so the key holds the method's factor divided by that;
- a ``rope_freqs`` tensor [d/2]: θ_i is divided by it (how llama.cpp's converter writes Llama 3.1's
  scaling; LongRoPE with short = long factors is written the same way), or for ``longrope`` the
  pair ``rope_factors_long`` / ``rope_factors_short``, chosen by whether the context size exceeds L.

Only the ``llama`` architecture loads these tensors; which architecture takes which form is
:func:`ropescale.interop.gguf_support.carry`, checked before this translation runs.

So every static method whose frequencies are θ_i/λ_i with one attention factor can be written;
methods whose frequencies depend on the current length (dynamic NTK, dynamic YaRN), which
re-rotate cached keys (``kv_consistent``) or which change attention itself (Self-Extend) cannot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import RopescaleError
from ..methods import RotarySpec, ScalingMethod
from ..methods.basic import NTK, Default, Linear
from ..methods.longrope import LongRope
from ..methods.yarn import Yarn, yarn_mscale

#: a GGUF metadata value as the writer takes it (:func:`ropescale.export.gguf._add_kv` picks the GGUF type)
GGUFValue = bool | int | float | str | list[int] | list[float] | list[str]
#: GGUF metadata: its keys are built from the architecture (``llama.rope.freq_base``), so a mapping, not named fields
GGUFMetadata = dict[str, GGUFValue]

#: YaRN's ramp ends that llama.cpp's llama architecture always uses (its hparams defaults; only
#: a few other architectures read ``rope.scaling.yarn_beta_fast/slow``).
LLAMA_CPP_YARN_BETAS = (32.0, 1.0)


class NotExpressibleError(RopescaleError):
    """The scaling has no llama.cpp equivalent; raised before anything is written."""


@dataclass(frozen=True)
class GGUFRope:
    """The rope part of a GGUF file: metadata values and the extra tensors.

    Attributes:
        freq_base: ``rope.freq_base``.
        dimension_count: ``rope.dimension_count`` (the rotary dim d).
        scaling_type: ``rope.scaling.type``.
        factor: ``rope.scaling.factor`` (None: not written, llama.cpp then scales by 1).
        original_context: ``rope.scaling.original_context_length`` (None: not written).
        attn_factor: ``rope.scaling.attn_factor`` (None: not written, llama.cpp uses 1).
        yarn_betas: ``rope.scaling.yarn_beta_fast/slow`` (None: not written).
        tensors: ``rope_freqs`` or ``rope_factors_long/short``, fp32 [d/2] each.
    """

    freq_base: float
    dimension_count: int
    scaling_type: str = "none"
    factor: float | None = None
    original_context: int | None = None
    attn_factor: float | None = None
    yarn_betas: tuple[float, float] | None = None
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def metadata(self, arch: str = "llama") -> GGUFMetadata:
        """The GGUF keys (``<arch>.rope.*``) and values; floats are written as float32."""
        out: GGUFMetadata = {
            f"{arch}.rope.freq_base": float(self.freq_base),
            f"{arch}.rope.dimension_count": int(self.dimension_count),
            f"{arch}.rope.scaling.type": self.scaling_type,
        }
        if self.factor is not None:
            out[f"{arch}.rope.scaling.factor"] = float(self.factor)
        if self.original_context is not None:
            out[f"{arch}.rope.scaling.original_context_length"] = int(self.original_context)
        if self.attn_factor is not None:
            out[f"{arch}.rope.scaling.attn_factor"] = float(self.attn_factor)
        if self.yarn_betas is not None:
            out[f"{arch}.rope.scaling.yarn_beta_fast"] = float(self.yarn_betas[0])
            out[f"{arch}.rope.scaling.yarn_beta_slow"] = float(self.yarn_betas[1])
        return out


def refuse(method: str, why: str) -> NotExpressibleError:
    return NotExpressibleError(f"method '{method}' cannot be exported to GGUF: {why}")


def check_expressible(method: ScalingMethod, kv_consistent: bool = False) -> None:
    """Raise :class:`NotExpressibleError` (one line: which method and why) if llama.cpp cannot run it."""
    if method.attention:
        raise refuse(
            method.name,
            "it groups positions inside attention, which llama.cpp's rope metadata cannot "
            "express (llama.cpp's own Self-Extend is the --grp-attn-n/--grp-attn-w flags)",
        )
    if method.dynamic:
        cache = " (and kv_consistent re-rotates the cached keys with them)" if kv_consistent else ""
        raise refuse(
            method.name,
            f"its frequencies are recomputed from the current length{cache}, while llama.cpp's "
            "rope scaling types (none, linear, yarn, longrope) are fixed when the model loads and its "
            f"cache holds rotated keys; export the static {'yarn' if isinstance(method, Yarn) else 'ntk'} "
            "at the target factor instead",
        )
    if kv_consistent:
        raise refuse(
            method.name,
            "kv_consistent re-rotates cached keys with the current frequencies; llama.cpp caches keys already rotated "
            "(patch with kv_consistent=false to export the plain method)",
        )
    if isinstance(method, Yarn):
        if not method.truncate:
            raise refuse(method.name, "truncate=false; llama.cpp always rounds YaRN's ramp ends to whole pairs")
        if (method.beta_fast, method.beta_slow) != LLAMA_CPP_YARN_BETAS:
            raise refuse(
                method.name,
                f"beta_fast={method.beta_fast:g}, beta_slow={method.beta_slow:g}; llama.cpp's "
                "llama architecture ignores rope.scaling.yarn_beta_* and always uses 32 and 1",
            )


def rope_for_gguf(method: ScalingMethod, spec: RotarySpec, kv_consistent: bool = False) -> GGUFRope:
    """Translate a method on a model's original geometry into llama.cpp's rope metadata.

    Args:
        method: the scaling (``plan.method`` of a patch plan).
        spec: the model's ORIGINAL rotary geometry (base and context before scaling).
        kv_consistent: the patch's kv_consistent option (refused: llama.cpp cannot do it).

    Returns:
        A :class:`GGUFRope`; raises :class:`NotExpressibleError` for dynamic and attention-level
        methods and for YaRN settings llama.cpp ignores.
    """
    check_expressible(method, kv_consistent)
    d, L = spec.dim, spec.original_max_position_embeddings
    common = {"freq_base": spec.base, "dimension_count": d}
    if isinstance(method, Default) or (type(method) is Linear and method.factor == 1):
        return GGUFRope(**common)
    if type(method) is Linear:
        return GGUFRope(**common, scaling_type="linear", factor=method.factor)
    if type(method) is NTK:
        # a pure base change: plain RoPE with b·s^(d/(d-2)), as transformers expresses it
        return GGUFRope(**{**common, "freq_base": method.scaled_base(spec)})
    if isinstance(method, Yarn):
        s = method.factor
        # llama.cpp multiplies cos/sin by 0.1 ln s + 1 itself; the key carries what is left
        return GGUFRope(
            **common,
            scaling_type="yarn",
            factor=s,
            original_context=L,
            attn_factor=method.attention_scale(s) / yarn_mscale(s),
            yarn_betas=LLAMA_CPP_YARN_BETAS,
        )
    if isinstance(method, LongRope) and method.varies_with_length():
        method.validate_for(spec)
        short = method.short_factor or (1.0,) * (d // 2)
        return GGUFRope(
            **common,
            scaling_type="longrope",
            original_context=L,
            attn_factor=method.attention_scale(spec),
            tensors={
                "rope_factors_long": np.asarray(method.long_factor, dtype=np.float32),
                "rope_factors_short": np.asarray(short, dtype=np.float32),
            },
        )
    return _per_pair(method, spec)


def _per_pair(method: ScalingMethod, spec: RotarySpec) -> GGUFRope:
    """Any other static method (llama3, LongRoPE with short = long factors, the composed scalings saved
    that way): θ'_i = θ_i / λ_i as a ``rope_freqs`` tensor, the attention factor as
    ``rope.scaling.attn_factor`` (scaling type none: llama.cpp multiplies cos/sin by it alone)."""
    inv_freq, attention = method.compute(spec, seq_len=method.extended_context(spec))
    ratio = (spec.base_inv_freq().double() / inv_freq.double()).numpy().astype(np.float32)  # λ_i [d/2]
    if not np.all(np.isfinite(ratio)) or np.any(ratio <= 0):
        raise refuse(method.name, "its frequencies are not a positive rescale of the base frequencies")
    attn = None if math.isclose(attention, 1.0, rel_tol=0, abs_tol=1e-12) else float(attention)
    return GGUFRope(freq_base=spec.base, dimension_count=spec.dim, attn_factor=attn, tensors={"rope_freqs": ratio})
