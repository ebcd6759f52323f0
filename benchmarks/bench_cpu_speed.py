"""How fast this CPU runs the embedded model, in one run: the bf16 (and fp32) matmul rate of torch's
threads on the model's own shapes, the shipped recipes' training steps (tokens/s and achieved FLOP/s)
and long prefill (tokens/s at 4k/16k/32k), each as a share of that matmul rate (issue 54).

    python benchmarks/bench_cpu_speed.py                       # alone on the machine: ~10 min on 2 cores
    python benchmarks/bench_cpu_speed.py --output runs/cpu-speed.json --recipes smollm2-135m/yarn_x2_cpu
    python benchmarks/bench_cpu_speed.py --profile 32768       # and where one 32k prefill's time goes (torch.profiler)
    python benchmarks/bench_cpu_speed.py --quick               # a tiny random model: checks the script, seconds

Run it ALONE: a measurement beside a test run, a build or another measurement is slower by their share
(the recipe ``smollm2-135m/yarn_x4_long`` was timed at 99 s a step beside another job and 23.8 s alone).
The 1-minute load average before and after is printed and kept in the JSON: a figure whose load
average is above the threads it used did not run alone.

Matmul rate: ``torch.matmul`` of ``[tokens, in] @ [in, out]`` for every projection of one decoder layer
(q, k, v, o, gate, up, down) and the LM head, at each ``--tokens`` count; the model's rate is their
FLOPs over their time weighted as one forward pass runs them (30 layers of the seven, one head).

Training: the recipe's own loop (:meth:`ropescale.training.trainer.Trainer.train`: forward, backward
through the chunked loss, clipping, AdamW, schedule) on random token ids (a step's work does not depend
on the ids), ``--warmup`` untimed steps then ``--steps`` timed ones. FLOPs per token as PaLM counts them
(arXiv 2204.02311, Appendix B): ``6N + 12·layers·d_attn·T`` for a full fine-tune (N: the weights of every
matmul, LM head included; T: the window), ``4N + ...`` for LoRA (frozen weights need no weight
gradient); attention counted as if not causal, the convention of the issue's 212 GFLOP/s.

Ceiling: what each recipe's step could reach if everything but attention ran at the matmul rate, with
SDPA's CPU attention (forward and backward at the recipe's window) as timed here
(:func:`attention_ceiling`). Where the ceiling is below a goal, no glue, fusion or allocator change
reaches it: only a faster attention kernel does.

Prefill: one forward of BOS + T random ids with YaRN at the factor reaching T (``logits_to_keep=1``: the
serving prefill), in the runtime ``auto`` resolves (bf16 where the CPU computes it). FLOPs per token
``2N' + 4·layers·d_attn·T`` (N': the layers' weights, no LM head), the same non-causal convention.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

#: the embedded model's token counts for the matmul rate (a 2k window, a 4k step of two windows)
TOKENS = (2048, 4096)
PREFILL = (4096, 16384, 32768)
RECIPES = ("smollm2-135m/yarn_x4_long", "smollm2-135m/yarn_x2_cpu")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts for the matmul rate")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="recipes whose steps are timed ('' to skip)")
    ap.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE", help="recipe overrides (a smoke run)")
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps per recipe")
    ap.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps per recipe")
    ap.add_argument("--prefill", default=",".join(map(str, PREFILL)), help="prefill lengths ('' to skip)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per matmul shape")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--output", default="runs/cpu-speed.json", help="the JSON of every figure and the machine")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="LENGTH",
        help="also profile one prefill of LENGTH tokens (torch.profiler): where its time goes, before changing it",
    )
    ap.add_argument("--quick", action="store_true", help="a tiny random model and short lengths: checks the script")
    return ap.parse_args(argv)


# -- the model's shapes and FLOPs ---------------------------------------------------------------------
def shapes(config) -> dict[str, int]:
    """The decoder's sizes from a transformers config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return {
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "vocab": config.vocab_size,
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": head_dim,
    }


def projections(s: dict[str, int]) -> list[tuple[str, int, int, int]]:
    """``(name, in, out, times per forward)`` of every matmul with weights: a layer's seven, the head."""
    d, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["intermediate"]
    layer = [("q", d, q), ("k", d, kv), ("v", d, kv), ("o", q, d), ("gate", d, m), ("up", d, m), ("down", m, d)]
    return [(n, i, o, s["layers"]) for n, i, o in layer] + [("lm_head", d, s["vocab"], 1)]


def weights(s: dict[str, int], head: bool = True) -> int:
    """N: the weights every token multiplies (the LM head's with ``head``)."""
    return sum(i * o * k for name, i, o, k in projections(s) if head or name != "lm_head")


def train_flops_per_token(s: dict[str, int], seq_len: int, lora: bool) -> float:
    """PaLM's count (arXiv 2204.02311, App. B): 6N (4N under LoRA: no weight gradients of frozen
    weights) plus 12·layers·d_attn·T for attention, not halved for the causal mask."""
    return (4 if lora else 6) * weights(s) + 12 * s["layers"] * s["heads"] * s["head_dim"] * seq_len


def prefill_flops_per_token(s: dict[str, int], length: int) -> float:
    """The forward third of :func:`train_flops_per_token` without the LM head (one token's logits)."""
    return 2 * weights(s, head=False) + 4 * s["layers"] * s["heads"] * s["head_dim"] * length


# -- the machine ---------------------------------------------------------------------------------------
def machine(torch) -> dict:
    """What the figures were measured on: CPU model, its bf16 instructions, threads, torch."""
    from ropescale.models.runtime import cpu_bf16_kernels, cpu_model, onednn_isa_cap

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "bf16_kernels": cpu_bf16_kernels(),
        "onednn_max_cpu_isa": onednn_isa_cap(),  # None: uncapped; e.g. AVX512_CORE_BF16: AMX off
        "flags": {f: f in flags for f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")},
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


# -- (i) matmul rate -------------------------------------------------------------------------------------
def matmul_rate(s: dict[str, int], tokens: list[int], repeats: int, torch) -> dict:
    """GFLOP/s of each projection at each token count in bf16 and fp32, and the model's rate: the
    forward's matmuls weighted as it runs them (best of ``repeats`` after one untimed call)."""
    out: dict = {"shapes": [], "rate": {}}
    for dtype in ("bfloat16", "float32"):
        dt = getattr(torch, dtype)
        flops = seconds = 0.0
        for n in tokens:
            for name, i, o, k in projections(s):
                x, w = torch.randn(n, i, dtype=dt), torch.randn(i, o, dtype=dt)
                torch.matmul(x, w)
                best = min(_timed(lambda x=x, w=w: torch.matmul(x, w)) for _ in range(repeats))
                f = 2.0 * n * i * o
                flops, seconds = flops + k * f, seconds + k * best
                out["shapes"].append({"dtype": dtype, "tokens": n, "name": name, "gflops": f / best / 1e9})
        out["rate"][dtype] = flops / seconds / 1e9
        print(f"matmul {dtype}: {out['rate'][dtype]:.1f} GFLOP/s on the model's shapes ({tokens} tokens)", flush=True)
    return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- (ii) training steps ---------------------------------------------------------------------------------
class _Enough(Exception):
    """Raised from the step callback: the timed steps are done (the run is a measurement, not a fine-tune)."""


def training(recipe: str, s: dict[str, int], args, model=None, overrides: tuple[str, ...] = ()) -> dict:
    """Tokens/s and achieved GFLOP/s of ``recipe``'s optimizer steps (its windows, accumulation,
    precision), the median of ``--steps`` after ``--warmup`` untimed ones."""
    import numpy as np
    from accelerate.state import AcceleratorState

    from ropescale.training.config import load_config
    from ropescale.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="bench-cpu-speed-") as out:
        # save_every=0 and far more steps than run: no checkpoint is written inside the timing
        fixed = [f"train.output_dir={out}", "train.max_steps=100000", "train.save_every=0", "eval.every=0"]
        config = load_config(recipe, [*overrides, *fixed, "eval.at_end=false", "train.log_every=1"])
        rng = np.random.default_rng(0)
        tokens = rng.integers(10, s["vocab"], size=config.data.seq_len * 64).astype(np.int64)
        AcceleratorState._reset_state(True)
        tokenizer = None
        if model is None:
            import ropescale

            tokenizer = ropescale.load_tokenizer(config.model.name)  # the recall sentences are tokenized
        trainer = Trainer(config, model=model, tokenizer=tokenizer, train_tokens=tokens, progress=False)
        marks: list[float] = []

        def on_step(_trainer, _loss) -> None:
            marks.append(time.perf_counter())
            if len(marks) > args.warmup + args.steps:
                raise _Enough

        trainer.setup()
        marks.append(time.perf_counter())
        try:
            trainer.train(on_step=on_step)
        except _Enough:
            pass
    c = config
    step_tokens = c.train.batch_size * c.train.grad_accum * c.data.seq_len
    step_s = statistics.median(b - a for a, b in list(zip(marks, marks[1:]))[args.warmup :])
    lora = bool(c.lora.enabled)
    per_token = train_flops_per_token(s, c.data.seq_len, lora)
    row = {
        "recipe": recipe,
        "step_tokens": step_tokens,
        "seq_len": c.data.seq_len,
        "lora": lora,
        "mixed_precision": c.train.mixed_precision,
        "step_s": step_s,
        "tokens_per_s": step_tokens / step_s,
        "flops_per_token": per_token,
        "gflops": per_token * step_tokens / step_s / 1e9,
    }
    print(
        f"train {recipe}: {row['step_s']:.1f} s a step of {step_tokens} tokens, {row['tokens_per_s']:.0f} tokens/s, "
        f"{row['gflops']:.1f} GFLOP/s",
        flush=True,
    )
    return row


def attention_ceiling(s: dict[str, int], row: dict, rate: float, repeats: int, torch) -> dict:
    """The most ``row``'s step could reach with SDPA's CPU attention as it runs here and every other op
    at the bf16 matmul ``rate``: the step's FLOPs (the table's convention) over the attention kernel's
    measured time (forward and backward, causal, bf16, the recipe's window, the model's query heads: the
    key/value heads are repeated before it, as transformers' SDPA path does) times the layers and windows
    of a step, plus the rest of the step's FLOPs (6N a token, 4N under LoRA) at ``rate``. A share above
    it needs a faster attention kernel, not faster glue around it."""
    T, H, D = row["seq_len"], s["heads"], s["head_dim"]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=gen, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, H, T, D, generator=gen, dtype=torch.bfloat16)

    def forward_backward() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    forward_backward()
    layer_s = min(_timed(forward_backward) for _ in range(repeats))
    attention_s = layer_s * s["layers"] * row["step_tokens"] / T
    rest_s = (4 if row["lora"] else 6) * weights(s) * row["step_tokens"] / (rate * 1e9)
    gflops = row["flops_per_token"] * row["step_tokens"] / (attention_s + rest_s) / 1e9
    out = {
        "attention_layer_s": layer_s,
        "attention_step_s": attention_s,
        "attention_share_of_step": attention_s / row["step_s"],
        "rest_at_matmul_rate_s": rest_s,
        "gflops": gflops,
        "share_of_bf16_matmul": gflops / rate,
    }
    print(
        f"train {row['recipe']}: attention alone (SDPA, forward and backward, {T} tokens) {attention_s:.1f} s of "
        f"the {row['step_s']:.1f} s step; with everything else at the matmul rate ({rest_s:.1f} s) the step "
        f"would reach {gflops:.0f} GFLOP/s = {100 * out['share_of_bf16_matmul']:.0f} % of it (the ceiling)",
        flush=True,
    )
    return out


# -- (iii) prefill -----------------------------------------------------------------------------------------
def prefill(model, s: dict[str, int], length: int, original: int, torch) -> dict:
    """Seconds of one forward over ``length`` tokens (YaRN at the factor reaching it, the last token's
    logits only), tokens/s and achieved GFLOP/s."""
    from ropescale.patching.model import patch

    factor = max(1, -(-length // original))
    patch(model, "yarn" if factor > 1 else "none", factor=factor, replace=True)
    ids = torch.randint(10, s["vocab"], (1, length))
    with torch.inference_mode():
        start = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        seconds = time.perf_counter() - start
    per_token = prefill_flops_per_token(s, length)
    row = {
        "length": length,
        "factor": factor,
        "seconds": seconds,
        "tokens_per_s": length / seconds,
        "flops_per_token": per_token,
        "gflops": per_token * length / seconds / 1e9,
    }
    print(f"prefill {length}: {seconds:.1f} s, {row['tokens_per_s']:.0f} tokens/s, {row['gflops']:.1f} GFLOP/s")
    return row


def profile_prefill(model, s: dict[str, int], length: int, original: int, torch, rows: int = 15) -> list[dict]:
    """The operators of one prefill of ``length`` tokens by self CPU time (torch.profiler), printed and
    returned: whether attention, the matmuls or the glue between them keeps prefill below the rate."""
    from torch.profiler import ProfilerActivity, profile

    from ropescale.patching.model import patch

    factor = max(1, -(-length // original))
    patch(model, "yarn" if factor > 1 else "none", factor=factor, replace=True)
    ids = torch.randint(10, s["vocab"], (1, length))
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    total = sum(e.self_cpu_time_total for e in prof.key_averages()) or 1
    top = [
        {"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total}
        for e in averages
    ]
    print(f"profile of prefill {length} (self CPU time):")
    for op in top:
        print(f"  {100 * op['share']:5.1f} %  {op['self_s']:8.2f} s  {op['calls']:6d} x  {op['op']}")
    return top


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from ropescale._io import atomic_write_json
    from ropescale.models.runtime import keep_freed_memory, load_average

    malloc = (
        "kept (keep_freed_memory)" if keep_freed_memory() else "system"
    )  # as the CLI runs; ROPESCALE_MALLOC=system: before
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = load_average()
    facts = machine(torch)
    print(
        f"machine: {facts['cpu']}, {facts['cores']} cores, {facts['threads']} threads, torch {facts['torch']}, "
        f"bf16 by {facts['bf16_kernels']} (amx_bf16 {facts['flags']['amx_bf16']}, avx512_bf16 "
        f"{facts['flags']['avx512_bf16']}"
        + (f"; oneDNN capped at {facts['onednn_max_cpu_isa']}" if facts["onednn_max_cpu_isa"] else "")
        + f"), malloc {malloc}, load average {load_before}",
        flush=True,
    )
    tokens = [int(x) for x in args.tokens.split(",") if x]
    lengths = [int(x) for x in args.prefill.split(",") if x]
    recipes = [r for r in args.recipes.split(",") if r]
    from ropescale.models.runtime import resolve_runtime
    from ropescale.patching.plan import original_spec

    runtime = resolve_runtime("cpu", "auto")  # bf16 where this CPU computes it, as the suites run
    if args.quick:  # the script's every path on a tiny random model: no figure worth keeping
        from ropescale.models.tiny import tiny_model

        model = tiny_model().to(runtime.torch_dtype)
        tokens, lengths = [64, 128], [128, 256, 512]
        overrides = ("data.seq_len=64", "data.recall_facts=0", "pose.target_length=256", *args.overrides)
        model_for_train = tiny_model
    else:
        import ropescale

        model = ropescale.from_pretrained(args.model, **runtime.load_kwargs())
        overrides, model_for_train = tuple(args.overrides), None
    s = shapes(model.config)
    original = original_spec(model.config).original_max_position_embeddings
    facts["prefill_dtype"] = runtime.dtype
    facts["malloc"] = malloc
    result: dict = {"machine": facts, "shapes": s, "load_avg_before": load_before, "command": _command(argv)}
    result["matmul"] = matmul_rate(s, tokens, args.repeats, torch)
    rate = result["matmul"]["rate"]["bfloat16"]
    result["training"] = []
    for recipe in recipes:
        row = training(recipe, s, args, model_for_train() if model_for_train else None, overrides)
        row["share_of_bf16_matmul"] = row["gflops"] / rate
        row["ceiling"] = attention_ceiling(s, row, rate, args.repeats, torch)
        result["training"].append(row)
    model.eval()
    result["prefill"] = []
    for length in lengths:
        row = prefill(model, s, length, original, torch)
        row["share_of_bf16_matmul"] = row["gflops"] / rate
        result["prefill"].append(row)
    if args.profile:
        result["profile"] = profile_prefill(model, s, args.profile, original, torch)
    result["load_avg_after"] = load_average()
    print(f"\nbf16 matmul rate on the model's shapes: {rate:.1f} GFLOP/s ({facts['threads']} threads)")
    for row in result["training"]:
        print(
            f"train {row['recipe']}: {row['tokens_per_s']:.0f} tokens/s, {row['gflops']:.1f} GFLOP/s = "
            f"{100 * row['share_of_bf16_matmul']:.0f} % of it; ceiling with this CPU's attention kernel "
            f"{100 * row['ceiling']['share_of_bf16_matmul']:.0f} % (attention {row['ceiling']['attention_step_s']:.1f} s "
            f"of {row['step_s']:.1f} s)"
        )
    for row in result["prefill"]:
        print(
            f"prefill {row['length']}: {row['tokens_per_s']:.0f} tokens/s, {row['gflops']:.1f} GFLOP/s = "
            f"{100 * row['share_of_bf16_matmul']:.0f} % of it"
        )
    print(f"load average: {load_before} before, {result['load_avg_after']} after (alone: at most the threads)")
    atomic_write_json(Path(args.output), result)
    print(f"wrote {args.output}")
    return 0


def _command(argv) -> str:
    import sys

    return "python benchmarks/bench_cpu_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
