"""float32 against bfloat16 on this CPU, side by side in one run: evaluation forward passes and
training steps, with the quality difference measured on the same inputs.

    python benchmarks/bench_dtype.py                                  # 4k/16k/32k forward, LoRA + full steps
    python benchmarks/bench_dtype.py --lengths 4096 --steps 3 --threads 1

With each forward length it also times one layer's causal SDPA and MLP up projection alone in both
dtypes (random inputs of the model's shapes), so a small speed-up says which part does not gain
(on a CPU with AVX512-BF16 but no AMX, attention).

Forward: the embedded SmolLM2-135M-Instruct with YaRN x4, loaded once in each dtype; one window of
held-out Emma (BOS + text) per length; the two dtypes run alternately (``--repeats`` each) and the
median time is kept; the perplexity of that window is reported for both, so the speed-up and what it
costs come from the same forward passes.

Training: the recipes' own paths through :class:`ropescale.training.trainer.Trainer` (forward,
backward through the chunked loss, AdamW step): LoRA (``smollm2-135m/pose_yarn_x4_cpu``) and the full
fine-tune (``smollm2-135m/yarn_x4``), each in fp32 (``model.dtype=float32 train.mixed_precision=no``)
and as ``auto`` resolves it here, on ``--seq-len``-token windows; the variants take turns step by step
after ``--warmup`` untimed steps, so a busy machine slows them alike.

On a shared machine use ``--threads 1``: with two OpenMP threads and a third busy process, every
parallel region waits for a descheduled thread and small ops (bf16 casts above all) slow down 10-50x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="4096,16384,32768", help="forward window lengths ('' to skip)")
    ap.add_argument("--repeats", type=int, default=2, help="timed forward passes per dtype and length")
    ap.add_argument("--recipes", default="smollm2-135m/pose_yarn_x4_cpu,smollm2-135m/yarn_x4", help="('' to skip)")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per training window")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per variant")
    ap.add_argument("--warmup", type=int, default=1, help="untimed training steps per variant")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    return ap.parse_args(argv)


def part_times(config, length: int, repeats: int, torch) -> dict[str, float]:
    """Seconds of one layer's two big parts at ``length`` tokens in each dtype, on random inputs of
    the model's shapes: causal SDPA (grouped heads as transformers calls it) and the MLP's up
    projection. Where bf16 gains in one and not the other, the forward's speed-up says which part
    dominates at that length."""
    F = torch.nn.functional
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // heads
    out = {}
    for dtype in ("float32", "bfloat16"):
        dt = getattr(torch, dtype)
        q, k = torch.randn(1, heads, length, d, dtype=dt), torch.randn(1, kv, length, d, dtype=dt)
        x = torch.randn(length, config.hidden_size, dtype=dt)
        w = torch.randn(config.intermediate_size, config.hidden_size, dtype=dt)
        for part, run in (
            ("sdpa", lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=kv != heads)),
            ("mlp", lambda: F.linear(x, w)),
        ):
            run()  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            out[f"{part}_{dtype}_s"] = statistics.median(times)
    return out


def forward_rows(args, torch) -> list[dict]:
    import ropescale
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.training.data import split_holdout

    lengths = [int(x) for x in args.lengths.split(",") if x]
    if not lengths:
        return []
    tokenizer = ropescale.load_tokenizer(args.model)
    _, held_out = split_holdout(load_documents("austen"), ["Emma"])
    doc = tokenize_documents(tokenizer, held_out, max_tokens=max(lengths))[0]
    models = {
        dtype: ropescale.from_pretrained(args.model, method="yarn", factor=4, dtype=getattr(torch, dtype)).eval()
        for dtype in ("float32", "bfloat16")
    }
    rows = []
    for length in lengths:
        ids = torch.tensor([[tokenizer.bos_token_id, *doc[: length - 1]]])  # [1, length]
        times: dict[str, list[float]] = {d: [] for d in models}
        ppl: dict[str, float] = {}
        for _ in range(args.repeats):
            for dtype, model in models.items():
                start = time.perf_counter()
                with torch.inference_mode():
                    out = model(input_ids=ids, labels=ids)
                times[dtype].append(time.perf_counter() - start)
                ppl[dtype] = float(torch.exp(out.loss.float()))
        row = {"length": length, **{f"{d}_s": statistics.median(t) for d, t in times.items()}}
        row.update({f"{d}_ppl": p for d, p in ppl.items()})
        row.update(part_times(models["float32"].config, length, args.repeats, torch))
        rows.append(row)
        print(
            f"forward {length:>6}: fp32 {row['float32_s']:6.1f} s  bf16 {row['bfloat16_s']:6.1f} s  "
            f"x{row['float32_s'] / row['bfloat16_s']:.2f}  ppl {ppl['float32']:.3f} / {ppl['bfloat16']:.3f}",
            flush=True,
        )
    return rows


def training_rows(args, torch) -> list[dict]:
    import numpy as np
    from accelerate.state import AcceleratorState

    from ropescale.training.config import load_config
    from ropescale.training.trainer import Trainer

    recipes = [r for r in args.recipes.split(",") if r]
    if not recipes:
        return []
    tokens = np.random.default_rng(0).integers(100, 40000, size=400_000).astype(np.int64)  # speed only
    variants = []
    for recipe in recipes:
        for precision, overrides in (("fp32", ["model.dtype=float32", "train.mixed_precision=no"]), ("auto", [])):
            out = tempfile.mkdtemp(prefix="bench-dtype-")
            config = load_config(
                recipe,
                [
                    f"train.output_dir={out}",
                    f"data.seq_len={args.seq_len}",
                    "train.grad_accum=1",
                    "train.batch_size=1",
                    "eval.every=0",
                    "eval.at_end=false",
                    *overrides,
                ],
            )
            # accelerate keeps one process-wide state; each trainer's prepared forward keeps its own autocast
            AcceleratorState._reset_state(True)
            trainer = Trainer(config, train_tokens=tokens, eval_tokens=[[1] * 8], progress=False)
            trainer.setup()
            label = f"{recipe.rsplit('/', 1)[-1]} {precision} ({config.model.dtype}, mp {config.train.mixed_precision})"
            variants.append({"label": label, "trainer": trainer, "times": []})

    def one_step(trainer, index: int) -> float:
        batch = trainer.dataset.batch([index])
        start = time.perf_counter()
        loss = trainer.module(**batch)
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for i in range(args.warmup + args.steps):
        for v in variants:
            seconds = one_step(v["trainer"], i)
            if i >= args.warmup:
                v["times"].append(seconds)
    rows = []
    for v in variants:
        tok_s = args.seq_len / statistics.median(v["times"])
        rows.append({"variant": v["label"], "tokens_per_s": tok_s})
        print(f"train {v['label']}: {tok_s:.0f} tokens/s", flush=True)
    return rows


def main(argv=None) -> int:
    from ropescale.markdown import table

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from ropescale.models.runtime import cpu_bf16_kernels, cpu_model

    print(
        f"machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, bf16 computed by: {cpu_bf16_kernels()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    fwd = forward_rows(args, torch)
    train = training_rows(args, torch)
    rows = [
        [r["length"], f"{r['float32_s']:.1f}", f"{r['bfloat16_s']:.1f}", f"{r['float32_s'] / r['bfloat16_s']:.2f}x"]
        + [
            f"{r['float32_ppl']:.3f}",
            f"{r['bfloat16_ppl']:.3f}",
            f"{100 * (r['bfloat16_ppl'] / r['float32_ppl'] - 1):+.2f}%",
        ]
        for r in fwd
    ]
    print("\n" + table(["forward, YaRN x4", "fp32 s", "bf16 s", "speed-up", "PPL fp32", "PPL bf16", "Δ PPL"], rows))
    if fwd:
        rows = []
        for r in fwd:
            for part, name in (("sdpa", "causal SDPA"), ("mlp", "MLP up projection")):
                f32, b16 = r[f"{part}_float32_s"], r[f"{part}_bfloat16_s"]
                rows.append([name, r["length"], f"{1e3 * f32:.1f}", f"{1e3 * b16:.1f}", f"{f32 / b16:.2f}x"])
        print("\n" + table(["one layer's part", "length", "fp32 ms", "bf16 ms", "speed-up"], rows))
    if train:
        rows, base = [], None
        for r in train:
            base = r["tokens_per_s"] if " fp32 " in r["variant"] else base
            rows.append([r["variant"], f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_s'] / base:.2f}x"])
        print("\n" + table([f"training step, {args.seq_len}-token windows", "tokens/s", "vs fp32"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
