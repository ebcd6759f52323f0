"""One validation pass over a model's ``config.json``, before transformers builds a config from it.

transformers rejects some broken configs with its own exceptions (``KeyError`` for a yarn scaling
without a factor, ``StrictDataclassClassValidationError`` for an odd head size or heads that do not
divide the hidden size) and silently fills others (a missing ``max_position_embeddings`` becomes its
default 2048, which ropescale would then take as the trained context). Every command reads the
config through :func:`ropescale.models.loading.load_config` (``doctor`` through its own reader),
and both run :func:`check_config_dict` on the raw dict first, so each problem is one line

    <file>: <key> = <value>: <what is wrong>

raised as :class:`ConfigError` before any weights are read. What this pass does not know about,
transformers still rejects; :func:`ropescale.models.loading.load_config` turns that rejection into
the same kind of line (:func:`transformers_rejection`).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import RopescaleError
from ..patching.plan import INT64_MAX
from .config_conflicts import _MISSING, ConfigError, check_agreement

#: rope types whose transformers initialiser needs ``factor``
_NEEDS_FACTOR = ("linear", "dynamic", "yarn", "longrope", "llama3")
#: the keys transformers requires per rope type, beyond rope_type and rope_theta
_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
}
#: rope parameters that are numbers wherever they appear
_NUMBERS = (
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "low_freq_factor",
    "high_freq_factor",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(data: dict[str, Any], key: str, source: str, *, required: bool = False) -> int | None:
    if key not in data or data[key] is None:
        if required:
            raise ConfigError(source, key, _MISSING, "required")
        return None
    value = data[key]
    if not _is_int(value) or value <= 0:
        raise ConfigError(source, key, value, "must be a positive integer")
    if value > INT64_MAX:
        raise ConfigError(source, key, value, f"is beyond int64 ({INT64_MAX})")
    return value


def has_rotary(data: dict[str, Any]) -> bool:
    """Whether a config dict describes rotary position embeddings at all."""
    from ..patching.plan import SUPPORTED_MODEL_TYPES

    keys = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "rotary_dim", "rotary_pct")
    return any(data.get(k) is not None for k in keys) or data.get("model_type") in SUPPORTED_MODEL_TYPES


def check_config_dict(
    data: dict[str, Any], source: str, original_context: int | None = None, shape: bool = True
) -> None:
    """Check the keys ropescale and transformers rely on, in the raw ``config.json`` dict.

    Args:
        data: the parsed config.json (a ropescale-marked model_type already unwrapped).
        source: the file, for the message.
        original_context: the trained context given on the command line
            (``--original-max-position-embeddings``); without it a config must say
            ``max_position_embeddings``.
        shape: require the keys that size the weights (``doctor``, which reads only the rope, does not).

    Raises:
        ConfigError: the first problem, as ``<file>: <key> = <value>: <what is wrong>``.
    """
    model_type = data.get("model_type")
    if not has_rotary(data):
        raise ConfigError(
            source, "model_type", model_type, "no rotary position embedding (RoPE); ropescale scales RoPE models only"
        )
    _check_names(data, source)
    if shape:
        _check_shape_keys(data, source)
    check_agreement(data, source)  # rope_parameters vs rope_scaling, dict vs top-level keys
    hidden = _positive_int(data, "hidden_size", source)
    heads = _positive_int(data, "num_attention_heads", source)
    kv_heads = _positive_int(data, "num_key_value_heads", source)
    head_dim = _positive_int(data, "head_dim", source)
    for key in ("num_hidden_layers", "vocab_size", "intermediate_size", "sliding_window"):
        _positive_int(data, key, source)
    if head_dim is None and hidden and heads:
        if hidden % heads:
            raise ConfigError(source, "num_attention_heads", heads, f"does not divide hidden_size ({hidden})")
        head_dim = hidden // heads
    if heads and kv_heads and heads % kv_heads:
        raise ConfigError(source, "num_key_value_heads", kv_heads, f"does not divide num_attention_heads ({heads})")
    rope_key, rope = _rope_block(data, source)
    _check_context(data, rope, rope_key, source, original_context)
    partial = rope.get("partial_rotary_factor", data.get("partial_rotary_factor", 1.0))
    if partial is not None and (not _is_number(partial) or not 0 < partial <= 1):
        raise ConfigError(source, f"{rope_key}.partial_rotary_factor", partial, "must be a number in (0, 1]")
    if head_dim:
        rotary = head_dim * (partial or 1.0)
        if rotary != int(rotary) or int(rotary) % 2:
            key = "head_dim" if "head_dim" in data else "hidden_size / num_attention_heads"
            part = f" x partial_rotary_factor {partial:g}" if partial not in (None, 1, 1.0) else ""
            raise ConfigError(
                source, key, head_dim, f"the rotary dimension{part} ({rotary:g}) must be even (RoPE rotates pairs)"
            )
    _check_rope(rope, rope_key, source, head_dim, partial)


def _check_names(data: dict[str, Any], source: str) -> None:
    """model_type, dtype and hidden_act: names transformers looks up (a wrong one is a raw
    ``AttributeError``/``KeyError`` when the model is built)."""
    import torch
    from transformers.activations import ACT2CLS
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from ..patching.plan import SUPPORTED_MODEL_TYPES

    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError(source, "model_type", _MISSING, "required (transformers picks the architecture by it)")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise ConfigError(source, "model_type", model_type, f"unknown to transformers (ropescale supports {supported})")
    for key in ("dtype", "torch_dtype"):
        value = data.get(key)
        if value is not None and value != "auto" and not isinstance(getattr(torch, str(value), None), torch.dtype):
            raise ConfigError(source, key, value, "not a torch dtype (float32, bfloat16, float16...)")
    act = data.get("hidden_act")
    if act is not None and (not isinstance(act, str) or act not in ACT2CLS):
        raise ConfigError(
            source, "hidden_act", act, f"unknown to transformers (e.g. {', '.join(sorted(ACT2CLS)[:6])}...)"
        )
    theta = data.get("rope_theta")  # the legacy top-level key
    if theta is not None and (not _is_number(theta) or theta <= 0):
        raise ConfigError(source, "rope_theta", theta, "must be a positive number")


#: keys that size the weights; transformers fills a missing one with its own default (4096 for
#: hidden_size), so a dry-run plan would size another model and loading would fail on the first tensor
_SHAPE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")


def _check_shape_keys(data: dict[str, Any], source: str) -> None:
    """A supported architecture's config must say its shape: transformers' defaults describe a 7B
    model, not the checkpoint, and a plan or meta-device count built from them looks plausible."""
    from ..patching.plan import SUPPORTED_MODEL_TYPES

    missing = [key for key in _SHAPE_KEYS if data.get(key) is None]
    if data.get("model_type") not in SUPPORTED_MODEL_TYPES or not missing:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    default = getattr(CONFIG_MAPPING[data["model_type"]](), missing[0], None)
    raise ConfigError(
        source,
        missing[0],
        _MISSING,
        f"the model's shape is unknown (transformers would assume its default {default}, which the weights "
        "do not have); add it to the config",
    )


def _rope_block(data: dict[str, Any], source: str) -> tuple[str, dict[str, Any]]:
    """(its key, the rope parameters): ``rope_parameters``, else the legacy ``rope_scaling``."""
    for key in ("rope_parameters", "rope_scaling"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(source, key, value, "must be an object of rope parameters")
        if value and all(isinstance(v, dict) for v in value.values()):  # per layer type (Gemma-style)
            return key, {}
        return key, value
    return "rope_parameters", {}


def _check_context(
    data: dict[str, Any], rope: dict[str, Any], rope_key: str, source: str, original_context: int | None
) -> None:
    value = data.get("max_position_embeddings")
    if value is None:
        if original_context is None and "original_max_position_embeddings" not in rope:
            raise ConfigError(
                source,
                "max_position_embeddings",
                _MISSING,
                "the trained context is unknown (transformers would assume its default 2048); add it to the "
                "config (patch, plot, recommend, eval harness: or pass --original-max-position-embeddings N)",
            )
    else:
        _positive_int(data, "max_position_embeddings", source)
    if "original_max_position_embeddings" in rope:
        _positive_int(rope, "original_max_position_embeddings", f"{source}: {rope_key}")


def _check_rope(rope: dict[str, Any], rope_key: str, source: str, head_dim: int | None, partial: Any) -> None:
    from ..patching.plan import NON_NATIVE_PREFIX

    if not rope:
        return
    theta = rope.get("rope_theta")
    if theta is not None and (not _is_number(theta) or theta <= 0):
        raise ConfigError(source, f"{rope_key}.rope_theta", theta, "must be a positive number")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if not isinstance(rope_type, str):
        raise ConfigError(source, f"{rope_key}.rope_type", rope_type, "must be a string")
    if rope_type == "default" or rope_type.startswith(NON_NATIVE_PREFIX):
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        known = ", ".join(["default", *ROPE_INIT_FUNCTIONS])
        raise ConfigError(source, f"{rope_key}.rope_type", rope_type, f"unknown to transformers (it knows {known})")
    for key in _NUMBERS:
        if rope.get(key) is not None and not _is_number(rope[key]):
            raise ConfigError(source, f"{rope_key}.{key}", rope[key], "must be a number")
    for key in _REQUIRED.get(rope_type, ()):
        if rope.get(key) is None:
            raise ConfigError(source, f"{rope_key}.{key}", _MISSING, f"rope_type '{rope_type}' needs it")
    if rope_type in _NEEDS_FACTOR:
        factor = rope["factor"] if rope_type != "longrope" else rope.get("factor", 1.0)
        if not _is_number(factor) or factor <= 0:
            raise ConfigError(source, f"{rope_key}.factor", factor, "must be a positive number")
    if rope_type == "longrope" and head_dim:
        pairs = int(head_dim * (partial or 1.0)) // 2
        for key in ("short_factor", "long_factor"):
            value = rope[key]
            if not isinstance(value, list) or len(value) != pairs or not all(_is_number(v) for v in value):
                raise ConfigError(
                    source, f"{rope_key}.{key}", value, f"must be a list of {pairs} numbers (one per pair)"
                )


def check_with_transformers(data: dict[str, Any], source: str) -> None:
    """Build the config with transformers (no weights), as loading would: what it rejects beyond
    :func:`check_config_dict` is raised as :func:`transformers_rejection` (``doctor`` reads no config
    object otherwise)."""
    from transformers import AutoConfig

    from ..patching.plan import quiet_transformers

    try:
        with quiet_transformers():
            AutoConfig.for_model(**data)
    except Exception as exc:  # noqa: BLE001 - filtered: only transformers' validation errors are rephrased
        rejection = None if isinstance(exc, RopescaleError) else transformers_rejection(exc, source)
        if rejection is None:
            raise
        raise rejection from exc


def transformers_rejection(exc: Exception, source: str) -> ConfigError | None:
    """transformers' own rejection of a config (a validation error, ``KeyError``, ``ValueError``,
    ``TypeError``) as a :class:`ConfigError` naming the file; None for other exceptions."""
    names = {c.__name__ for c in type(exc).__mro__}
    if not names & {"KeyError", "ValueError", "TypeError", "StrictDataclassError"}:
        return None
    text = " ".join(str(exc).split()) or type(exc).__name__
    error = ConfigError(source, "config", "...", f"transformers rejects it: {text}")
    error.args = (f"{source}: transformers rejects the config: {text}",)
    return error


__all__ = [
    "ConfigError",
    "INT64_MAX",
    "check_config_dict",
    "check_with_transformers",
    "has_rotary",
    "transformers_rejection",
]
