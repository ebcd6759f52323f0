"""Whether transformers can run a config, checked without weights (before loading, before saving).

``patch`` used to print "wrote" for checkpoints no loader can run: transformers builds a Llama
whose ``rope_parameters`` say yarn with ``partial_rotary_factor: 0.5`` without complaint, and the
first forward pass fails on a shape (the rotary gives 8 dims, the attention rotates all 16); a
Qwen2 whose ``layer_types`` keep ``sliding_attention`` layers after ``sliding_window`` became null
fails building its masks. Neither is caught by building the config (transformers' rope validation
only logs warnings).

:func:`check_runnable` therefore does what the loader will: it builds the model from the config on
the meta device (``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: shapes, no
memory) and runs a few tokens through it. The rotary embedding alone runs on the CPU (a dynamic
rope type reads its positions as numbers, which meta tensors cannot give) and hands its cos/sin to
the meta model. The classes of failure ropescale knows are named first, by key:

* ``partial_rotary_factor`` below 1 on Llama, Mistral, Qwen2 or Qwen3 with a scaled rope type
  (their attention rotates the whole head; only their plain RoPE ignores the factor);
* ``sliding_window`` null while ``layer_types`` has ``sliding_attention`` layers.

Anything else transformers fails on is reported as one line naming the file and transformers'
own message. Non-native scalings are checked on the geometry plain transformers builds
(:func:`buildable_config`); their rotary module is ropescale's own.
"""

from __future__ import annotations

import copy
from typing import Any

from ..errors import RopescaleError
from ..patching.plan import NON_NATIVE_PREFIX, SUPPORTED_MODEL_TYPES, quiet_transformers

#: tokens run through the meta model: enough for a causal and a sliding mask
_TOKENS = 4


def buildable_config(config: Any) -> Any:
    """A copy of ``config`` that plain transformers can build: a non-native ropescale scaling is
    unwound to the original rope parameters (it is re-applied by swapping the rotary module)."""
    build = copy.deepcopy(config)
    rope = getattr(build, "rope_parameters", None) or {}
    if str(rope.get("rope_type", "")).startswith(NON_NATIVE_PREFIX):
        block = build.ropescale
        build.rope_parameters = copy.deepcopy(block["original_rope_parameters"])
        build.max_position_embeddings = int(block["original_max_position_embeddings_field"])
    return build


def check_partial_rotary(config: Any, source: str) -> None:
    """Refuse a ``partial_rotary_factor`` below 1 on a model whose attention rotates the whole head,
    with a scaled rope type (transformers' scaled initialisers honour the factor, the attention does not)."""
    rope = getattr(config, "rope_parameters", None) or {}
    partial = rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    model_type = getattr(config, "model_type", None)
    rope_type = rope.get("rope_type", "default")
    if partial in (None, 1, 1.0) or model_type not in SUPPORTED_MODEL_TYPES or rope_type == "default":
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    raise RopescaleError(
        f"{source}: rope_parameters.partial_rotary_factor = {partial!r}: {model_type} attention rotates the whole "
        f"head ({head_dim} dims; its plain RoPE ignores the factor), so a scaled rotary ('{rope_type}') of "
        f"{int(head_dim * partial)} dims cannot run in any loader; remove partial_rotary_factor from config.json"
    )


def check_sliding_layers(config: Any, source: str) -> None:
    """Refuse ``layer_types`` with ``sliding_attention`` layers and no ``sliding_window`` width."""
    layers = getattr(config, "layer_types", None) or []
    if "sliding_attention" in layers and getattr(config, "sliding_window", None) is None:
        n = sum(t == "sliding_attention" for t in layers)
        raise RopescaleError(
            f"{source}: sliding_window = None but layer_types has {n} 'sliding_attention' layer(s): transformers "
            "cannot build their masks; give a width (--sliding-window N) or make those layers 'full_attention'"
        )


def check_runnable(config: Any, source: str) -> None:
    """Raise a one-line :class:`RopescaleError` unless transformers can build and run ``config``.

    Args:
        config: a transformers config as the loader will hold it (a ropescale scaling applied or saved).
        source: the file (or model) it came from, for the message.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return  # check_supported says what is wrong with it
    check_partial_rotary(config, source)
    check_sliding_layers(config, source)
    build = buildable_config(config)
    try:
        with quiet_transformers():
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(build, attn_implementation="eager")  # sdpa masks read values
            owner = model.get_decoder()
            rotary = type(owner.rotary_emb)(config=build)  # outside the meta context: on the CPU
            ids = torch.zeros(1, _TOKENS, dtype=torch.long)
            positions = torch.arange(_TOKENS)[None]
            cos, sin = rotary(torch.zeros(1, _TOKENS, 1), positions)
            owner.rotary_emb.forward = lambda x, position_ids: (cos.to("meta", x.dtype), sin.to("meta", x.dtype))
            with torch.no_grad():
                model(input_ids=ids.to("meta"))  # with a cache: no packed-sequence check on values
    except RopescaleError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here is the loader's failure later
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise RopescaleError(
            f"{source}: transformers cannot run this config ({type(exc).__name__}: {text}); nothing was loaded or "
            "written"
        ) from exc


__all__ = ["buildable_config", "check_partial_rotary", "check_runnable", "check_sliding_layers"]
