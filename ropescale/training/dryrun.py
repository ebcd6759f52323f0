"""``ropescale train --dry-run``: what a recipe really does, from the model's config alone.

The model is built on PyTorch's ``meta`` device from its ``config.json`` (a local folder, a cached Hub
config, or the converted embedded model): parameters have shapes and no storage, so a 70B model costs
nothing. The recipe's scaling is planned on that config exactly as training plans it, LoRA is applied by
peft exactly as :func:`ropescale.training.modeling.wrap_lora` applies it, and the trainable parameters
are counted on the result. The memory and time plan (:mod:`ropescale.models.plan`) reads the same
shape. No weights are read and nothing is written; a Hub id is read from the cache (online, transformers
may fetch its config.json, never the weights).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RopescaleError
from ..models import plan as planner
from ..models.config_conflicts import ConfigError
from .config import TrainConfig


@dataclass
class MetaModel:
    """A recipe's model built on the meta device, with what the dry run reports about it."""

    source: str  # where the config came from
    hf_config: Any  # the scaled config
    trainable: int
    total: int
    original_context: int
    extended_context: int
    rope: dict
    shipped: str = ""  # what the recipe does with a scaling the checkpoint carries (training/shipped.py)


def config_source(name: str) -> tuple[Any, str]:
    """``(transformers config, where it came from)`` without reading weights or converting anything.

    Raises:
        RopescaleError: no config could be read (the reason in one line).
    """
    from ..models.embedded import EMBEDDED_MODELS
    from ..models.loading import load_config

    if name in EMBEDDED_MODELS:
        from .._io import cache_root

        folder = cache_root() / "models" / name
        if not (folder / "config.json").is_file():
            raise RopescaleError(
                f"the embedded model '{name}' is not converted yet (the first command that loads it converts it "
                "once); or give --model PATH, a folder with config.json"
            )
        return load_config(folder), str(folder / "config.json")
    path = Path(name).expanduser()
    if path.is_dir():
        return load_config(path), str(path / "config.json")
    try:
        return load_config(name), f"{name} (cached Hub config)"
    except ConfigError:
        raise  # a config that was read and is wrong is an error, not a missing config
    except RopescaleError as exc:
        raise RopescaleError(
            f"no config for '{name}' here ({exc}); give --model PATH, a folder with its config.json"
        ) from None


def _original_context(hf_config: Any) -> int:
    from ..patching.plan import provenance

    block = provenance(hf_config) or {}
    return int(block.get("original_max_position_embeddings") or hf_config.max_position_embeddings)


def build_meta_model(config: TrainConfig, hf_config: Any, source: str = "") -> MetaModel:
    """Scale ``hf_config`` as the recipe says, build it on the meta device, wrap it as training does and
    count what trains.

    Raises:
        RopescaleError: the scaling, a LoRA target or a length does not fit this model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from ..models.loading import buildable_config
    from ..patching.model import patch_config
    from ..patching.plan import check_supported, quiet_transformers
    from .modeling import check_lengths, recipe_scaling, wrap_lora
    from .shipped import shipped_scaling_line

    check_supported(hf_config)
    shipped = shipped_scaling_line(config, hf_config, source or "config.json")
    scaling = recipe_scaling(config, hf_config)  # the scaling the run puts on this model, as it does
    try:
        scaled = patch_config(hf_config, scaling)
    except (ValueError, TypeError) as exc:
        raise RopescaleError(f"scaling: {' '.join(str(exc).split())}") from None
    check_lengths(_ConfigOnly(scaled), config)
    build = buildable_config(scaled)
    with quiet_transformers(), warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(build)
    total = sum(p.numel() for p in model.parameters())
    wrapped = wrap_lora(model, config)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    rope = dict(getattr(scaled, "rope_parameters", None) or {})
    return MetaModel(
        source=source,
        hf_config=scaled,
        trainable=trainable,
        total=total,
        original_context=_original_context(scaled),
        extended_context=int(scaled.max_position_embeddings),
        rope=rope,
        shipped=shipped,
    )


class _ConfigOnly:
    """What :func:`ropescale.training.modeling.check_lengths` reads of a model: its config."""

    def __init__(self, config: Any):
        self.config = config


def training_line(config: TrainConfig) -> str:
    """Full fine-tune or LoRA, as the trainer will run it."""
    lc = config.lora
    if not lc.enabled:
        return "training:      full fine-tune: every weight trains (fp32 master weights; lora.* unused)"
    extra = f" + fully trainable {','.join(lc.trainable)}" if lc.trainable else ""
    return f"training:      LoRA r={lc.r} alpha={lc.alpha:g} dropout={lc.dropout:g} on {','.join(lc.target_modules)}{extra}"


def tokens_line(config: TrainConfig, gpus: int) -> str:
    c = config
    dp = max(gpus // max(c.train.context_parallel, 1), 1)
    per_step = c.train.batch_size * c.train.grad_accum * dp * c.data.seq_len
    pose = f" (PoSE: positions spread over {c.pose.target_length or 'the scaled context'})" if c.pose.enabled else ""
    return (
        f"tokens/step:   {c.data.seq_len:,} a window{pose} x {c.train.batch_size} x {c.train.grad_accum} accumulation "
        f"x {dp} data-parallel GPU{'s' if dp > 1 else ''} = {per_step:,} per optimizer step; "
        f"{per_step * c.train.max_steps:,} in {c.train.max_steps} steps"
    )


def describe_model(meta: MetaModel, config: TrainConfig) -> list[str]:
    rope = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(meta.rope.items()))
    share = 100 * meta.trainable / meta.total if meta.total else 0.0
    return [
        f"model config:  {meta.source} (built on the meta device: no weights read)",
        f"trainable:     {meta.trainable:,} of {meta.total:,} parameters ({share:.2f} %)",
        f"written:       {config.scaling.method} x{config.scaling.factor:g}: {meta.original_context:,} -> "
        f"{meta.extended_context:,} tokens; config.json gets rope_parameters {{{rope}}}",
        *([meta.shipped] if meta.shipped else []),
    ]


def plan_options(config: TrainConfig, meta: MetaModel, gpus: int, fsdp: bool) -> planner.Options:
    t = config.train
    spans = [getattr(meta.hf_config, "sliding_window", None) or 0]
    if config.s2attn.enabled:
        spans.append(int(config.data.seq_len * config.s2attn.group_ratio))
    span = min([s for s in spans if s > 0], default=None)
    return planner.Options(
        tokens=config.data.seq_len * t.batch_size,
        trainable=meta.trainable,
        full=not config.lora.enabled,
        weight_dtype=config.model.dtype,
        autocast=t.mixed_precision in ("bf16", "fp16"),
        checkpointing=t.gradient_checkpointing,
        offload=t.offload_activations,
        tile=t.mlp_tile_tokens,
        loss_chunk=t.loss_chunk,
        context_parallel=t.context_parallel,
        gpus=gpus,
        fsdp=fsdp or t.context_parallel > 1,
        attention_span=span,
        window=config.data.seq_len,
    )


def plan_lines(config: TrainConfig, meta: MetaModel, card: planner.Card, gpus: int, fsdp: bool) -> list[str]:
    """The plan: peak memory per GPU, time per step and for the run, and what to turn on if it does not fit."""
    shape = planner.Shape.from_config(meta.hf_config)
    options = plan_options(config, meta, gpus, fsdp)
    est = planner.train_estimate(shape, options, card)
    t = config.train
    dp = max(gpus // max(t.context_parallel, 1), 1)
    step = est.seconds * t.grad_accum
    parts = ", ".join(f"{k} {v / planner.GIB:.1f}" for k, v in est.parts.items() if v)
    verdict = "fits" if planner.fits(est, card) else "does NOT fit"
    lines = [
        f"plan:          {card.label} x {gpus} ({'FSDP' if options.fsdp else 'data parallel'}"
        + (f", context parallel {t.context_parallel}" if t.context_parallel > 1 else "")
        + f"), {'bf16 autocast' if options.autocast else 'fp32'}, estimates (ropescale/models/plan.py)",
        f"  memory:      {planner.gib(est.peak)} peak per GPU of {card.memory_mib / 1024:.1f} GiB: {verdict} "
        f"(GiB: {parts}; +{planner.RESERVE_MIB / 1024:.0f} GiB kept for CUDA)",
        f"  time:        {planner.duration(est.seconds)} per micro-step ({est.tokens:,} tokens a GPU), "
        f"{planner.duration(step)} per optimizer step, {planner.duration(step * t.max_steps)} for "
        f"{t.max_steps} steps on {dp * max(t.context_parallel, 1)} GPU{'s' if gpus > 1 else ''}",
    ]
    if options.offload and options.checkpointing:  # pinned host memory the offloaded layer inputs take
        host = shape.layers * est.tokens * shape.hidden * (2 if options.autocast else 4)
        lines.append(
            f"  host memory: {planner.gib(host)} pinned per GPU for the offloaded layer inputs "
            f"({planner.gib(host * gpus)} for {gpus} GPU{'s' if gpus > 1 else ''})"
        )
    outside = planner.outside_calibration(options)
    if outside:
        lines.append(f"  calibration: {outside}")
    lines += eval_lines(config, meta, shape, est, card)
    tips = planner.advice(shape, options, card)
    if config.data.packing == "documents":  # context parallelism is causal only: documents cannot stay apart
        cp = next((i for i, tip in enumerate(tips) if tip.startswith("train.context_parallel=")), None)
        if cp is not None:
            tips.insert(cp, "data.packing=stream")
    if tips:
        lines.append("  to fit:      " + "; then ".join(tips))
    return lines


def convergence_plan(windows: int) -> str:
    """What the run's last line can say of its held-out curve with ``windows`` windows a point
    (ropescale/training/convergence.py: the last change's paired 95 % t interval)."""
    four = "4 windows (eval.max_tokens = 4 x eval.length)"
    if windows >= 4:
        return f"{windows} windows a point: the run's last line says whether the held-out curve levelled off"
    if windows == 1:
        return (
            "1 window a point: the run's last line judges the held-out curve by its perplexity alone (a drop "
            f"of more than 0.5 % is a fall); {four} give it a paired interval"
        )
    return (
        f"{windows} windows a point: the interval of the held-out curve's last change is wide (Student's t at "
        f"{windows - 1} degree{'s' if windows > 2 else ''} of freedom), so the run's last line will rarely call "
        f"it flat; {four} make it worth having"
    )


def eval_lines(config: TrainConfig, meta: MetaModel, shape: planner.Shape, train: planner.Estimate, card) -> list[str]:
    """The evaluation during training: one perplexity window of ``eval.length`` in the training process,
    which still holds the weights, gradients and optimizer state (its activations replace the step's)."""
    e = config.eval
    if not (e.every or e.at_end):
        return []
    length = e.length or config.pose.target_length or meta.extended_context
    window = planner.eval_estimate(shape, length, config.model.dtype, kv_cache=False, card=card)
    held = sum(v for k, v in train.parts.items() if k in ("weights", "gradients", "optimizer", "gathered layer"))
    peak = held + window.peak - window.parts["weights"]
    verdict = "fits" if peak + planner.RESERVE_MIB * planner.MIB <= card.memory_mib * planner.MIB else "does NOT fit"
    when = f"every {e.every} steps" if e.every else "at the end"
    lines = [
        f"  evaluation:  perplexity at {length:,} tokens {when}: {planner.gib(peak)} peak per GPU, {verdict}; "
        f"{planner.duration(window.seconds)} a window"
    ]
    windows = e.max_tokens // length if e.max_tokens and e.mode == "nonoverlap" else None
    if e.every and windows:  # the run's last line judges the held-out curve from these windows' pairs
        lines.append("               " + convergence_plan(windows))
    return lines


def dry_run_lines(
    config: TrainConfig, gpu: str = "h100-80gb", gpus: int = 1, fsdp: bool = False, hf_config: Any = None
) -> list[str]:
    """Every line the dry run prints after the recipe summary (or one saying why the model part is missing)."""
    card = planner.card(gpu)
    try:
        source = "the given config"
        if hf_config is None:
            hf_config, source = config_source(config.model.name)
    except ConfigError:
        raise  # read and wrong: the plan of another model (transformers' defaults) would look plausible
    except RopescaleError as exc:
        return [
            training_line(config),
            tokens_line(config, gpus),
            f"model config:  not read, so no parameter count and no plan: {exc}",
        ]
    meta = build_meta_model(config, hf_config, source)
    return [
        training_line(config),
        *describe_model(meta, config),
        tokens_line(config, gpus),
        *plan_lines(config, meta, card, gpus, fsdp),
    ]


def launch_of(accelerate_config: str | None, gpus: int | None, context_parallel: int = 1) -> tuple[int, bool]:
    """``(GPUs, FSDP?)`` of a launch: ``--gpus``, else the accelerate config's ``num_processes``, else 1.

    Raises:
        RopescaleError: a count the launch itself would refuse (context-parallel groups that do not
            tile it: :func:`ropescale.training.parallel.check_processes`, the launch's own check).
    """
    fsdp, procs = False, 1
    if accelerate_config:
        import yaml

        path = Path(accelerate_config)
        if not path.is_file():
            raise RopescaleError(f"accelerate config '{path}' not found")
        data = yaml.safe_load(path.read_text()) or {}
        fsdp = data.get("distributed_type") == "FSDP"
        procs = int(data.get("num_processes", 1) or 1)
    if gpus is not None and gpus < 1:
        raise RopescaleError(f"--gpus must be a positive integer, got {gpus}")
    if not gpus and not accelerate_config and context_parallel > 1:
        # nothing says the launch: plan the fewest GPUs it accepts, one context-parallel group under FSDP2
        # (configs/accelerate/fsdp2_cp*.yaml); --gpus N plans another layout, checked below
        return context_parallel, True
    from .parallel import check_processes

    given = (
        f"--gpus {gpus}"
        if gpus
        else f"num_processes of {accelerate_config}"
        if accelerate_config
        else "no --gpus: one GPU"
    )
    check_processes(gpus or procs, context_parallel, given)
    return (gpus or procs), fsdp
