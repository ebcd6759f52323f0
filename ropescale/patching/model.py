"""A plan applied: written into a config (:func:`apply_plan`, :func:`patch_config`), installed into a loaded
model (:func:`install_rotary`, :func:`patch`). Planning (:mod:`ropescale.patching.plan`) decides; this writes.

Where transformers can express a method in ``config.rope_parameters``, the config gets a complete dict
(always ``rope_theta``; for yarn/llama3/longrope always ``original_max_position_embeddings``) and
transformers builds the rotary embedding itself, so the saved checkpoint reloads anywhere. Where it cannot
(``dynamic_yarn``), the config records ``rope_type: "ropescale_<method>"`` and the model's one rotary module
is replaced by :class:`ScaledRotaryEmbedding`. Every patched config carries a provenance block
``config.ropescale`` (method, parameters, original geometry, ropescale version) so the model explains
itself and can be re-patched from its original geometry. No modeling file is forked and nothing global is
monkeypatched.
"""

from __future__ import annotations

import copy
import json
import sys
import warnings
from typing import Any

import torch

from .. import __version__
from ..attention.rotary_embedding import ScaledRotaryEmbedding
from ..errors import RopescaleError
from ..methods import ScalingMethod
from ..scaling import KEEP, Scaling, as_scaling
from .geometry import PROVENANCE_KEY, Provenance
from .plan import NON_NATIVE_PREFIX, PatchPlan, plan_scaling
from .supported import quiet_transformers
from .window import apply_sliding_window

#: apply_plan's default: the sliding window the plan's Scaling asked for
FROM_PLAN = "from the plan"


def apply_plan(config: Any, plan: PatchPlan, sliding_window: Any = FROM_PLAN, fine_tuned: bool = False) -> None:
    """Write ``plan`` into ``config`` in place (rope_parameters, max_position_embeddings, provenance).

    ``sliding_window``: the plan's own (its Scaling's) unless given.

    ``fine_tuned``: the weights were trained with this scaling (``ropescale export`` of a run), so a later
    extension composes on top of it by default (:func:`ropescale.patching.shipped.start_mode`)."""
    # the plan's facts only (its method was asked once, when it was made); copies, so that configs
    # written from one plan share no list or dict with it or with each other
    method, spec, rotary = plan.method, plan.spec, plan.rotary
    native = copy.deepcopy(rotary.rope_parameters)
    carried = {k: v for k, v in plan.original_rope_parameters.items() if k == "partial_rotary_factor"}
    if native is not None:
        config.rope_parameters = {**carried, **native}
    else:
        with quiet_transformers():
            config.rope_parameters = {
                **carried,
                "rope_type": NON_NATIVE_PREFIX + method.name,
                "rope_theta": spec.base,
                "original_max_position_embeddings": spec.original_max_position_embeddings,
                **{k: v for k, v in copy.deepcopy(rotary.params).items() if v is not None},
            }
    config.max_position_embeddings = rotary.max_position_embeddings
    extended = rotary.extended_context
    apply_sliding_window(config, extended, plan.sliding_window if sliding_window is FROM_PLAN else sliding_window)
    setattr(
        config,
        PROVENANCE_KEY,
        {
            "method": method.name,
            "params": copy.deepcopy(rotary.params),
            "native": native is not None,
            "original_max_position_embeddings": spec.original_max_position_embeddings,
            "original_rope_theta": spec.base,
            "original_rope_parameters": plan.original_rope_parameters,
            "original_max_position_embeddings_field": plan.original_max_position_embeddings_field,
            "extended_context": extended,
            "kv_consistent": plan.kv_consistent,
            **({"start": plan.start, "mode": plan.mode} if plan.mode else {}),
            **({"fine_tuned": True} if fine_tuned or plan.fine_tuned else {}),
            "version": __version__,
        },
    )


def patch_config(
    config: Any,
    method: str | ScalingMethod | Scaling = "yarn",
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    replace: bool = False,
    sliding_window: Any = KEEP,
    *,
    target_length: int | None = None,
    **params: Any,
) -> Any:
    """Return a patched copy of a transformers config.

    Args:
        config: a ``PreTrainedConfig`` of a supported architecture (Llama, Mistral, Qwen2, Qwen3).
        method: a :class:`~ropescale.scaling.Scaling` (then nothing else), or a registered method name
            (see ``ropescale methods``) or a ``ScalingMethod`` with the arguments below.
        factor: the scaling factor s (extended context = s × original).
        original_max_position_embeddings: the trained context L, if the config does not say it.
        replace: allow re-patching an already scaled config (starts from its original parameters).
        sliding_window: ``"keep"`` (default, warns if narrower than the new context), ``None``
            (full attention) or a width in tokens.
        target_length: instead of ``factor``, the context to reach in tokens: factor = N / L
            (rounded up to an integer for llama3); N must exceed the original context L.
        **params: the method's own parameters (``beta_fast=32``, ``long_factor=[...]``, ...).

    Returns:
        A new config; ``config`` itself is not modified.
    """
    scaling = as_scaling(
        method, factor, original_max_position_embeddings, replace, sliding_window, target_length=target_length, **params
    )
    return patched_copy(config, plan_scaling(config, scaling))


def patched_copy(config: Any, plan: PatchPlan, sliding_window: Any = FROM_PLAN, quietly: bool = False) -> Any:
    """A copy of ``config`` with ``plan`` written into it (:func:`apply_plan`); ``quietly``: without the
    sliding-window warning (a copy made only to be checked; the config the model keeps gives it once)."""
    patched = copy.deepcopy(config)
    if not quietly:
        apply_plan(patched, plan, sliding_window)
        return patched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_plan(patched, plan, sliding_window)
    return patched


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


__all__ = ["apply_plan", "attention_kernel", "describe", "install_rotary", "patch", "patch_config", "patched_copy"]
