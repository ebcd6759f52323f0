"""The scaling a model runs, read back from the model itself (its config and rotary module).

A report must say what ran, not what was asked: a checkpoint saved with YaRN ×4 and evaluated with
no method runs YaRN ×4, and one evaluated with ``none`` runs the original RoPE. Every evaluation
cell records :func:`scaling_of` of the loaded model after it was (re-)patched, and labels rows with
:func:`scaling_label`. :func:`snapshot_scaling` / :func:`restore_scaling` give a model back the
scaling it was loaded with after other methods were tried on it (a suite re-patches one model).
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import torch

from ..methods.types import MethodParams, RopeParameters
from .geometry import Provenance, carried, is_unscaled, provenance, scaling_label
from .plan import plan_from_provenance, quiet_transformers


class ScalingRecord(TypedDict, total=False):
    """:func:`scaling_of`: the carried scaling and, for a model, its rotary module's attention factor."""

    method: str
    factor: float | None
    params: MethodParams
    attention_factor: float | None


class Snapshot(TypedDict):
    """:func:`snapshot_scaling`: the config fields and the rotary module that make a model's scaling."""

    rope_parameters: RopeParameters | None
    max_position_embeddings: int
    provenance: Provenance | None
    has_sliding_window: bool
    sliding_window: int | None
    rotary: torch.nn.Module


def scaling_of(model_or_config: Any) -> ScalingRecord:
    """What scaling ``model_or_config`` runs: ``{"method", "factor", "params"}`` and, for a model,
    ``attention_factor`` (the rotary module's cos/sin multiplier, e.g. YaRN's 0.1 ln s + 1).

    The method and parameters come from ropescale's provenance block where the config has one,
    otherwise from ``rope_parameters`` (a checkpoint scaled by its authors: Qwen's YaRN ×4, Llama
    3.1's llama3); ``method`` is ``"default"`` for plain RoPE.
    """
    config = getattr(model_or_config, "config", model_or_config)
    out = ScalingRecord(**carried(config))
    if model_or_config is not config:
        from .model import rotary_owner

        scale = getattr(getattr(rotary_owner(model_or_config), "rotary_emb", None), "attention_scaling", None)
        out["attention_factor"] = None if scale is None else float(scale)
    return json.loads(json.dumps(out, default=float))


def snapshot_scaling(model: Any) -> Snapshot:
    """What :func:`restore_scaling` needs to give ``model`` back its present scaling."""
    from .model import rotary_owner

    config = model.config
    return {
        "rope_parameters": copy.deepcopy(getattr(config, "rope_parameters", None)),
        "max_position_embeddings": config.max_position_embeddings,
        "provenance": copy.deepcopy(provenance(config)),
        "has_sliding_window": hasattr(config, "sliding_window"),
        "sliding_window": getattr(config, "sliding_window", None),
        "rotary": rotary_owner(model).rotary_emb,
    }


def restore_scaling(model: Any, snapshot: Snapshot) -> None:
    """Give ``model`` the scaling of ``snapshot`` back (after :func:`ropescale.patching.model.patch`
    put others on it): the config fields, and the rotary module the loader built (or, for a scaling
    that needs ropescale's own module or attention mode, one rebuilt from the provenance block)."""
    from .. import attention
    from .model import install_rotary, rotary_owner

    config, owner = model.config, rotary_owner(model)
    with quiet_transformers():
        config.rope_parameters = copy.deepcopy(snapshot["rope_parameters"])
    config.max_position_embeddings = snapshot["max_position_embeddings"]
    if snapshot["has_sliding_window"]:
        config.sliding_window = snapshot["sliding_window"]
    if snapshot["provenance"] is None:
        if hasattr(config, "ropescale"):
            delattr(config, "ropescale")
    else:
        config.ropescale = copy.deepcopy(snapshot["provenance"])
    plan = plan_from_provenance(config)
    if plan is not None and plan.custom_rotary:
        install_rotary(model, plan)
    else:
        attention.uninstall(model, owner)
        owner.rotary_emb = snapshot["rotary"]


__all__ = ["is_unscaled", "restore_scaling", "scaling_label", "scaling_of", "snapshot_scaling"]
