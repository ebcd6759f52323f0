"""Which models patching supports, and their rotary geometry as a :class:`~ropescale.methods.RotarySpec`.

Planning (:mod:`ropescale.patching.plan`), loading and the checks of what a loader can run all start from
the same two questions: is this a RoPE architecture whose one rotary module ropescale can scale, and what
is its original geometry (head size, base, partial rotary factor, the context it was trained at)?
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..errors import UnsupportedModelError
from ..methods import RotarySpec
from ..methods.types import RopeParameters
from .geometry import original_geometry

#: model_type → architecture whose single ``model.rotary_emb`` reads ``config.rope_parameters``
#: exactly like Llama's (checked by the tests for each entry).
SUPPORTED_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' logger warnings (it cannot validate ``rope_type: ropescale_*``)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def check_supported(config: Any) -> None:
    """Raise :class:`UnsupportedModelError` unless the config is a supported RoPE architecture."""
    model_type = getattr(config, "model_type", "?")
    has_rope = bool(getattr(config, "rope_parameters", None)) or getattr(config, "rope_theta", None) is not None
    if model_type not in SUPPORTED_MODEL_TYPES:
        if not has_rope:
            raise UnsupportedModelError(
                f"model type '{model_type}' has no rotary position embedding (RoPE); ropescale scales RoPE models only"
            )
        raise UnsupportedModelError(
            f"model type '{model_type}' is not supported; supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )
    if not has_rope:
        raise UnsupportedModelError(f"model type '{model_type}' config has no rope parameters")


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_spec(config: Any, rope: RopeParameters, original_context: int) -> RotarySpec:
    """The rotary geometry of ``config`` with base and partial rotary factor from ``rope`` (original
    rope parameters) and the trained context ``original_context``."""
    return RotarySpec(
        head_dim=_head_dim(config),
        base=float(rope["rope_theta"]),
        original_max_position_embeddings=int(original_context),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
    )


def original_spec(config: Any) -> RotarySpec:
    """The model's original rotary geometry (before any scaling it carries)."""
    check_supported(config)
    rope, _, L = original_geometry(config)
    return rotary_spec(config, rope, L)


def trained_context(config: Any) -> int:
    """L, the context the model was trained at: a scaled checkpoint's original context (from its provenance
    block or its rope parameters), an unscaled one's ``max_position_embeddings``."""
    return original_geometry(config)[2]
