"""Training recipes: a YAML file of sections, validated into dataclasses, with ``key=value`` overrides.

A recipe (``configs/train/<model>/<method>_<setting>.yaml``) has up to nine sections; every key is
optional except ``model.name``, ``scaling.method`` and ``scaling.factor``::

    model:    {name: smollm2-135m, dtype: auto, attn_implementation: auto, shipped_scaling: null}
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
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .._yaml import safe_load
from ..errors import RecipeError, RopescaleError
from ..models.runtime import ATTENTIONS, DTYPES
from ..shipped import configs_root
from .packing import PACKINGS, packing_problem, resolved_packing
from .precision import AUTO, resolve_precision
from .short import short_problem

CONFIGS_DIR = configs_root() / "train"  # the installed package data (ropescale.configs), or the checkout's
SCHEDULES = ("linear", "cosine", "constant")
MIXED_PRECISION = ("no", "bf16", "fp16")
ATTN = ("auto", *ATTENTIONS)
POSE_CONTENT = ("skip", "contiguous")
EXTRA_TRAINABLE = ("embed", "norm")
EVAL_MODES = ("nonoverlap", "yarn", "longlora")
CHAT_LOSSES = ("assistant", "all")


ConfigError = RecipeError  # a training recipe or override is invalid (one-line message)


@dataclass
class ModelSection:
    name: str = ""  # checkpoint dir, .gguf, Hub id or embedded model (see ropescale.from_pretrained)
    dtype: str = AUTO  # dtype of the base weights (auto: see the module docstring)
    attn_implementation: str = "auto"  # auto: flash_attention_2 if installed and on a GPU, else sdpa
    sliding_window: Any = "keep"  # Mistral-style models: keep, null (full attention) or a width
    shipped_scaling: str | None = None  # replace | compose a scaling the checkpoint carries (training/shipped.py)


@dataclass
class ScalingSection:
    method: str = ""
    factor: float = 0.0
    params: dict = field(default_factory=dict)
    original_max_position_embeddings: int | None = None


@dataclass
class LoraSection:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list = field(default_factory=list)  # "embed", "norm": fully trainable (LongLoRA)
    enabled: bool = True  # false: full fine-tune (every weight trains; the other lora keys are unused)


@dataclass
class DataSection:
    source: str = "austen"  # any --data value (corpus name, file, folder, JSONL/Parquet, hub:org/name)
    holdout: Any = field(default_factory=list)  # titles (list) or a count of last documents, kept for eval
    seq_len: int = 2048  # tokens per training window (BOS included)
    bos_each_window: bool = True  # every window starts with BOS, as the perplexity evaluation does
    max_tokens: int | None = None  # stop tokenizing training text after this many tokens
    text_field: str = "text"
    recall_facts: int = 0  # recall sentences written into every window (training/recall.py); 0: none
    recall_forms: list = field(default_factory=lambda: ["digits"])  # their forms (training/recall.py FORMS)
    packing: str = "auto"  # documents: kept apart in a window; stream: one sequence (auto: see training/packing.py)
    chat_loss: str = "assistant"  # chat JSONL (messages): loss on assistant turns only, or on all tokens
    sources: list = field(default_factory=list)  # a weighted mix [{source, weight}, ...] (data/sources.py)
    short_share: float = 0.0  # share of micro-batches cut in pieces <= L at the unscaled rotary (training/short.py)


@dataclass
class PoseSection:
    enabled: bool = False
    target_length: int | None = None  # default: the scaled context (factor x original)
    chunks: int = 2
    content: str = "skip"  # skip: text skips with the positions; contiguous: unbroken text


@dataclass
class S2AttnSection:
    enabled: bool = False
    group_ratio: float = 0.25  # group size = seq_len x ratio (LongLoRA: 1/4)


@dataclass
class OptimSection:
    lr: float = 2e-5
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 20
    schedule: str = "linear"  # linear | cosine | constant (each after a linear warm-up)
    min_lr_ratio: float = 0.0  # floor of linear/cosine decay, as a fraction of lr
    max_grad_norm: float | None = 1.0


@dataclass
class TrainSection:
    max_steps: int = 400  # optimizer steps
    batch_size: int = 1  # windows per device per micro-batch
    grad_accum: int = 1
    mixed_precision: str = AUTO  # auto | no | bf16 | fp16 (autocast; trainable weights stay fp32)
    gradient_checkpointing: bool = True
    seed: int = 0
    output_dir: str = ""  # default: runs/<recipe name>
    save_every: int = 50  # steps between checkpoints (0: only at the end)
    keep_checkpoints: int = 2
    log_every: int = 1
    loss_chunk: int = 1024  # positions per lm_head+loss chunk (full logits are never materialised)
    offload_activations: bool = False  # checkpointed layer inputs in pinned host memory (training/memory.py)
    mlp_tile_tokens: int = 0  # >0: each decoder MLP runs over checkpointed tiles of this many tokens
    context_parallel: int = 1  # >1: the window is sharded over this many ranks (FSDP2; training/parallel.py)


@dataclass
class EvalSection:
    every: int = 0  # steps between perplexity evaluations (0: none during training)
    at_end: bool = False
    length: int | None = None  # default: the target length (pose.target_length or scaled context)
    max_tokens: int | None = None  # tokens of held-out text evaluated (default: one window)
    mode: str = "nonoverlap"
    data: str | None = None  # default: the held-out documents of data.source


SECTIONS = {
    "model": ModelSection,
    "scaling": ScalingSection,
    "lora": LoraSection,
    "data": DataSection,
    "pose": PoseSection,
    "s2attn": S2AttnSection,
    "optim": OptimSection,
    "train": TrainSection,
    "eval": EvalSection,
}


@dataclass
class TrainConfig:
    """A complete, validated recipe. Build with :func:`load_config` or :func:`config_from_dict`."""

    model: ModelSection = field(default_factory=ModelSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    lora: LoraSection = field(default_factory=LoraSection)
    data: DataSection = field(default_factory=DataSection)
    pose: PoseSection = field(default_factory=PoseSection)
    s2attn: S2AttnSection = field(default_factory=S2AttnSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    name: str = "run"

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :func:`config_from_dict` turns back into an equal config."""
        return {"name": self.name, **{s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}}

    @property
    def output_dir(self) -> Path:
        return Path(self.train.output_dir or Path("runs") / self.name).expanduser()

    def global_batch(self, world_size: int = 1) -> int:
        return self.train.batch_size * self.train.grad_accum * world_size


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
    sections: dict[str, Any] = {}
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


def _one_of(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where} must be one of {', '.join(choices)}, got {value!r}")


def _positive(where: str, value: Any, allow_zero: bool = False) -> None:
    if value is None or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{where} must be {'non-negative' if allow_zero else 'positive'}, got {value!r}")


def validate(c: TrainConfig) -> None:
    """Cross-field checks that need no model (the model-dependent ones run in the trainer)."""
    from ..methods import get_method

    if not c.model.name:
        raise ConfigError("model.name is required (a checkpoint directory, Hub id or smollm2-135m)")
    _one_of("model.dtype", c.model.dtype, (AUTO, *DTYPES))
    _one_of("model.attn_implementation", c.model.attn_implementation, ATTN)
    sw = c.model.sliding_window
    if not (sw is None or sw == "keep" or (isinstance(sw, int) and not isinstance(sw, bool) and sw > 0)):
        raise ConfigError(f"model.sliding_window must be keep, null (full attention) or a positive integer, got {sw!r}")
    if c.model.shipped_scaling is not None:
        from .shipped import SHIPPED

        _one_of("model.shipped_scaling", c.model.shipped_scaling, SHIPPED)
    if not c.scaling.method:
        raise ConfigError("scaling.method is required (see `ropescale methods`)")
    if c.scaling.method == "none":  # the control of an extension experiment: same text, no scaling
        if c.pose.enabled and c.pose.target_length is None:
            raise ConfigError(
                "scaling.method=none with pose.enabled=true needs pose.target_length within the trained context "
                "(an unscaled model cannot be trained at positions beyond it)"
            )
    try:
        get_method(c.scaling.method, factor=c.scaling.factor, **c.scaling.params)
    except (ValueError, TypeError, RopescaleError) as exc:
        raise ConfigError(f"scaling: {' '.join(str(exc).split())}") from None
    if c.scaling.original_max_position_embeddings is not None:
        _positive("scaling.original_max_position_embeddings", c.scaling.original_max_position_embeddings)
    _positive("lora.r", c.lora.r)
    _positive("lora.alpha", c.lora.alpha)
    if not 0 <= c.lora.dropout < 1:
        raise ConfigError(f"lora.dropout must be in [0, 1), got {c.lora.dropout!r}")
    if not c.lora.target_modules or not all(isinstance(m, str) and m for m in c.lora.target_modules):
        raise ConfigError("lora.target_modules must be a non-empty list of module names (e.g. q_proj, v_proj)")
    for t in c.lora.trainable:
        if t not in EXTRA_TRAINABLE:
            raise ConfigError(f"lora.trainable entries must be among {', '.join(EXTRA_TRAINABLE)}, got {t!r}")
    if isinstance(c.data.holdout, bool) or not isinstance(c.data.holdout, (int, list)):
        raise ConfigError(
            f"data.holdout must be a list of document titles or a number of documents, got {c.data.holdout!r}"
        )
    if isinstance(c.data.holdout, int):
        _positive("data.holdout", c.data.holdout, allow_zero=True)
    if c.data.seq_len < 2:
        raise ConfigError(f"data.seq_len must be at least 2, got {c.data.seq_len}")
    if c.data.max_tokens is not None:
        _positive("data.max_tokens", c.data.max_tokens)
    _positive("data.recall_facts", c.data.recall_facts, allow_zero=True)
    from .recall import FORMS

    forms = c.data.recall_forms
    if not isinstance(forms, list) or not forms or any(f not in FORMS for f in forms):
        raise ConfigError(f"data.recall_forms must be a non-empty list of {', '.join(FORMS)}; got {forms!r}")
    _one_of("data.packing", c.data.packing, PACKINGS)
    _one_of("data.chat_loss", c.data.chat_loss, CHAT_LOSSES)
    if c.data.sources:
        from ..data.sources import parse_sources

        parse_sources(c.data.sources)  # one line naming the entry that is wrong
        if isinstance(c.data.holdout, int) and c.data.holdout:
            raise ConfigError("with data.sources, data.holdout must list document titles (a count names no source)")
    problem = packing_problem(c) or short_problem(c)
    if problem:
        raise ConfigError(problem)
    if c.data.recall_facts and c.data.seq_len < 128 * c.data.recall_facts:
        raise ConfigError(f"data.recall_facts={c.data.recall_facts} needs data.seq_len >= {128 * c.data.recall_facts}")
    if c.pose.enabled:
        _positive("pose.chunks", c.pose.chunks)
        if c.pose.chunks > c.data.seq_len:
            raise ConfigError(f"pose.chunks ({c.pose.chunks}) cannot exceed data.seq_len ({c.data.seq_len})")
        _one_of("pose.content", c.pose.content, POSE_CONTENT)
        if c.pose.target_length is not None and c.pose.target_length < c.data.seq_len:
            raise ConfigError(
                f"pose.target_length ({c.pose.target_length}) must be at least data.seq_len ({c.data.seq_len})"
            )
    if c.s2attn.enabled:
        ratio = c.s2attn.group_ratio
        if not 0 < ratio <= 1:
            raise ConfigError(f"s2attn.group_ratio must be in (0, 1], got {ratio!r}")
        group = c.data.seq_len * ratio
        if not float(group).is_integer() or c.data.seq_len % int(group) or (ratio < 1 and int(group) % 2):
            raise ConfigError(
                f"s2attn: data.seq_len {c.data.seq_len} x group_ratio {ratio:g} must give an even group size "
                "that divides the sequence"
            )
    _positive("optim.lr", c.optim.lr)
    if len(c.optim.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in c.optim.betas):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {c.optim.betas!r}")
    _positive("optim.eps", c.optim.eps)
    _positive("optim.weight_decay", c.optim.weight_decay, allow_zero=True)
    _positive("optim.warmup_steps", c.optim.warmup_steps, allow_zero=True)
    _one_of("optim.schedule", c.optim.schedule, SCHEDULES)
    if not 0 <= c.optim.min_lr_ratio <= 1:
        raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {c.optim.min_lr_ratio!r}")
    if c.optim.max_grad_norm is not None:
        _positive("optim.max_grad_norm", c.optim.max_grad_norm)
    for key in ("max_steps", "batch_size", "grad_accum", "keep_checkpoints", "log_every", "loss_chunk"):
        _positive(f"train.{key}", getattr(c.train, key))
    _positive("train.save_every", c.train.save_every, allow_zero=True)
    _positive("train.mlp_tile_tokens", c.train.mlp_tile_tokens, allow_zero=True)
    if c.train.offload_activations and not c.train.gradient_checkpointing:
        raise ConfigError("train.offload_activations needs train.gradient_checkpointing=true (it offloads its inputs)")
    from .parallel import context_parallel_problem

    problem = context_parallel_problem(c)
    if problem:
        raise ConfigError(problem)
    _one_of("train.mixed_precision", c.train.mixed_precision, (AUTO, *MIXED_PRECISION))
    _positive("eval.every", c.eval.every, allow_zero=True)
    _one_of("eval.mode", c.eval.mode, EVAL_MODES)
    for key in ("length", "max_tokens"):
        if getattr(c.eval, key) is not None:
            _positive(f"eval.{key}", getattr(c.eval, key))


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
