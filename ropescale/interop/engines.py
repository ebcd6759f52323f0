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
* llama.cpp: what ``ropescale export-gguf`` writes and llama.cpp's loader reads, by model type and rope
  form (:mod:`ropescale.interop.gguf_support`, the one answer ``export-gguf`` refuses by). llama.cpp's
  own ``convert_hf_to_gguf.py`` differs: it writes YaRN's attention_factor as ``yarn_attn_factor``
  (which llama, qwen2 and qwen3 do not read) and LongRoPE's factors only for Phi-3.

Verdicts: ``keeps``; ``approximates`` (loads the scaling, computes it differently); ``loses`` (the
engine could apply the scaling but this config makes it load silently without it: wrong or missing
keys; re-saving with ropescale fixes it); ``fails`` (stops with an error); ``cannot express`` (the
engine has no implementation of it, whatever the config says).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config_json import RopeDict

# The same as ropescale.patching.plan's (not imported: that pulls in torch; the CLI stays fast).
NON_NATIVE_PREFIX = "ropescale_"
PROVENANCE_KEY = "ropescale"

KEEPS, APPROXIMATES, LOSES, FAILS, CANNOT = "keeps", "approximates", "loses", "fails", "cannot express"
DEFAULT_THETA = 10000.0
#: the llama.cpp tests/export/test_gguf_llamacpp.py runs on exported files (``make llamacpp``)
LLAMA_CPP_MEASURED = "llama-cpp-python 0.3.36's llama.cpp"
#: fields an engine may leave out, and the value transformers then uses
FIELD_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
_LINEAR_TGI = "TGI's PositionRotaryEmbedding.static never applies the 'linear' factor (plain RoPE)"
_DYNAMIC_FIXED = "dynamic NTK with the base fixed at factor x L for every length (transformers: per length)"
_DYNAMIC_FAILS = (
    "dynamic NTK: builds RoPE with L cached positions while accepting factor x L tokens "
    "(IndexError beyond L on CPU, out-of-bounds cache reads on GPU)"
)
_LONGROPE_POSITION = (
    "longrope: long_factor once a position exceeds L; transformers once the length does (they differ at L+1 tokens)"
)
LONGROPE_LEN = (
    "longrope: serves L tokens by default; with --max-model-len above L, long_factor at every length "
    "(transformers: short_factor up to L)"
)


@dataclass(frozen=True)
class Engine:
    """One loader, for a range of its versions beside one transformers major: how it reads
    config.json and what it does with each rope type."""

    key: str
    name: str
    versions: str
    reader: str  # a key of READERS
    #: rope_type -> (verdict, why) for types it does not simply keep
    support: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: (first, last) engine version of this row, and the transformers major beside it (None: any)
    span: tuple[str, str] = ("0", "999")
    transformers: int | None = None
    #: YaRN's attention factor is read only as ``attn_factor``, a multiplier of 0.1 ln(factor) + 1
    attn_factor: bool = False
    #: how the default context is derived (:func:`engine_context`): None, "vllm", "vllm-0.18", "sglang"
    context: str | None = None
    #: the version tests/interop runs (its own config and rope code); None: rules from reading the code
    measured: str | None = None


def version_tuple(text: str) -> tuple[int, ...]:
    """``"0.19.1"`` -> (0, 19, 1); stops at the first part that is not a number (``"4.57.6.dev0"``)."""
    out = []
    for part in str(text).split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def engine_context(engine: Engine, rope: dict, data: dict) -> int | None:
    """The context an engine serves without ``--max-model-len`` / ``--context-length``.

    vLLM ``_get_and_verify_max_len``: ``max_position_embeddings`` times the factor, except for
    llama3/longrope (yarn: its original context times the factor); from 0.18 a longrope checkpoint
    defaults to its top-level ``original_max_position_embeddings``. SGLang ``get_context_length``:
    times the factor unless ``rope_scaling`` has an original context, or is llama3.
    """
    max_pos = data.get("max_position_embeddings")
    if engine.context is None or max_pos is None:
        return None
    kind, factor = rope["rope_type"], rope.get("factor") or 1
    if engine.context == "sglang":
        keep = "original_max_position_embeddings" in rope or kind == "llama3"
        return int(max_pos if keep or kind == "default" else max_pos * factor)
    if kind in ("llama3", "longrope", "su"):
        if kind == "longrope" and engine.context == "vllm-0.18":
            return int(data.get("original_max_position_embeddings", max_pos))
        return int(max_pos)
    if kind == "yarn":
        return int(rope.get("original_max_position_embeddings", max_pos) * factor)
    return int(max_pos * (factor if kind != "default" else 1))


def flat_rope(value: Any) -> RopeDict | None:
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

_OLD = {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED), "longrope": (APPROXIMATES, _LONGROPE_POSITION)}
_NEW = {"dynamic": (APPROXIMATES, _DYNAMIC_FIXED), "longrope": (APPROXIMATES, LONGROPE_LEN)}
_NEW_FAILS = {"dynamic": (FAILS, _DYNAMIC_FAILS), "longrope": (APPROXIMATES, LONGROPE_LEN)}

ENGINES: tuple[Engine, ...] = (
    Engine("transformers4", "transformers", "4.45-4.57", "tf4", span=("4.45", "4.99")),
    Engine("transformers5", "transformers", "5.x", "tf5", span=("5.0", "5.999")),
    Engine(
        "vllm-0.11",
        "vLLM",
        "<= 0.11 (transformers 4)",
        "legacy_engine",
        _OLD,
        span=("0", "0.11.99"),
        transformers=4,
        attn_factor=True,
        context="vllm",
        measured="0.11.0 on transformers 4.57.6",
    ),
    Engine(
        "vllm-tf4",
        "vLLM",
        "0.12-0.19 on transformers 4",
        "vllm_tf4",
        _OLD,
        span=("0.12", "0.19.99"),
        transformers=4,
        attn_factor=True,
        context="vllm",
    ),
    Engine(
        "vllm-tf5",
        "vLLM",
        "0.19.1-0.21 (transformers 5)",
        "tf5",
        _NEW,
        span=("0.19.1", "0.21.99"),
        transformers=5,
        attn_factor=True,
        context="vllm-0.18",
    ),
    Engine(
        "vllm-0.22",
        "vLLM",
        "0.22-0.29 (transformers 5)",
        "tf5",
        _NEW_FAILS,
        span=("0.22", "0.29.99"),
        transformers=5,
        attn_factor=True,
        context="vllm-0.18",
    ),
    Engine(
        "vllm-0.30",
        "vLLM",
        ">= 0.30 (transformers 5)",
        "tf5",
        _NEW_FAILS,
        span=("0.30", "999"),
        transformers=5,
        context="vllm-0.18",
        measured="0.33.0 on transformers 5.24.0",
    ),
    Engine(
        "sglang-tf4",
        "SGLang",
        "on transformers 4 (e.g. 0.5.5)",
        "legacy_engine",
        _OLD,
        span=("0", "0.5.22"),
        transformers=4,
        attn_factor=True,
        context="sglang",
    ),
    Engine(
        "sglang-tf5",
        "SGLang",
        "on transformers 5 (e.g. 0.5.23)",
        "tf5",
        _OLD,
        span=("0.5.6", "999"),
        transformers=5,
        attn_factor=True,
        context="sglang",
        measured="0.5.23 on transformers 5.24.0",
    ),
    Engine("tgi", "TGI", "2.x-3.3.7", "legacy_engine", {"linear": (CANNOT, _LINEAR_TGI)}, transformers=4),
    # judged by ropescale.interop.gguf_support.carry (what export-gguf writes), not by rope type alone
    Engine("llama.cpp", "llama.cpp", "GGUF from ropescale export-gguf", "gguf", measured=LLAMA_CPP_MEASURED),
)
#: the transformers major each engine runs on by default, by its version (None: say it)
DEFAULT_TRANSFORMERS = {"vllm": ((0, 19, 1), 4, 5), "sglang": ((0, 5, 23), 4, 5)}


# --- what the checkpoint means, and the comparison -------------------------------------------


def by_version(name: str, version: str, transformers: str | None = None) -> Engine:
    """The row for one engine version (and the transformers version beside it).

    Args:
        name: ``transformers``, ``vllm``, ``sglang``, ``tgi`` or ``llama.cpp``.
        version: the engine's version, e.g. ``"0.19.1"``.
        transformers: the transformers version installed beside it; None: the one that version
            ships with (vLLM < 0.19.1 and SGLang < 0.5.23: 4, later: 5).

    Returns:
        The :data:`ENGINES` row; ``ValueError`` (one line) when none covers it.
    """
    v = version_tuple(version)
    rows = [e for e in ENGINES if e.name.lower() == name and version_tuple(e.span[0]) <= v <= version_tuple(e.span[1])]
    if name == "transformers" or not rows:
        if not rows:
            raise ValueError(f"no rule for {name} {version}; engines: {', '.join(e.key for e in ENGINES)}")
        return rows[0]
    if transformers is None and name in DEFAULT_TRANSFORMERS:
        first, before, after = DEFAULT_TRANSFORMERS[name]
        major = after if v >= first else before
    else:
        major = version_tuple(transformers)[0] if transformers else None
    chosen = [e for e in rows if e.transformers in (None, major)]
    if len(chosen) != 1:
        raise ValueError(f"no rule for {name} {version} on transformers {transformers or major}")
    return chosen[0]


def select(keys: str | None) -> tuple[Engine, ...]:
    """Engines by key prefix or by version.

    Args:
        keys: comma-separated items, each a prefix of :attr:`Engine.key` (``"transformers,vllm"``) or
            an engine version with, optionally, the transformers beside it
            (``"vllm==0.19.1:transformers==4.57.6"``, ``"sglang==0.5.23"``); None for all rows.

    Returns:
        The matching rows of :data:`ENGINES`; ``ValueError`` (one line) for an unknown item.
    """
    if not keys:
        return ENGINES
    chosen: list[Engine] = []
    for item in (k.strip().lower() for k in keys.split(",") if k.strip()):
        if "==" in item:
            engine, _, beside = item.partition(":")
            name, _, version = engine.partition("==")
            tf = beside.partition("==")[2] if beside.startswith("transformers==") else None
            if beside and tf is None:
                raise ValueError(f"'{item}': name the transformers beside it as ':transformers==X.Y'")
            rows = [by_version(name.strip(), version.strip(), tf)]
        else:
            rows = [e for e in ENGINES if e.key.startswith(item)]
        if not rows:
            raise ValueError(f"unknown engine {item!r}; engines: {', '.join(e.key for e in ENGINES)}")
        chosen += [e for e in rows if e not in chosen]
    return tuple(chosen)
