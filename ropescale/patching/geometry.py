"""Reading a config's rotary facts before anything is planned: the provenance block ropescale writes,
whether the config already carries a scaling, its original geometry, and the scaling it carries.

These are the facts :mod:`.plan` (what patching will do), :mod:`.shipped` (the model as shipped) and
:mod:`.readback` (what a loaded model runs) all start from; they live here, below all three, so that
none of them imports another in a circle.
"""

from __future__ import annotations

import copy
import json
from typing import Any, TypedDict

from ..methods.types import MethodParams, RopeParameters

PROVENANCE_KEY = "ropescale"
#: transformers' ``rope_type`` -> ropescale's method name (a natively scaled config without provenance)
NATIVE_NAMES = {"default": "default", "linear": "linear", "dynamic": "dynamic_ntk"}
#: rope_parameters keys that are geometry, not the scaling's parameters
GEOMETRY_KEYS = ("rope_type", "rope_theta", "partial_rotary_factor")


class Provenance(TypedDict, total=False):
    """The ``ropescale`` block a patched config carries (:func:`~ropescale.patching.model.apply_plan` writes
    it), so the model explains itself and can be re-patched from its original geometry."""

    method: str
    params: MethodParams
    native: bool
    original_max_position_embeddings: int
    original_rope_theta: float
    original_rope_parameters: RopeParameters
    original_max_position_embeddings_field: int
    extended_context: int
    kv_consistent: bool
    start: str
    mode: str
    fine_tuned: bool
    version: str


class CarriedScaling(TypedDict):
    """The scaling a config carries, as reports name it: ``{"method", "factor", "params"}``."""

    method: str
    factor: float | None
    params: MethodParams


def provenance(config: Any) -> Provenance | None:
    """The ``ropescale`` provenance block of a patched config, or None."""
    block = getattr(config, PROVENANCE_KEY, None)
    return block if isinstance(block, dict) else None


def is_scaled(config: Any) -> bool:
    """True if the config already carries a RoPE scaling (ropescale's or a native one)."""
    if provenance(config) is not None:
        return provenance(config)["method"] != "default"
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_type", "default") != "default"


def original_geometry(config: Any, original_max_position_embeddings: int | None = None) -> tuple[dict, int, int]:
    """(original rope_parameters, original max_position_embeddings field, original context L).

    From the provenance block when there is one; otherwise read off the config (a natively scaled
    checkpoint keeps L in ``rope_parameters["original_max_position_embeddings"]``, a linear one
    raised ``max_position_embeddings`` by its factor, a dynamic one kept it).
    """
    block = provenance(config)
    if block is not None:
        rope = copy.deepcopy(block["original_rope_parameters"])
        field = int(block["original_max_position_embeddings_field"])
        L = int(block["original_max_position_embeddings"])
    else:
        current = dict(getattr(config, "rope_parameters", None) or {})
        field = int(config.max_position_embeddings)
        rope_type = current.get("rope_type", "default")
        if "original_max_position_embeddings" in current:
            L = int(current["original_max_position_embeddings"])
        elif rope_type == "linear":
            L = int(round(field / float(current.get("factor", 1.0))))
        else:
            L = field
        if rope_type != "default":
            field = L
        rope = {k: v for k, v in current.items() if k in ("rope_theta", "partial_rotary_factor")}
        rope["rope_type"] = "default"
        rope.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    if original_max_position_embeddings is not None:
        if not isinstance(original_max_position_embeddings, int) or original_max_position_embeddings <= 0:
            raise ValueError(
                f"original_max_position_embeddings must be a positive integer, got {original_max_position_embeddings!r}"
            )
        L = original_max_position_embeddings
    return rope, field, L


def carried(config: Any) -> CarriedScaling:
    """The scaling ``config`` carries: ``{"method", "factor", "params"}``, from ropescale's provenance block
    where there is one, else from ``rope_parameters`` (Qwen's YaRN x4, Llama 3.1's llama3); ``method`` is
    ``"default"`` for plain RoPE."""
    block = provenance(config)
    if block is not None:
        method, params = str(block["method"]), dict(block.get("params") or {})
    else:
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = str(rope.get("rope_type", "default"))
        method = NATIVE_NAMES.get(rope_type, rope_type)
        params = {k: v for k, v in rope.items() if k not in GEOMETRY_KEYS}
    return json.loads(json.dumps({"method": method, "factor": params.get("factor"), "params": params}, default=float))


def is_unscaled(scaling: CarriedScaling) -> bool:
    """Whether a :func:`scaling_of` record is plain RoPE (``default``, or a factor-1 no-op)."""
    return scaling.get("method") in ("default", "none")


def scaling_label(scaling: CarriedScaling) -> str:
    """``yarn x4``, ``llama3 x8``, ``none``: how a report names a :func:`scaling_of` record."""
    if is_unscaled(scaling):
        return "none"
    factor = scaling.get("factor")
    params = scaling.get("params") or {}
    if scaling.get("method") == "composed" and isinstance(params.get("base"), dict):  # yarn x4 on llama3 x8
        base = params["base"]
        inner = f"{base.get('method')} x{float((base.get('params') or {}).get('factor') or 1):g}"
        return f"{(params.get('on_top') or {}).get('method')} x{float(factor or 1):g} on {inner}"
    return f"{scaling['method']} x{float(factor):g}" if isinstance(factor, (int, float)) else str(scaling["method"])


__all__ = [
    "GEOMETRY_KEYS",
    "NATIVE_NAMES",
    "PROVENANCE_KEY",
    "carried",
    "is_scaled",
    "is_unscaled",
    "original_geometry",
    "provenance",
    "scaling_label",
]
