"""The plan (ropescale/models/plan.py) against a GPU: evaluation prefill and one training step per new recipe.

    python benchmarks/gpu_plan_check.py --output runs/gpu-plan-check      # one H100: under 10 minutes
    python benchmarks/gpu_plan_check.py --smoke                            # CPU, tiny shapes: seconds

Random-init models of the families' real shapes (tests/data/shapes/*/config.json; nothing downloaded),
bf16, SDPA, one process:

* evaluation, Llama-3-8B and Qwen2.5-7B shapes (YaRN to the longest length), at 32k, 64k and 128k:
  ``ppl`` = the decoder with no KV cache, then the loss in chunks of 1024 (ropescale's perplexity path);
  ``gen`` = a prefill into the KV cache (last position's logits only) and 10 cached decoding steps
  (passkey's path). Each cell: ``torch.cuda.max_memory_allocated`` and seconds after one warm-up at 2k;
* training, each new recipe (llama3-8b/yarn_x4, yarn_x8, qwen2.5-7b/yarn_x4, qwen3-8b/yarn_x4,
  mistral-7b-v0.3/yarn_x4) on its family's shape: the trainer's model (scaling, LoRA with trainable
  embeddings/norms, the recipe's checkpointing/tiles/offload, the chunked loss) and one micro-step at the
  recipe's window after a warm-up micro-step and an AdamW step (so the moments are held, as from step 2 on).

Each row prints the plan's estimate beside the measurement and the ratio; ``results.json`` in ``--output``
keeps them (the cells that would calibrate the evaluation part of the plan, docs/plan.md). A cell that runs
out of memory is recorded as such and the run goes on.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ROOT / "tests" / "data" / "shapes"
RECIPES = {
    "llama3-8b/yarn_x4": "llama3-8b",
    "llama3-8b/yarn_x8": "llama3-8b",
    "qwen2.5-7b/yarn_x4": "qwen2.5-7b",
    "qwen3-8b/yarn_x4": "qwen3-8b",
    "mistral-7b-v0.3/yarn_x4": "mistral-7b-v0.3",
}
TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, vocab_size=512)
DECODE = 10


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval-shapes", default="llama3-8b,qwen2.5-7b")
    ap.add_argument("--lengths", default="32768,65536,131072")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--gpu", default="h100-80gb", help="the card the plan's times are for")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes of each family, short lengths")
    ap.add_argument("--output", default="runs/gpu-plan-check")
    return ap.parse_args(argv)


def shape_config(name: str, smoke: bool, target: int | None = None):
    """The family's config (tiny in smoke mode), YaRN-scaled to ``target`` tokens when given."""
    import transformers

    from ropescale.patching.model import patch_config

    raw = json.loads((SHAPES / name / "config.json").read_text())
    if smoke:
        kv = 2 if raw["num_key_value_heads"] < raw["num_attention_heads"] else 4
        raw.update(TINY, num_key_value_heads=kv, head_dim=16)
    config = transformers.AutoConfig.for_model(**raw)
    if target and target > config.max_position_embeddings:
        config = patch_config(config, "yarn", target_length=target)
    return config


def build(config, device: str, dtype):
    import torch
    import transformers

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    return model


class Meter:
    """Peak memory (CUDA: max_memory_allocated; CPU: not measured) and seconds of a block."""

    def __init__(self, device: str):
        import torch

        self.torch, self.cuda = torch, device == "cuda"

    def __enter__(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()
            self.torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0
        self.peak_mib = self.torch.cuda.max_memory_allocated() / 2**20 if self.cuda else float("nan")
        return False


def eval_cells(args, device: str, dtype) -> list[dict]:
    import torch

    from ropescale.models import plan
    from ropescale.scoring.nll import final_hidden_states, summed_nll

    lengths = [int(n) for n in args.lengths.split(",")]
    card = plan.card(args.gpu)
    cells = []
    for name in args.eval_shapes.split(","):
        config = shape_config(name, args.smoke, max(lengths))
        model = build(config, device, dtype).eval()
        shape = plan.Shape.from_config(config)
        vocab = config.vocab_size

        def ppl(model, ids):
            hidden = final_hidden_states(model, ids)
            return summed_nll(hidden, model.lm_head, ids, 1024)

        def gen(model, ids):
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(DECODE):
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            return token

        for mode, run in (("ppl", ppl), ("gen", gen)):
            with torch.no_grad():
                run(model, torch.randint(0, vocab, (1, min(2048, lengths[0])), device=device))  # warm-up
            for length in lengths:
                est = plan.eval_estimate(
                    shape, length, kv_cache=mode == "gen", decode_tokens=DECODE if mode == "gen" else 0, card=card
                )
                cell = {"kind": "eval", "shape": name, "mode": mode, "length": length}
                try:
                    ids = torch.randint(0, vocab, (1, length), device=device)
                    with torch.no_grad(), Meter(device) as m:
                        run(model, ids)
                    cell.update(peak_mib=m.peak_mib, seconds=m.seconds)
                except torch.OutOfMemoryError:
                    cell["error"] = "out of memory"
                cell.update(plan_mib=est.peak_mib(), plan_seconds=est.seconds)
                cells.append(report(cell))
        model = None  # freed before the next shape is built
    return cells


def train_cells(args, device: str, dtype) -> list[dict]:
    import torch

    from ropescale.models import plan
    from ropescale.training.config import load_config
    from ropescale.training.dryrun import build_meta_model, plan_options
    from ropescale.training.modeling import CausalLMLoss, apply_memory_options, scale_model, wrap_lora
    from ropescale.training.optim import build_optimizer

    card = plan.card(args.gpu)
    cells = []
    for recipe_name in args.recipes.split(","):
        family = RECIPES.get(recipe_name) or recipe_name.split("/")[0]
        overrides = [f"model.name={SHAPES / family}"]
        if args.smoke:
            overrides += ["data.seq_len=128", "pose.target_length=null", "train.mlp_tile_tokens=0"]
            overrides += [
                "model.dtype=float32",
                "train.mixed_precision=no",
                "scaling.original_max_position_embeddings=null",
            ]
        recipe = load_config(recipe_name, overrides)
        base_config = shape_config(family, args.smoke)
        meta = build_meta_model(recipe, base_config, "shape")
        shape = plan.Shape.from_config(meta.hf_config)
        est = plan.train_estimate(shape, plan_options(recipe, meta, 1, False), card)
        cell = {"kind": "train", "recipe": recipe_name, "length": recipe.data.seq_len}
        try:
            model = scale_model(build(base_config, device, getattr(torch, recipe.model.dtype)), recipe)
            model.config.use_cache = False
            peft_model = wrap_lora(model, recipe)
            apply_memory_options(peft_model.get_base_model(), recipe)
            module = CausalLMLoss(peft_model, recipe.train.loss_chunk).train()
            optimizer = build_optimizer(peft_model, recipe)
            autocast = recipe.train.mixed_precision == "bf16"

            def step(n: int):
                ids = torch.randint(0, shape.vocab, (1, n), device=device)
                pos = torch.arange(n, device=device)[None]
                with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                    loss = module(ids, pos, ids)
                loss.backward()

            step(recipe.data.seq_len)  # warm-up; then the moments exist, as from step 2 on
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with Meter(device) as m:
                step(recipe.data.seq_len)
            cell.update(peak_mib=m.peak_mib, seconds=m.seconds)
        except torch.OutOfMemoryError:
            cell["error"] = "out of memory"
        cell.update(plan_mib=est.peak_mib(), plan_seconds=est.seconds)
        cells.append(report(cell))
        model = peft_model = module = optimizer = None
    return cells


def report(cell: dict) -> dict:
    what = cell.get("recipe") or f"{cell['shape']} {cell['mode']}"
    if "error" in cell:
        got = cell["error"]
    else:
        ratio = cell["peak_mib"] / cell["plan_mib"] if cell["plan_mib"] else float("nan")
        got = (
            f"peak {cell['peak_mib']:.0f} MiB (plan {cell['plan_mib']:.0f}, measured/plan {ratio:.2f}), "
            f"{cell['seconds']:.2f} s (plan {cell['plan_seconds']:.2f} s)"
        )
    print(f"{cell['kind']:5s} {what:28s} {cell['length']:>7d}: {got}", flush=True)
    return cell


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    if args.smoke:
        device, dtype = "cpu", torch.float32
        args.lengths = "64,128"
    elif torch.cuda.is_available():
        device, dtype = "cuda", torch.bfloat16
    else:
        print("gpu_plan_check: error: no CUDA device (--smoke runs tiny shapes on the CPU)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    cells = [] if args.skip_eval else eval_cells(args, device, dtype)
    cells += [] if args.skip_train else train_cells(args, device, dtype)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    from ropescale._io import atomic_write_json

    meta = {
        "command": "python benchmarks/gpu_plan_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)",
        "torch": torch.__version__,
        "wall_s": time.perf_counter() - t0,
    }
    atomic_write_json(out / "results.json", {**meta, "cells": cells})
    print(f"{len(cells)} cells in {meta['wall_s']:.0f} s on {meta['device']}; {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
