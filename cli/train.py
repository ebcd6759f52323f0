"""``ropescale train`` (LoRA fine-tuning recipes) and ``ropescale export`` (merge a run)."""

from __future__ import annotations

import argparse

from ropescale.cli.command import Command

TRAIN_EXAMPLES = """examples:
  ropescale train --config smollm2-135m/pose_yarn_x4_cpu                 # CPU smoke recipe (minutes)
  ropescale train --config configs/train/llama2-7b/yarn_x16.yaml model.name=./Llama-2-7b-hf
  ropescale train --config smollm2-135m/pose_yarn_x4_cpu lora.r=16 optim.lr=1e-4 train.max_steps=60
  ropescale train --config smollm2-135m/pose_yarn_x4_cpu --resume        # continue after an interruption
  ropescale train --config smollm2-135m/pose_yarn_x4_cpu --resume train.max_steps=80   # train longer
  ropescale train --config llama2-7b/pi_x4_longlora --dry-run           # validate and print the recipe
  ropescale train --config llama3-8b/yarn_x8 --model ./Meta-Llama-3-8B --dry-run --gpu a100-80gb --gpus 8
                                                # what it trains, and the plan: memory per GPU, time (docs/plan.md)
  accelerate launch --config_file configs/accelerate/ddp.yaml -m ropescale.cli.main train --config ...
  ropescale train --config llama2-7b/yarn_x16_cp --dry-run --accelerate-config configs/accelerate/fsdp2_cp.yaml

recipes: a YAML path, or a name under configs/train/ (see docs/finetuning.md)
"""

EXPORT_EXAMPLES = """examples:
  ropescale export runs/pose_yarn_x4_cpu --output smollm2-yarn4-pose
  ropescale export runs/yarn_x16 --checkpoint step-00000200 --output llama2-yarn16 --dtype bfloat16
"""


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="RECIPE", help="recipe YAML path or name under configs/train/")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides anywhere on the line, e.g. lora.r=16"
    )
    p.add_argument("--output-dir", default=None, metavar="DIR", help="shortcut for train.output_dir=DIR")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the output folder")
    p.add_argument(
        "--overwrite", action="store_true", help="discard checkpoints of an earlier run in the output folder"
    )
    p.add_argument("--merge", action="store_true", help="after training, write the merged model to OUTPUT_DIR/merged")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the recipe and print what it does: full fine-tune or LoRA, trainable parameters (counted on "
        "the model built from its config.json on the meta device: no weights), tokens per step, the scaling written, "
        "and the plan (peak memory per GPU, time per step); loads no weights, writes nothing",
    )
    p.add_argument("--model", default=None, metavar="PATH", help="shortcut for model.name=PATH (a folder or Hub id)")
    p.add_argument(
        "--gpu",
        default=None,
        metavar="CARD",
        help="with --dry-run: the card the plan is for (h100-80gb, h200-141gb, a100-80gb, a100-40gb, l40s-48gb, "
        "rtx4090-24gb; default h100-80gb)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="with --dry-run: GPUs of the launch (default: num_processes of --accelerate-config, else 1)",
    )
    p.add_argument(
        "--accelerate-config",
        default=None,
        metavar="FILE",
        help="with --dry-run: check that this accelerate config fits the recipe (FSDP2 and process count for "
        "train.context_parallel)",
    )
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (metrics.jsonl still records every step)"
    )
    p.parse_known_args = _overrides_anywhere(p.parse_known_args)


def add_export_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("run", metavar="RUN_DIR", help="the training output folder (train.output_dir)")
    e.add_argument("--output", required=True, metavar="DIR", help="where to write the merged checkpoint")
    e.add_argument("--checkpoint", default=None, help="step-N or N (default: the newest checkpoint)")
    e.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the base weights the LoRA update is merged into (default float32)",
    )
    e.add_argument("--overwrite", action="store_true", help="replace a non-empty --output directory")


def _overrides_anywhere(parse_known_args):
    """Wrap a parser's ``parse_known_args`` so ``KEY=VALUE`` words after a flag (``--resume
    train.max_steps=600``) join the overrides: argparse fills the positional list once, at its first
    position, and would call the later ones unrecognized."""

    def parse(args=None, namespace=None):
        ns, extra = parse_known_args(args, namespace)
        late = [a for a in extra if "=" in a and not a.startswith("-")]
        if late:
            ns.overrides = [*(getattr(ns, "overrides", None) or []), *late]
        return ns, [a for a in extra if a not in late]

    return parse


def _memory_line(t) -> str:
    parts = [f"activation checkpointing {'on' if t.gradient_checkpointing else 'off'}"]
    if t.offload_activations:
        parts.append("offloaded to host memory")
    if t.mlp_tile_tokens:
        parts.append(f"MLP in tiles of {t.mlp_tile_tokens} tokens")
    parts.append(f"loss in chunks of {t.loss_chunk}")
    if t.context_parallel > 1:
        parts.append(f"context parallel over {t.context_parallel} ranks (FSDP2)")
    return "memory:        " + ", ".join(parts)


def _summary(config) -> str:
    c = config
    target = c.pose.target_length or "factor x original context"
    lines = [
        f"recipe:        {c.name}",
        f"model:         {c.model.name} ({c.model.dtype}, attention {c.model.attn_implementation})",
        f"scaling:       {c.scaling.method} x{c.scaling.factor:g}"
        + (f" {c.scaling.params}" if c.scaling.params else ""),
        f"windows:       {c.data.seq_len} tokens from {_data_from(c.data)}"
        + (
            f" (PoSE: {c.pose.chunks} chunks, positions up to {target}, content {c.pose.content})"
            if c.pose.enabled
            else ""
        ),
        "attention:     " + (f"S2-Attn, groups of {c.s2attn.group_ratio:g} x window" if c.s2attn.enabled else "full"),
        f"optimizer:     AdamW lr {c.optim.lr:g} betas {tuple(c.optim.betas)} wd {c.optim.weight_decay:g}, "
        f"{c.optim.warmup_steps} warm-up steps, {c.optim.schedule}",
        f"steps:         {c.train.max_steps} x {c.train.batch_size} x {c.train.grad_accum} accumulation per device "
        f"({c.train.batch_size * c.train.grad_accum * c.data.seq_len // c.train.context_parallel} tokens per device "
        "per step" + (f": 1/{c.train.context_parallel} of each window" if c.train.context_parallel > 1 else "") + "), "
        f"precision {c.train.mixed_precision}" + (", torch.compile of each decoder layer" if c.train.compile else ""),
        _memory_line(c.train),
        f"output:        {c.output_dir}",
    ]
    return "\n".join(lines)


def run_train(args: argparse.Namespace) -> int:
    from ropescale.training.config import dump_config, load_config

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    if args.model:
        overrides.append(f"model.name={args.model}")
    if (args.gpu or args.gpus) and not args.dry_run:
        from ropescale.errors import RopescaleError

        raise RopescaleError("--gpu and --gpus plan a run (--dry-run); a launch's GPUs come from accelerate")
    config = load_config(args.config, overrides)
    if args.dry_run:
        from ropescale.models.plan import card
        from ropescale.patching.plan import sliding_window_setting
        from ropescale.training.dryrun import dry_run_lines, launch_of
        from ropescale.training.preflight import SLIDING_WINDOW_KEY

        args.gpu = args.gpu or "h100-80gb"
        card(args.gpu)  # an unknown card is refused before anything is printed
        gpus, fsdp = launch_of(args.accelerate_config, args.gpus, config.train.context_parallel)
        print(_summary(config))
        if args.accelerate_config:
            from ropescale.training.parallel import check_accelerate_config

            print("\n".join(check_accelerate_config(args.accelerate_config, config)))
        with sliding_window_setting(SLIDING_WINDOW_KEY):
            print("\n".join(dry_run_lines(config, gpu=args.gpu, gpus=gpus, fsdp=fsdp)))
        print("\n".join(_preflight_lines(config, gpus)))
        print("---")
        print(dump_config(config), end="")
        return 0
    import os

    from ropescale._lock import output_lock
    from ropescale.data.documents import check_text_source

    for source in _local_sources(config.data):  # a binary data file is refused before any weights load
        check_text_source(source)
    if args.merge:  # --merge replaces <run>/merged at the end: never the model or data this run reads
        from ropescale._lock import refuse_overwriting_inputs

        inputs = {"model": config.model.name}
        inputs.update({f"data {i}" if i else "data": s for i, s in enumerate(_local_sources(config.data))})
        refuse_overwriting_inputs(config.output_dir / "merged", inputs, flag="merged model", by="--merge")

    # one writer per run folder: the main process of a launch holds the lock, a second launch stops
    with output_lock(config.output_dir, "run folder", enabled=os.environ.get("RANK", "0") == "0"):
        return _train(args, config)


def _train(args: argparse.Namespace, config) -> int:
    from ropescale.training.trainer import Trainer

    trainer = Trainer(config, progress=not args.no_progress)
    result = trainer.train(resume=args.resume, overwrite=args.overwrite)
    if trainer.accelerator.is_main_process:
        losses = result.losses
        if not losses:  # a --resume of a finished run: no step was taken in this session
            print(
                f"{config.name} is already trained to step {result.step} (train.max_steps); nothing to do: raise "
                f"train.max_steps to train longer; checkpoints and adapter in {result.output_dir}"
            )
        else:
            print(
                f"trained {config.name} to step {result.step}, loss {losses[0]:.4f} -> {losses[-1]:.4f} in "
                f"{result.seconds:.0f} s; checkpoints and adapter in {result.output_dir}"
            )
        for record in result.evals:
            if record:
                print(f"perplexity at {record['eval_length']} tokens: {record['eval_ppl']:.3f}")
        from ropescale.training.convergence import convergence_line

        said = convergence_line(result.output_dir)  # the whole log's last two points, resumed sittings included
        if said:
            print(said)
    if args.merge:
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            from ropescale.cli.doctor import print_saved, saving_quietly
            from ropescale.training.export import export

            with saving_quietly():
                out = export(config.output_dir, config.output_dir / "merged", overwrite=True)
            print(f"wrote merged model to {out}")
            print_saved(out)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ropescale._lock import output_lock
    from ropescale.cli.common import check_output_dir
    from ropescale.cli.doctor import print_saved, saving_quietly
    from ropescale.training.export import export

    inputs = _export_inputs(args.run)
    check_output_dir(args.output, args.overwrite, inputs)  # a clear line for an unwritable output, before the lock
    with output_lock(args.output), saving_quietly():
        out = check_output_dir(args.output, args.overwrite, inputs)
        path = export(args.run, out, checkpoint=args.checkpoint, dtype=args.dtype, overwrite=args.overwrite)
    print(f"wrote merged model to {path}")
    print_saved(path)
    return 0


def _preflight_lines(config, gpus: int) -> list[str]:
    """The run's preflight (ropescale/training/preflight.py), as the dry run prints it: what each check
    read and found; a check the run would fail stops the dry run with its line (exit 2)."""
    from ropescale.training.preflight import PREFIX, Preflight, model_inputs, run_preflight

    tokenizer, why, hf_config = model_inputs(config, dry_run=True)
    lines = run_preflight(Preflight(config, tokenizer, why, hf_config, dry_run=True, gpus=gpus))
    return [(PREFIX if i == 0 else " " * len(PREFIX)) + line for i, line in enumerate(lines)]


def _data_from(data) -> str:
    """Where the windows come from, as the dry run says it: the source or the mix, and the packing."""
    from ropescale.data.sources import parse_sources

    if data.sources:
        total = sum(s.weight for s in parse_sources(data.sources))
        where = ", ".join(f"{s.label} {s.weight / total:.0%}" for s in parse_sources(data.sources))
    else:
        where = data.source
    return f"{where}, {data.packing} packing" + (f", {data.short_share:.0%} short" if data.short_share else "")


def _local_sources(data) -> list[str]:
    from ropescale.data.sources import local_sources

    return local_sources(data)


def _export_inputs(run: str) -> dict[str, object]:
    """What ``train export --overwrite`` must never delete: the run's checkpoints and recipe, its base model."""
    from pathlib import Path

    inputs: dict[str, object] = {"checkpoints": Path(run) / "checkpoints", "run recipe": Path(run) / "config.yaml"}
    try:
        from ropescale.training.config import load_run_config

        inputs["base model"] = load_run_config(run).model.name
    except Exception:  # noqa: BLE001 - an unreadable run is reported by the export itself, with its file
        pass
    return inputs


TRAIN = Command(
    "train",
    help="fine-tune a scaled model with LoRA from a recipe (YaRN/PI, PoSE, S2-Attn)",
    description="Fine-tune a RoPE-scaled model with LoRA from a YAML recipe. Checkpoints are written "
    "atomically to train.output_dir; --resume continues from the newest one.",
    add_arguments=add_train_arguments,
    run=run_train,
    epilog=TRAIN_EXAMPLES,
    raw=True,
)
EXPORT = Command(
    "export",
    help="merge a training run's LoRA weights into a checkpoint that carries the scaling",
    description="Merge the LoRA (and trainable embedding/norm) weights of a training run into the base "
    "model and save it with its RoPE scaling; native methods load in plain transformers.",
    add_arguments=add_export_arguments,
    run=run_export,
    epilog=EXPORT_EXAMPLES,
    raw=True,
)
