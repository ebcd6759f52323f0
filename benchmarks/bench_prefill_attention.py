"""Where a long prefill's time goes on a CPU, and whether anything obvious beats it (issue 54).

``bench_cpu_speed.py --profile 16384`` found one 16k prefill of the embedded model spending 81 % of its
time in one operator: SDPA's CPU flash attention (``aten::_scaled_dot_product_flash_attention_for_cpu``).
This benchmark times that kernel on one decoder layer's attention at the model's shape (9 query heads
after the key/value heads are repeated, as transformers' SDPA path does; head_dim 64; bf16; causal)
against the obvious alternative written with the same torch, in one run:

- ``sdpa``: ``scaled_dot_product_attention(q, k, v, is_causal=True)``, what a prefill runs;
- ``blocks``: query blocks of ``--block`` rows, each against the keys up to its end (the causal mask
  skipped a block at a time), scores by ``matmul``, an fp32 softmax, ``matmul`` by the values;
- ``blocks, no softmax``: the same two matmuls alone, a floor for any kernel built from them.

Each figure is the best of ``--repeats`` calls after one untimed call, and is given as GFLOP/s of the
causal work (``4 · heads · T²/2 · head_dim``: the two products, masked half not counted) and as a ratio
to ``sdpa``. The 1-minute load average before and after is printed: run it alone.

``--flex`` adds torch's other attention kernel for the CPU: ``flex_attention`` with a causal block mask,
compiled (inductor generates its CPU code; a C++ compiler is needed, and the first call compiles). Where
torch cannot run it (its backward on a CPU, torch 2.13) the row says so instead of a time.

``--backward`` times the forward and backward of each instead, as a training step runs them (autograd
through the same functions, a random output gradient), at a training window: the question behind the
ceiling of ``bench_cpu_speed.py`` (SDPA's CPU attention backward bounds a step), whether the obvious
alternative's backward beats the kernel's. Its work is counted as three times the forward's (the two
products forward, four backward).

    python benchmarks/bench_prefill_attention.py --output runs/prefill-attention.json   # alone: ~2 min on 2 cores
    python benchmarks/bench_prefill_attention.py --backward --lengths 2048 --output runs/train-attention.json
    python benchmarks/bench_prefill_attention.py --flex --lengths 2048,16384             # and flex_attention, compiled
    python benchmarks/bench_prefill_attention.py --quick                                 # checks the script: seconds
"""

from __future__ import annotations

import argparse
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="4096,16384", help="prefill lengths T (comma-separated)")
    ap.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=1024, help="query rows per block of the alternative")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--output", default=None, help="a JSON of every figure and the machine")
    ap.add_argument("--backward", action="store_true", help="forward and backward, as a training step runs them")
    ap.add_argument("--quick", action="store_true", help="short lengths: checks the script, no figure means anything")
    ap.add_argument("--flex", action="store_true", help="also torch's flex_attention, compiled (needs a C++ compiler)")
    return ap.parse_args(argv)


def causal_flops(heads: int, length: int, head_dim: int) -> float:
    """The two attention products of one layer, the masked upper half not counted."""
    return 4.0 * heads * length * length / 2 * head_dim


def sdpa(q, k, v, torch):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def blocks(q, k, v, torch, block: int, softmax: bool = True):
    """Causal attention a query block at a time: each block's scores against the keys up to its own end
    (its diagonal square masked), softmax in fp32, then the values."""
    T, D = q.shape[-2], q.shape[-1]
    out = torch.empty_like(q)
    for start in range(0, T, block):
        end = min(start + block, T)
        scores = q[..., start:end, :] @ k[..., :end, :].transpose(-1, -2)
        if softmax:
            scores = scores.float() * D**-0.5
            rows = torch.arange(start, end).unsqueeze(1)
            scores.masked_fill_(torch.arange(end).unsqueeze(0) > rows, float("-inf"))
            scores = scores.softmax(-1).to(q.dtype)
        out[..., start:end, :] = scores @ v[..., :end, :]
    return out


def flex_kernel(length: int, torch):
    """``flex_attention`` compiled, with a causal block mask of ``length``: a function of (q, k, v)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, length, length, device="cpu")
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=mask)


def best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from ropescale._io import atomic_write_json
    from ropescale.models.runtime import cpu_bf16_kernels, cpu_model, load_average

    lengths = [256, 512] if args.quick else [int(x) for x in args.lengths.split(",") if x]
    dtype = getattr(torch, args.dtype)
    load_before = load_average()
    facts = {
        "cpu": cpu_model(),
        "bf16_kernels": cpu_bf16_kernels(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    print(
        f"machine: {facts['cpu']}, {facts['threads']} threads, bf16 by {facts['bf16_kernels']}, "
        f"torch {facts['torch']}, load average {load_before}",
        flush=True,
    )
    gen = torch.Generator().manual_seed(0)
    rows = []
    for T in lengths:
        q, k, v = (
            torch.randn(1, args.heads, T, args.head_dim, generator=gen, dtype=dtype).requires_grad_(args.backward)
            for _ in range(3)
        )
        grad = torch.randn(1, args.heads, T, args.head_dim, generator=gen, dtype=dtype)
        block = min(args.block, T)

        def timed_call(fn):  # the forward alone, or the forward and its backward
            return (lambda: fn().backward(grad)) if args.backward else fn

        with torch.no_grad():
            reference = sdpa(q, k, v, torch).float()
            error = (blocks(q, k, v, torch, block).float() - reference).abs().max().item()
        work = causal_flops(args.heads, T, args.head_dim) * (3 if args.backward else 1)
        timed = {
            "sdpa": best_of(timed_call(lambda: sdpa(q, k, v, torch)), args.repeats),
            "blocks": best_of(timed_call(lambda: blocks(q, k, v, torch, block)), args.repeats),
            "blocks, no softmax": best_of(
                timed_call(lambda: blocks(q, k, v, torch, block, softmax=False)), args.repeats
            ),
        }
        row = {"length": T, "causal_gflop": work / 1e9, "max_abs_difference": error, "kernels": {}}
        if args.flex:
            flex = flex_kernel(T, torch)
            try:
                timed["flex (compiled)"] = best_of(timed_call(lambda: flex(q, k, v)), args.repeats)
            except NotImplementedError as exc:  # torch's own refusal, said as it is
                reason = str(exc).splitlines()[0]
                row["kernels"]["flex (compiled)"] = {"unsupported": reason}
                print(f"T {T:>6}: {'flex (compiled)':<20} not run: {reason}", flush=True)
        for name, seconds in timed.items():
            row["kernels"][name] = {
                "seconds": seconds,
                "gflops": work / seconds / 1e9,
                "ratio_to_sdpa": seconds / timed["sdpa"],
            }
            print(
                f"T {T:>6}: {name:<20} {seconds:7.3f} s a layer{' (fwd+bwd)' if args.backward else ''}, "
                f"{work / seconds / 1e9:7.1f} GFLOP/s "
                f"(causal work), {seconds / timed['sdpa']:.2f}x sdpa's time",
                flush=True,
            )
        print(f"T {T:>6}: blocks against sdpa, largest difference {error:.2e}")
        rows.append(row)
    load_after = load_average()
    print(f"load average: {load_before} before, {load_after} after (alone: at most the threads)")
    if args.output:
        command = "python benchmarks/bench_prefill_attention.py " + " ".join(argv if argv is not None else sys.argv[1:])
        atomic_write_json(
            args.output,
            {
                "command": command.strip(),
                "machine": facts,
                "heads": args.heads,
                "head_dim": args.head_dim,
                "dtype": args.dtype,
                "block": args.block,
                "timed": "forward and backward" if args.backward else "forward",
                "rows": rows,
                "load_avg_before": load_before,
                "load_avg_after": load_after,
            },
        )
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
