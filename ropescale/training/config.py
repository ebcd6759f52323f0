"""Training recipes: a YAML file of sections, validated into dataclasses, with ``key=value`` overrides.

A recipe (``configs/train/<model>/<method>_<setting>.yaml``) has up to nine sections; every key is
optional except ``model.name``, ``scaling.method`` and ``scaling.factor``::

    model:    {name: smollm2-135m, dtype: auto, attn_implementation: auto, shipped_scaling: null,
               shipped_context: null}
    scaling:  {method: yarn, factor: 4, params: {}}
    lora:     {enabled: true, r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, k_proj, v_proj, o_proj],
               trainable: [embed, norm]}     # enabled: false = full fine-tune (every weight trains)
    data:     {source: austen, holdout: [Emma], seq_len: 2048, bos_each_window: true, max_tokens: null,
               recall_facts: 0, recall_forms: [digits], packing: auto, chat_loss: assistant, sources: [],
               short_share: 0}
    pose:     {enabled: true, target_length: 32768, chunks: 2, content: skip}
    s2attn:   {enabled: false, group_ratio: 0.25}
    optim:    {lr: 2.0e-5, betas: [0.9, 0.95], weight_decay: 0.0, warmup_steps: 20, schedule: linear}
    train:    {max_steps: 400, batch_size: 1, grad_accum: 8, mixed_precision: auto, ...}
    eval:     {every: 0, length: null, max_tokens: null, mode: nonoverlap}

``auto`` precision (the default) is resolved when the recipe is loaded (:mod:`.precision`: bf16 where the
GPU or CPU has it, 2x the fp32 tokens/s on such CPUs, benchmarks/bench_dtype.py), so the run's
``config.yaml`` records what ran. ``model.dtype=float32 train.mixed_precision=no`` is the fp32 run.

Overrides use dotted keys and YAML values: ``lora.r=16 optim.lr=1e-4 pose.enabled=false``.
Unknown keys and wrong types fail with one line naming the key (and a "did you mean").

The sections, each key with its type and default, are in :mod:`.sections`; the checks across keys in
:mod:`.validation`. Both are re-exported here, where recipes are loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any

import yaml

from .._yaml import safe_load
from ..shipped import configs_root
from .packing import resolved_packing
from .precision import resolve_precision
from .sections import (  # re-exported: recipes are built, and their sections imported, from here
    SECTIONS,
    ConfigError,
    DataSection,
    EvalSection,
    LoraSection,
    ModelSection,
    OptimSection,
    PoseSection,
    S2AttnSection,
    ScalingSection,
    Section,
    TrainConfig,
    TrainSection,
)
from .validation import (  # re-exported: the choices of each key and the checks across keys
    ATTN,
    CHAT_LOSSES,
    EVAL_MODES,
    EXTRA_TRAINABLE,
    MIXED_PRECISION,
    POSE_CONTENT,
    SCHEDULES,
    validate,
)

CONFIGS_DIR = configs_root() / "train"  # the installed package data (ropescale.configs), or the checkout's

__all__ = [
    "ATTN",
    "CHAT_LOSSES",
    "CONFIGS_DIR",
    "EVAL_MODES",
    "EXTRA_TRAINABLE",
    "MIXED_PRECISION",
    "POSE_CONTENT",
    "SCHEDULES",
    "SECTIONS",
    "Section",
    "ConfigError",
    "DataSection",
    "EvalSection",
    "LoraSection",
    "ModelSection",
    "OptimSection",
    "PoseSection",
    "S2AttnSection",
    "ScalingSection",
    "TrainConfig",
    "TrainSection",
    "apply_overrides",
    "config_from_dict",
    "dump_config",
    "load_config",
    "load_run_config",
    "resolve_recipe",
    "validate",
]


# ------------------------------------------------------------------------------------ loading


def _did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f"; known: {', '.join(known)}"


def _check_type(where: str, value: Any, annotation: Any) -> Any:
    """Coerce YAML values to the annotated type (int → float is fine) or raise ConfigError."""
    text = str(annotation)  # annotations are strings (postponed evaluation); only a few forms are used
    optional = "None" in text
    if value is None:
        if optional or text == "Any":
            return None
        raise ConfigError(f"{where} must not be null")
    base = text.replace(" | None", "").strip()
    if base == "Any":
        return value
    if base == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if base == "float":
        if isinstance(value, str):  # YAML 1.1 reads "2e-5" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if base == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    if base == "list":
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value] if not isinstance(value, str) else [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return value
    if base == "dict":
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return value
    raise AssertionError(f"unhandled annotation {annotation!r}")  # pragma: no cover


def config_from_dict(raw: dict[str, Any], name: str = "run") -> TrainConfig:
    """Validate a recipe dict into a :class:`TrainConfig` (see the module docstring)."""
    if not isinstance(raw, dict):
        raise ConfigError("a training recipe must be a mapping of sections (model, scaling, lora, ...)")
    known = ["name", *SECTIONS]
    sections: dict[str, Section] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"unknown section '{key}'{_did_you_mean(str(key), known)}")
        if key == "name":
            continue
        cls = SECTIONS[key]
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"section '{key}' must be a mapping, got {value!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for k, v in value.items():
            if k not in fields:
                raise ConfigError(f"unknown key '{key}.{k}'{_did_you_mean(str(k), list(fields))}")
            if (key, k, v) == ("train", "mixed_precision", False):
                v = "no"  # YAML reads an unquoted `no` as false
            kwargs[k] = _check_type(f"{key}.{k}", v, fields[k].type)
        sections[key] = cls(**kwargs)
    config = TrainConfig(**sections, name=str(raw.get("name") or name))
    validate(config)
    resolve_precision(config)
    config.data.packing = resolved_packing(config.data)  # config.yaml records what ran
    return config


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["lora.r=16", "optim.lr=1e-4"]`` applied to a recipe dict (values parsed as YAML)."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (raw or {}).items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override must be KEY=VALUE (e.g. lora.r=16), got {item!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if key == "name":
            raw["name"] = value
            continue
        section, dot, sub = key.partition(".")
        if not dot or not sub or "." in sub:
            raise ConfigError(
                f"override key must be SECTION.KEY (e.g. lora.r; a mapping as one value: "
                f"'scaling.params={{attention_factor: 1.07}}'), got {key!r}"
            )
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section '{section}' in override {item!r}{_did_you_mean(section, list(SECTIONS))}"
            )
        target = raw.get(section) or {}
        if not isinstance(target, dict):
            raise ConfigError(f"section '{section}' must be a mapping")
        raw[section] = {**target, sub: value}
    return raw


def resolve_recipe(path_or_name: str | Path) -> Path:
    """A recipe path, or a name under ``configs/train/`` (``smollm2-135m/pose_yarn_x4_cpu``)."""
    path = Path(path_or_name).expanduser()
    if path.is_file():
        return path
    for candidate in (CONFIGS_DIR / f"{path_or_name}.yaml", CONFIGS_DIR / str(path_or_name)):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(str(p.relative_to(CONFIGS_DIR).with_suffix("")) for p in CONFIGS_DIR.rglob("*.yaml")))
    raise ConfigError(f"training recipe '{path_or_name}' not found (a YAML path, or one of: {known or 'none'})")


def load_config(path_or_name: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Read, override and validate a recipe. The run's name defaults to the file's stem."""
    path = resolve_recipe(path_or_name)
    try:
        raw = safe_load(path.read_text(), str(path)) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe '{path}' is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"recipe '{path}' must be a mapping of sections")
    return config_from_dict(apply_overrides(raw, overrides or []), name=path.stem)


def dump_config(config: TrainConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def load_run_config(output_dir: str | Path) -> TrainConfig:
    """The resolved recipe a run wrote to its output folder (``config.yaml``)."""
    path = Path(output_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"'{output_dir}' is not a training run folder (no config.yaml)")
    try:
        raw = safe_load(path.read_text(), str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping of sections (a run's resolved recipe)")
    return config_from_dict(raw, name=raw.get("name") or Path(output_dir).name)
