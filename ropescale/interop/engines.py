"""Which loaders keep a checkpoint's RoPE scaling, from its config.json alone.

Each engine is one row of :data:`ENGINES`: how it reads the config (:data:`READERS`: which of
``rope_scaling`` / ``rope_parameters`` wins, where the base comes from, where the original context
comes from) and what it does with each rope type it can see (``support``). The rules come from the
engines' own code, at the versions named in each row:

* transformers 4.45-4.57 ``modeling_rope_utils.py`` (4.57.6 read): ``config.rope_scaling`` and the
  top-level ``rope_theta`` (LlamaConfig/MistralConfig default 10000); longrope takes its original
  context from the top-level ``original_max_position_embeddings``, else ``max_position_embeddings``.
* transformers 5.x (5.23 and 5.24 read): ``convert_rope_params_to_dict``: ``rope_scaling`` if set, else
  ``rope_parameters``; ``rope_theta`` inside the dict, else the top-level one.
* vLLM <= 0.11: models pass ``config.rope_scaling`` and ``config.rope_theta`` to ``get_rope``.
  vLLM 0.12-0.19.0 (still on transformers 4; ``patch_rope_parameters``, vllm-project/vllm#28542):
  ``rope_scaling`` moved to ``rope_parameters`` when set, else the ``rope_parameters`` key of
  config.json; the top-level ``rope_theta`` (10000 by LlamaConfig's default) overwrites the dict's.
  vLLM >= 0.19.1 runs on transformers 5 (vllm-project/vllm#30566) and reads like it.
  In every version ``DynamicNTKScalingRotaryEmbedding`` fixes the NTK base at factor x L for all lengths.
* SGLang (releases on transformers 4.x, e.g. 0.5: 4.55-4.57): ``models/llama.py`` reads
  ``config.rope_scaling`` and ``rope_theta`` and copies a top-level ``original_max_position_embeddings``
  into ``rope_scaling``; ``get_rope`` is vLLM 0.6.6's (dynamic NTK fixed at factor x L).
* text-generation-inference 2.x-3.3.7 (last release, in maintenance; transformers 4.51):
  ``layers/rotary.py`` ``PositionRotaryEmbedding.static`` reads ``config.rope_scaling``: "linear" is a
  no-op there (the factor is never applied on the flash Llama/Mistral path), yarn fixes beta_fast=32,
  beta_slow=1 and ignores attention_factor, longrope requires the top-level
  ``original_max_position_embeddings``.
* llama.cpp ``convert_hf_to_gguf.py`` (since its ``rope_parameters`` support, late 2025; older copies
  read ``rope_scaling`` like transformers 4): ``rope_parameters``, else ``rope_scaling``; linear and
  yarn (factor, original context, betas, attention_factor) become GGUF keys, llama3 a ``rope_freqs``
  tensor; "dynamic" is written as plain RoPE (llama.cpp has no dynamic NTK) and longrope's factors
  are exported only for Phi-3 architectures.

Verdicts: ``keeps``; ``approximates`` (loads the scaling, computes it differently); ``loses`` (the
engine could apply the scaling but this config makes it load silently without it: wrong or missing
keys; re-saving with ropescale fixes it); ``fails`` (stops with an error); ``cannot express`` (the
engine has no implementation of it, whatever the config says).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The same as ropescale.patching.plan's (not imported: that pulls in torch; the CLI stays fast).
NON_NATIVE_PREFIX = "ropescale_"
PROVENANCE_KEY = "ropescale"

KEEPS, APPROXIMATES, LOSES, FAILS, CANNOT = "keeps", "approximates", "loses", "fails", "cannot express"
DEFAULT_THETA = 10000.0
#: fields an engine may leave out, and the value transformers then uses
FIELD_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
_LINEAR_TGI = "TGI's PositionRotaryEmbedding.static never applies the 'linear' factor (plain RoPE)"
_DYNAMIC_FIXED = "dynamic NTK with the base fixed at factor x L for every length (transformers: per length)"


@dataclass(frozen=True)
class Engine:
    """One loader: how it reads config.json and what it does with each rope type."""

    key: str
    name: str
    versions: str
    reader: str  # a key of READERS
    #: rope_type -> (verdict, why) for types it does not simply keep
    support: dict[str, tuple[str, str]] = field(default_factory=dict)


def flat_rope(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not value:
        return None
    out = dict(value)
    out.setdefault("rope_type", out.get("type", "default"))
    return out


def original_context(rope: dict, data: dict, top_wins: bool) -> None:
    """yarn/llama3/longrope: the original context as the engine resolves it (in place)."""
    if rope["rope_type"] not in ("yarn", "llama3", "longrope"):
        return
    top = data.get("original_max_position_embeddings")
    if top is not None and (top_wins or "original_max_position_embeddings" not in rope):
        rope["original_max_position_embeddings"] = top


def read_tf4(data: dict) -> tuple[dict | None, str]:
    rope = flat_rope(data.get("rope_scaling")) or {"rope_type": "default"}
    rope["rope_theta"] = data.get("rope_theta", DEFAULT_THETA)
    if rope["rope_type"] == "longrope":  # 4.57 ignores rope_scaling's own value here
        rope["original_max_position_embeddings"] = data.get(
            "original_max_position_embeddings", data.get("max_position_embeddings")
        )
    elif rope["rope_type"] == "yarn":
        rope.setdefault("original_max_position_embeddings", data.get("max_position_embeddings"))
    where = "rope_scaling" if data.get("rope_scaling") else "rope_scaling (absent)"
    return rope, f"{where} + top-level rope_theta" + ("" if "rope_theta" in data else " (absent: 10000)")


def read_tf5(data: dict) -> tuple[dict | None, str]:
    legacy = flat_rope(data.get("rope_scaling"))
    rope = legacy or flat_rope(data.get("rope_parameters")) or {"rope_type": "default"}
    rope.setdefault("rope_theta", data.get("rope_theta", DEFAULT_THETA))
    original_context(rope, data, top_wins=True)
    if rope["rope_type"] in ("yarn", "llama3", "longrope"):
        rope.setdefault("original_max_position_embeddings", data.get("max_position_embeddings"))
    return rope, "rope_scaling (it takes precedence)" if legacy else "rope_parameters"


def read_vllm_tf4(data: dict) -> tuple[dict | None, str]:
    legacy = flat_rope(data.get("rope_scaling"))
    rope = legacy or flat_rope(data.get("rope_parameters")) or {"rope_type": "default"}
    rope["rope_theta"] = data.get("rope_theta", DEFAULT_THETA)  # the config class default overwrites the dict's
    original_context(rope, data, top_wins=True)
    where = "rope_scaling" if legacy else "rope_parameters"
    return rope, f"{where} + top-level rope_theta" + ("" if "rope_theta" in data else " (absent: 10000)")


def read_legacy_engine(data: dict) -> tuple[dict | None, str]:
    """vLLM <= 0.11, SGLang, TGI: ``rope_scaling`` + ``rope_theta``, top-level original context copied in."""
    rope = flat_rope(data.get("rope_scaling")) or {"rope_type": "default"}
    rope["rope_theta"] = data.get("rope_theta", DEFAULT_THETA)
    if rope["rope_type"] != "default":
        original_context(rope, data, top_wins=True)
    where = "rope_scaling" if data.get("rope_scaling") else "rope_scaling (absent)"
    return rope, f"{where} + top-level rope_theta" + ("" if "rope_theta" in data else " (absent: 10000)")


def read_gguf(data: dict) -> tuple[dict | None, str]:
    params = flat_rope(data.get("rope_parameters"))
    rope = params or flat_rope(data.get("rope_scaling")) or {"rope_type": "default"}
    rope.setdefault("rope_theta", data.get("rope_theta", DEFAULT_THETA))
    return rope, "rope_parameters" if params else "rope_scaling"


READERS: dict[str, Callable[[dict], tuple[dict | None, str]]] = {
    "tf4": read_tf4,
    "tf5": read_tf5,
    "vllm_tf4": read_vllm_tf4,
    "legacy_engine": read_legacy_engine,
    "gguf": read_gguf,
}

ENGINES: tuple[Engine, ...] = (
    Engine("transformers4", "transformers 4.x", "4.45-4.57", "tf4"),
    Engine("transformers5", "transformers 5.x", "5.0-5.24", "tf5"),
    Engine("vllm-legacy", "vLLM", "<= 0.11", "legacy_engine", {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED)}),
    Engine("vllm-tf4", "vLLM", "0.12-0.19.0 (transformers 4)", "vllm_tf4", {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED)}),
    Engine("vllm-tf5", "vLLM", ">= 0.19.1 (transformers 5)", "tf5", {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED)}),
    Engine("sglang", "SGLang", "on transformers 4.x", "legacy_engine", {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED)}),
    Engine("tgi", "TGI", "2.x-3.3.7", "legacy_engine", {"linear": (CANNOT, _LINEAR_TGI)}),
    Engine(
        "llama.cpp",
        "llama.cpp",
        "GGUF converter, late 2025+",
        "gguf",
        {
            "dynamic": (CANNOT, "llama.cpp has no dynamic NTK: the converter writes plain RoPE"),
            "longrope": (CANNOT, "the converter exports long/short factors only for Phi-3 architectures"),
        },
    ),
)


# --- what the checkpoint means, and the comparison -------------------------------------------


def select(keys: str | None) -> tuple[Engine, ...]:
    """Engines by key prefix.

    Args:
        keys: comma-separated prefixes of :attr:`Engine.key` (``"transformers,vllm"``), or None for all.

    Returns:
        The matching rows of :data:`ENGINES`; ``ValueError`` (one line) for an unknown prefix.
    """
    if not keys:
        return ENGINES
    wanted = [k.strip().lower() for k in keys.split(",") if k.strip()]
    chosen = tuple(e for e in ENGINES if any(e.key.startswith(w) for w in wanted))
    unknown = [w for w in wanted if not any(e.key.startswith(w) for e in ENGINES)]
    if unknown or not chosen:
        raise ValueError(
            f"unknown engine {unknown[0] if unknown else keys!r}; engines: {', '.join(e.key for e in ENGINES)}"
        )
    return chosen
