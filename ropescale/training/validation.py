"""Recipe checks across keys, which need no model: each wrong value stops with one line naming the key.

:func:`ropescale.training.config.config_from_dict` runs :func:`validate` after every value has its
type; the checks that need the model's config or the data (lengths, tokenizer, the held-out text) run
in :mod:`.preflight` before the weights load. The choices each key allows are named here.
"""

from __future__ import annotations

from typing import Any

from ..errors import RopescaleError
from ..models.runtime import ATTENTIONS, DTYPES
from ..scoring.nll import HEAD_LOSSES
from .packing import PACKINGS, packing_problem
from .precision import AUTO
from .sections import ConfigError, TrainConfig
from .short import short_problem

SCHEDULES = ("linear", "cosine", "constant")
MIXED_PRECISION = ("no", "bf16", "fp16")
ATTN = ("auto", *ATTENTIONS)
POSE_CONTENT = ("skip", "contiguous")
EXTRA_TRAINABLE = ("embed", "norm")
EVAL_MODES = ("nonoverlap", "yarn", "longlora")
CHAT_LOSSES = ("assistant", "all")


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
    sc = c.model.shipped_context
    if sc is not None and (isinstance(sc, bool) or not isinstance(sc, int) or sc <= 0):
        raise ConfigError(f"model.shipped_context must be a positive token count such as 131072, got {sc!r}")
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
    _one_of("train.head_loss", c.train.head_loss, HEAD_LOSSES)
    _positive("eval.every", c.eval.every, allow_zero=True)
    _one_of("eval.mode", c.eval.mode, EVAL_MODES)
    for key in ("length", "max_tokens"):
        if getattr(c.eval, key) is not None:
            _positive(f"eval.{key}", getattr(c.eval, key))
