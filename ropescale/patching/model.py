"""Patching a loaded model in place.

Native methods: the config is patched and the model's one rotary module is rebuilt by
transformers' own class from that config. Non-native methods: the rotary module is replaced
by :class:`ScaledRotaryEmbedding`. No modeling file is forked and nothing global is monkeypatched.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

from ..attention.rotary_embedding import ScaledRotaryEmbedding
from ..errors import RopescaleError
from ..methods import ScalingMethod
from ..scaling import KEEP, Scaling, as_scaling
from .geometry import Provenance
from .plan import PatchPlan, apply_plan, plan_scaling


def rotary_owner(model: Any) -> Any:
    """The decoder module that owns ``rotary_emb`` (``model.model`` for *ForCausalLM)."""
    for candidate in (getattr(model, "model", None), getattr(model, "base_model", None), model):
        if candidate is not None and hasattr(candidate, "rotary_emb"):
            return candidate
    raise RopescaleError(f"cannot find the rotary embedding module of {type(model).__name__}")


def _native_rotary_class(owner: Any) -> type:
    """transformers' rotary class of the owner's architecture (e.g. ``LlamaRotaryEmbedding``)."""
    module = sys.modules[type(owner).__module__]
    for name, value in vars(module).items():
        if name.endswith("RotaryEmbedding") and isinstance(value, type) and issubclass(value, torch.nn.Module):
            return value
    raise RopescaleError(f"no rotary embedding class in {module.__name__}")


def install_rotary(model: Any, plan: PatchPlan) -> None:
    """Replace the model's rotary module with one built for ``plan`` (config already patched)."""
    from .. import attention

    owner = rotary_owner(model)
    old = owner.rotary_emb
    device = old.inv_freq.device if hasattr(old, "inv_freq") else None
    attention.uninstall(model, owner)  # a previous attention-level mode gives the model its attention back
    if plan.attention_mode is not None:
        # keys are cached unrotated and rotated inside a registered attention function
        new = attention.install(model, owner, plan, plan.attention_mode, device=device)
    elif plan.native:
        # transformers builds the module from the patched config; inv_freq stays fp32 even if
        # the model was cast, as with from_pretrained(dtype=...).
        new = _native_rotary_class(owner)(model.config).to(device)
    else:
        new = ScaledRotaryEmbedding(plan.method, plan.spec, device=device)
    owner.rotary_emb = new


def patch(
    model: Any,
    method: str | ScalingMethod | Scaling = "yarn",
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    replace: bool = False,
    sliding_window: Any = KEEP,
    *,
    target_length: int | None = None,
    **params: Any,
) -> Any:
    """Patch a loaded transformers model in place and return it.

    Args are those of :func:`ropescale.patch_config`: a :class:`~ropescale.scaling.Scaling`, or the
    keyword form it is built from (``target_length=N`` instead of ``factor`` included). The model's
    config is updated in place (its submodules share it) and its rotary module rebuilt; weights are
    untouched.
    """
    scaling = as_scaling(
        method, factor, original_max_position_embeddings, replace, sliding_window, target_length=target_length, **params
    )
    plan = plan_scaling(model.config, scaling)
    apply_plan(model.config, plan)
    install_rotary(model, plan)
    return model


def attention_kernel(model: Any) -> str:
    """The attention kernel a (patched) model runs now: an attention-level mode's inner SDPA/eager
    kernel while it is installed, otherwise the model's own implementation."""
    from ..attention.rotate_on_read import AttentionRotary

    rotary = getattr(rotary_owner(model), "rotary_emb", None)
    name = model.config._attn_implementation or "sdpa"
    if isinstance(rotary, AttentionRotary) and name == rotary.attention_name:
        return rotary.inner
    return name


def describe(model_or_config: Any) -> Provenance:
    """The provenance block of a patched model or config (empty dict if unpatched)."""
    config = getattr(model_or_config, "config", model_or_config)
    return json.loads(json.dumps(getattr(config, "ropescale", None) or {}))


__all__ = ["attention_kernel", "patch", "describe", "install_rotary"]
