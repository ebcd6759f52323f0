"""Tiny random-init models: the one definition the tests, the engines table and the loader benchmark
build theirs from.

Each caller keeps its numbers (its tests' expected values depend on them), so the shapes are named:

- ``test``: 2 layers, hidden 64, 4 query heads of 16 over 2 KV heads, MLP 128, vocabulary 128 (the
  tests' default model, the evaluation tests' tokenizer-sized Llama, the loader benchmark's);
- ``narrow``: the same with hidden 32 (heads of 8) and MLP 64, for the lm-eval tests, whose many
  requests run on it;
- ``engines``: 1 layer, hidden 128, 2 heads of 64: the rotary size the serving engines' own code
  builds (``docs/engines.md``, tests/interop).

Every shape uses the default RoPE with base 10000 unless ``rope_parameters`` says otherwise; Mistral
gets no sliding window (the tiny inputs are longer than any window worth testing).
"""

from __future__ import annotations

from typing import Any

#: arch -> (config class, model class) names in transformers
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}
_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
SHAPES: dict[str, dict[str, int]] = {
    "test": {**_HEADS, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16},
    "narrow": {**_HEADS, "hidden_size": 32, "intermediate_size": 64, "head_dim": 8},
    "engines": {
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
}


def tiny_config(arch: str = "llama", shape: str = "test", **overrides: Any):
    """The config of a tiny ``arch`` model of the named ``shape``; ``overrides`` are config keys
    (``max_position_embeddings``, ``rope_parameters``, ``vocab_size``, ``attn_implementation``, ...)."""
    import transformers

    kwargs: dict[str, Any] = {
        "vocab_size": 128,
        **SHAPES[shape],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }
    if arch == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    return getattr(transformers, ARCHS[arch][0])(**kwargs)


def tiny_model(arch: str = "llama", shape: str = "test", seed: int = 0, **overrides: Any):
    """A tiny random ``arch`` model (:func:`tiny_config`) drawn with ``seed``, in eval mode."""
    import torch
    import transformers

    config = tiny_config(arch, shape, **overrides)
    torch.manual_seed(seed)
    return getattr(transformers, ARCHS[arch][1])(config).eval()


__all__ = ["ARCHS", "SHAPES", "tiny_config", "tiny_model"]
