"""The ``ropescale`` lm-eval model's arguments: sorted into groups, read with :mod:`ropescale.options`.

lm-eval hands ``--model_args`` to the model class as keyword arguments, typed where lm-eval could
(``factor=4`` → 4) and as strings otherwise; every value is read here with the same parsers the
command line uses. No lm-eval is needed to import this module (torch only where a dtype or
device is resolved).
"""

from __future__ import annotations

import logging
from typing import Any, NotRequired, TypedDict

from ropescale import options
from ropescale.evals.tasks.records import JSONValue
from ropescale.models.runtime import DTYPES as RUNTIME_DTYPES

MODEL_NAME = "ropescale"

log = logging.getLogger(__name__)

# Arguments given to ropescale.from_pretrained as scaling options / transformers loading options.
SCALING_ARGS = ("method", "factor", "target_length", "original_max_position_embeddings", "replace", "sliding_window")
LOAD_ARGS = (
    "attn_implementation",
    "revision",
    "trust_remote_code",
    "local_files_only",
    "cache_dir",
    "token",
    "subfolder",
)
# HFLM arguments that still matter when HFLM is given a ready model.
HFLM_ARGS = (
    "batch_size",
    "max_batch_size",
    "add_bos_token",
    "truncation",
    "logits_cache",
    "softmax_dtype",
    "mixed_precision_dtype",
    "prefix_token_id",
    "think_end_token",
    "enable_thinking",
    "chat_template_args",
    "backend",
    "use_fast_tokenizer",
)
# Named arguments of RopescaleLM itself (listed in the "accepted" message).
OWN_ARGS = ("pretrained", "max_length", "dtype", "device", "tokenizer", "truncate_prompts")
PARAM_PREFIX = "param_"
DTYPES = ("auto", *RUNTIME_DTYPES)
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


class ModelArgGroups(TypedDict):
    """``--model_args`` sorted (:func:`split_model_args`): each group's keys as lm-eval gave them."""

    #: :data:`SCALING_ARGS`, read by :func:`scaling_options`
    scaling: dict[str, JSONValue]
    #: :data:`LOAD_ARGS`, given to transformers' loading
    load: dict[str, JSONValue]
    #: the method's own parameters (``param_<name>``, the prefix dropped, values read as YAML)
    params: dict[str, JSONValue]
    #: :data:`HFLM_ARGS`, given to lm-eval's HFLM
    hflm: dict[str, JSONValue]


class ScalingOptions(TypedDict):
    """:func:`ropescale.from_pretrained`'s scaling keyword arguments, typed (:func:`scaling_options`)."""

    method: str | None
    factor: float | None
    original_max_position_embeddings: int | None
    replace: bool
    sliding_window: str | int | None
    method_params: dict[str, JSONValue] | None
    #: only when given (factor = target_length / original context)
    target_length: NotRequired[int]


def split_model_args(args: dict[str, JSONValue]) -> ModelArgGroups:
    """Sort ``--model_args`` into scaling, loading, method-parameter and HFLM groups.

    Args:
        args: the keyword arguments RopescaleLM did not name itself.

    Returns:
        ``{"scaling": ..., "load": ..., "params": ..., "hflm": ...}``; ``param_<name>`` keys lose
        their prefix and their values are read as YAML (:func:`ropescale.options.param_value`).

    Raises:
        ValueError: unknown keys (HFLM would silently ignore them for a ready model).
    """
    groups = ModelArgGroups(scaling={}, load={}, params={}, hflm={})
    unknown = []
    for key, value in args.items():
        if key in SCALING_ARGS:
            groups["scaling"][key] = value
        elif key in LOAD_ARGS:
            groups["load"][key] = value
        elif key in HFLM_ARGS:
            groups["hflm"][key] = value
        elif key.startswith(PARAM_PREFIX) and len(key) > len(PARAM_PREFIX):
            groups["params"][key[len(PARAM_PREFIX) :]] = options.param_value(value)
        else:
            unknown.append(key)
    if unknown:
        accepted = ", ".join([*OWN_ARGS[:1], *SCALING_ARGS, "param_<name>", *OWN_ARGS[1:], *LOAD_ARGS, *HFLM_ARGS])
        raise ValueError(f"unknown model_args for '{MODEL_NAME}': {', '.join(sorted(unknown))} (accepted: {accepted})")
    return groups


def scaling_options(scaling: dict[str, JSONValue], params: dict[str, JSONValue]) -> ScalingOptions:
    """Keyword arguments for :func:`ropescale.from_pretrained` from the scaling group, typed.

    ``method`` absent or ``saved`` → None (the model as saved); ``none`` removes a saved scaling and any
    other method replaces it (``replace`` defaults to true: evaluating is not writing); ``factor`` a float > 0
    (:func:`ropescale.options.factor`); lengths positive integers; ``target_length`` only when given.
    """
    method = scaling.get("method")
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings")
    target_length = scaling.get("target_length")
    out = ScalingOptions(
        method=None if method is None or str(method).strip().lower() in ("", "saved") else str(method).strip(),
        factor=None if options.none_like(factor) else options.factor(factor),
        original_max_position_embeddings=(
            None if options.none_like(original) else options.length(original, "original_max_position_embeddings")
        ),
        replace=options.boolean(scaling.get("replace", True), "replace"),
        sliding_window=options.sliding_window(scaling.get("sliding_window", "keep")),
        method_params=params or None,
    )
    if not options.none_like(target_length):  # factor = target_length / original context
        out["target_length"] = options.length(target_length, "target_length")
    return out


def parse_dtype(value: Any) -> Any:
    """``auto`` (as stored) or a torch dtype from a name (``bf16``, ``torch.float16``...)."""
    import torch

    if options.none_like(value) or value == "auto":
        return "auto"
    if isinstance(value, torch.dtype):
        return value
    name = str(value).strip().lower().removeprefix("torch.")
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {value!r}")
    return getattr(torch, name)


def resolve_device(value: Any) -> str:
    """HFLM's defaults (``cuda``, the CLI's ``cuda:0``) fall back to the CPU when there is no GPU."""
    import torch

    if options.none_like(value):
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = str(value).strip()
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.info("ropescale: no CUDA device, using the CPU instead of %s", device)
        return "cpu"
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {value!r}") from None
    return device


def default_max_length(config: Any) -> int:
    """The context the scaled model is meant for: ``config.ropescale["extended_context"]`` (factor x
    original, also for dynamic methods whose ``max_position_embeddings`` stays at the original),
    else ``max_position_embeddings``."""
    block = getattr(config, "ropescale", None) or {}
    extended = block.get("extended_context") if isinstance(block, dict) else None
    if extended:
        return int(extended)
    return int(config.max_position_embeddings)


def trained_context(config: Any) -> int:
    """The context the model was trained at: the provenance block's original, else ``max_position_embeddings``."""
    block = getattr(config, "ropescale", None) or {}
    original = block.get("original_max_position_embeddings") if isinstance(block, dict) else None
    return int(original or config.max_position_embeddings)
