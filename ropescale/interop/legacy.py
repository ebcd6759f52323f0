"""The config.json keys that transformers 4.x and the serving engines read, from ``rope_parameters``.

transformers 5 writes a checkpoint's RoPE as one ``rope_parameters`` dict (``rope_type``,
``rope_theta``, the method's fields). transformers 4.45-4.57 and the engines built on it (vLLM up
to 0.19.0, SGLang, TGI, older llama.cpp converters) read instead:

* ``rope_scaling``: ``{"rope_type"/"type": ..., <fields>}`` or null for plain RoPE, with the field
  names of transformers 4.57 ``modeling_rope_utils`` (``_compute_*_parameters``):

  ===========  ==========================================================================================
  linear       factor
  dynamic      factor (the original context is read from ``max_position_embeddings``)
  yarn         factor, original_max_position_embeddings, beta_fast, beta_slow, truncate,
               attention_factor / mscale / mscale_all_dim when set
  llama3       factor, low_freq_factor, high_freq_factor, original_max_position_embeddings
  longrope     short_factor, long_factor, factor (+ attention_factor when set); 4.57 reads the original
               context from the TOP-LEVEL ``original_max_position_embeddings`` (without it, from
               ``max_position_embeddings``: long_factor would only start beyond the extended context)
  ===========  ==========================================================================================

  NTK-aware scaling is plain RoPE with a larger base: ``rope_scaling`` null, ``rope_theta`` scaled.
  For the serving engines, yarn with an explicit ``attention_factor`` also gets ``attn_factor`` (what
  vLLM < 0.30 and SGLang read: a multiplier of their default 0.1 ln(factor) + 1; transformers warns
  "Unrecognized keys" and ignores it), and a linear checkpoint's ``max_position_embeddings`` is the
  original context L (vLLM and SGLang serve max_position_embeddings x factor; transformers' linear
  RoPE does not read it). tests/interop runs the engines' own code on these checkpoints.
* top-level ``rope_theta`` (4.x defaults it to 10000 when absent), ``max_position_embeddings``,
  ``original_max_position_embeddings`` (llama3, yarn, longrope: read by 4.57 longrope, TGI longrope,
  SGLang and vLLM, which copy it into ``rope_scaling``), ``partial_rotary_factor`` where the model has one.

transformers 5 reading such a config gives ``rope_scaling`` precedence over ``rope_parameters``
(``convert_rope_params_to_dict``: ``rope_parameters = rope_scaling or rope_parameters``, then
``rope_theta``/``partial_rotary_factor`` filled in from the top level), so ``rope_scaling`` must
describe exactly the same scaling; the tests load both ways and compare logits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..rope_math import yarn_mscale
from .config_json import ConfigJSON, DualChunkConfig, LegacyKeys, RopeDict

#: rope types whose original context transformers / the engines read from a field of its own
NEEDS_ORIGINAL_CONTEXT = ("yarn", "llama3", "longrope")
#: rope_type -> the fields transformers 4.57 reads for it (beside rope_type), in the order written
FIELDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "truncate",
        "attention_factor",
        "mscale",
        "mscale_all_dim",
    ),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": (
        "factor",
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "attention_factor",
        "short_mscale",
        "long_mscale",
    ),
}
#: keys :func:`legacy_keys` may write (and :func:`write_legacy_keys` may remove when not needed)
LEGACY_KEYS = (
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "partial_rotary_factor",
)


def _as_dict(config: Any) -> ConfigJSON:
    if isinstance(config, dict):
        return config
    return {
        "rope_parameters": getattr(config, "rope_parameters", None),
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
        "ropescale": getattr(config, "ropescale", None),
    }


def legacy_rope_scaling(rope: RopeDict, max_position_embeddings: int | None) -> RopeDict | None:
    """The transformers-4 ``rope_scaling`` dict for a transformers-5 ``rope_parameters`` dict.

    Args:
        rope: ``rope_parameters`` (flat; ``rope_type`` default/linear/dynamic/yarn/llama3/longrope).
        max_position_embeddings: the config's field (longrope: decides whether an explicit
            ``attention_factor`` is needed, see below).

    Returns:
        ``None`` for plain RoPE (and for types no transformers 4 knows, e.g. ropescale's
        non-native ``ropescale_*``: those checkpoints are marked so plain loaders stop), else a
        dict with both ``rope_type`` and ``type`` (older vLLM/TGI/llama.cpp read ``type``).
    """
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in FIELDS:
        return None
    out: RopeDict = {"rope_type": rope_type, "type": rope_type}
    for key in FIELDS[rope_type]:
        if rope.get(key) is not None:
            out[key] = list(rope[key]) if isinstance(rope[key], tuple) else rope[key]
    if rope_type == "yarn" and out.get("attention_factor") is not None and "mscale" not in out:
        # vLLM < 0.30 and SGLang read YaRN's attention factor only as attn_factor, which multiplies
        # their default 0.1 ln(factor) + 1; transformers and vLLM >= 0.30 read attention_factor
        default = yarn_mscale(out.get("factor", 1))
        out["attn_factor"] = out["attention_factor"] / default
    if rope_type == "longrope" and "attention_factor" not in out:
        # 4.57 derives longrope's factor as max_position_embeddings / original context; where that
        # ratio is not exactly the factor, pin the attention factor transformers 5 computes from it.
        L, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
        if L and factor and max_position_embeddings and max_position_embeddings / L != factor:
            out["attention_factor"] = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(L))
    return out


def legacy_keys(config: Any) -> LegacyKeys:
    """The legacy top-level keys for a transformers config (or a config.json dict).

    Args:
        config: a ``PreTrainedConfig`` with ``rope_parameters`` (transformers 5), or the dict of a
            config.json holding ``rope_parameters``.

    Returns:
        ``{"rope_scaling": ..., "rope_theta": ..., "max_position_embeddings": ...}`` plus
        ``original_max_position_embeddings`` (llama3, yarn, longrope) and ``partial_rotary_factor``
        where the model has one. Empty if the config has no flat ``rope_parameters`` (nothing to mirror).
    """
    data = _as_dict(config)
    rope = data.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" not in rope or isinstance(rope.get("full_attention"), dict):
        return {}
    max_pos = data.get("max_position_embeddings")
    out: LegacyKeys = {
        "rope_scaling": legacy_rope_scaling(rope, max_pos),
        "rope_theta": rope["rope_theta"],
    }
    if max_pos is not None:
        out["max_position_embeddings"] = max_pos
    block = data.get("ropescale") if isinstance(data.get("ropescale"), dict) else {}
    if rope.get("rope_type") == "linear" and max_pos is not None and block.get("extended_context") == max_pos:
        # vLLM and SGLang serve max_position_embeddings x factor by default: write the original
        # context so that they serve the extended one (transformers' linear RoPE does not read it)
        out["max_position_embeddings"] = int(block["original_max_position_embeddings"])
    rope_type = rope.get("rope_type", "default")
    if rope_type in NEEDS_ORIGINAL_CONTEXT and rope.get("original_max_position_embeddings") is not None:
        out["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    if rope_type == "longrope" and rope.get("short_factor") == rope.get("long_factor"):
        # nothing switches at L, so no loader needs L at the top; vLLM >= 0.18 would serve only L tokens by
        # default (a composed scaling, ropescale.methods.composed, is saved this way)
        out.pop("original_max_position_embeddings", None)
    if rope.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = rope["partial_rotary_factor"]
    return out


def with_legacy_keys(data: ConfigJSON) -> ConfigJSON:
    """A config.json dict with the legacy keys set from its ``rope_parameters`` (a new dict).

    A top-level ``original_max_position_embeddings`` left over from an earlier scaling is removed
    where the current method does not use it (transformers 4.57 longrope and TGI read it).
    """
    keys = legacy_keys(data)
    if not keys:
        return dict(data)
    out = dict(data)
    if "original_max_position_embeddings" not in keys:
        out.pop("original_max_position_embeddings", None)
    out.update(keys)
    return out


def restore_serving_fields(config: Any) -> Any:
    """Undo, on a loaded transformers config, what :func:`legacy_keys` wrote for the engines alone.

    A linear checkpoint's config.json keeps ``max_position_embeddings`` at the original context (vLLM
    and SGLang multiply it by the factor); the loaded config gets the extended context back from
    ropescale's block, as the patched model had it. Returns ``config`` (changed in place).
    """
    block = getattr(config, "ropescale", None)
    rope = getattr(config, "rope_parameters", None)
    if (
        isinstance(block, dict)
        and isinstance(rope, dict)
        and rope.get("rope_type") == "linear"
        and block.get("extended_context")
        and getattr(config, "max_position_embeddings", None) == block.get("original_max_position_embeddings")
    ):
        config.max_position_embeddings = int(block["extended_context"])
    return config


#: model types whose vLLM models read ``dual_chunk_attention_config`` (Qwen2.5-1M's config key)
DUAL_CHUNK_MODEL_TYPES = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")


def dual_chunk_attention_config(method: Any, spec: Any, model_type: str) -> DualChunkConfig | None:
    """vLLM's ``dual_chunk_attention_config`` for a DCA checkpoint of a Qwen2-family model, else None.

    Args:
        method: the patch's method (:class:`ropescale.methods.dca.DualChunk`: read through its
            ``resolved_chunk_size`` / ``resolved_local_window``).
        spec: its :class:`~ropescale.methods.base.RotarySpec` (the original context L).
        model_type: the model's own type (``qwen2``...), not ropescale's marked one.

    Returns:
        ``{"chunk_size", "local_size", "original_max_position_embeddings"}``: vLLM's
        ``DualChunkRotaryEmbedding`` rotates keys at j mod (chunk_size - local_size) and queries at the
        same intra / successive (capped at chunk_size) / inter positions as ropescale's DCA.
    """
    if getattr(method, "name", None) != "dca" or model_type not in DUAL_CHUNK_MODEL_TYPES:
        return None
    return {
        "chunk_size": int(method.resolved_chunk_size(spec)),
        "local_size": int(method.resolved_local_window(spec)),
        "original_max_position_embeddings": int(spec.original_max_position_embeddings),
    }


def write_engine_keys(path: str | Path, method: Any, spec: Any) -> ConfigJSON:
    """Add the method-specific engine keys (:func:`dual_chunk_attention_config`) to a config.json in place."""
    path = Path(path)
    data = json.loads(path.read_text())
    dca = dual_chunk_attention_config(method, spec, str(data.get("model_type", "")))
    if dca is not None:
        data["dual_chunk_attention_config"] = dca
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def write_legacy_keys(path: str | Path) -> ConfigJSON:
    """Add the legacy keys to a config.json file in place; returns the new dict."""
    path = Path(path)
    data = with_legacy_keys(json.loads(path.read_text()))
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


__all__ = [
    "dual_chunk_attention_config",
    "legacy_keys",
    "legacy_rope_scaling",
    "restore_serving_fields",
    "with_legacy_keys",
    "write_engine_keys",
    "write_legacy_keys",
]
