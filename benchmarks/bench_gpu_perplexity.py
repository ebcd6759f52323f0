"""Perplexity evaluation on a GPU at 32k and 64k: ropescale against the native transformers forward
with the same settings, side by side in one process.

Both models are the same checkpoint with the same scaling (YaRN at s = length / L by default, so
the window is the extended context), the same dtype and attention kernel (``auto``: bf16 and
flash-attn 2 when installed, SDPA otherwise):

  ropescale: evaluate_perplexity(model, [ids], window=length, mode="nonoverlap")   # chunked loss
  native:    AutoModelForCausalLM(config with the same rope_parameters)(x, labels=x)  # full logits

Each (length, variant) is measured ``--repeats`` times, alternating, after a warm-up; reported are
the median tokens/s, the peak GPU memory (torch.cuda.max_memory_allocated, weights included) and
the ratios ropescale / native. No CUDA device: a one-line message and exit 2 (``--device cpu``
runs the same code on the CPU, for a smoke test with a small model and short lengths).

    python benchmarks/bench_gpu_perplexity.py [--lengths 32768,65536] [--model smollm2-135m]
        [--method yarn] [--dtype auto] [--attention auto] [--repeats 3] [--output runs/bench-gpu]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", default="32768,65536")
    ap.add_argument(
        "--method", default="yarn", help="a method transformers builds natively (yarn, linear, dynamic_ntk...)"
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help="text to score (default: the embedded corpus, longest novel first)")
    ap.add_argument("--output", default=None, help="folder for results.json (written atomically)")
    args = ap.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from ropescale._io import atomic_write_json
    from ropescale.errors import RopescaleError
    from ropescale.models.runtime import resolve_runtime

    try:
        runtime = resolve_runtime(args.device, args.dtype, args.attention)
        if args.device == "auto" and runtime.device == "cpu":
            raise RopescaleError("no CUDA device: this benchmark measures the GPU path (--device cpu for a smoke test)")
        lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
        rows = run(args.model, args.method, lengths, runtime, args.repeats, args.data)
    except (RopescaleError, ValueError, OSError) as e:
        print(f"bench_gpu_perplexity: error: {e}", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name(runtime.device) if runtime.device.startswith("cuda") else "cpu"
    print(f"{device_name}; {runtime.dtype}; attention {runtime.attention}; method {args.method}; model {args.model}")
    print(f"{'length':>7} {'variant':<10} {'tok/s':>10} {'peak GiB':>9} {'ppl':>9}")
    for r in rows:
        print(f"{r['length']:>7} {r['variant']:<10} {r['tokens_per_s']:>10.0f} {r['peak_gib']:>9.2f} {r['ppl']:>9.3f}")
    ratios = []
    for length in lengths:
        ours, native = (
            next(r for r in rows if r["length"] == length and r["variant"] == v) for v in ("ropescale", "native")
        )
        ratio = {
            "length": length,
            "speed_ratio": ours["tokens_per_s"] / native["tokens_per_s"],
            "memory_ratio": ours["peak_gib"] / native["peak_gib"] if native["peak_gib"] else None,
        }
        ratios.append(ratio)
        memory = "n/a" if ratio["memory_ratio"] is None else f"{ratio['memory_ratio']:.3f}"
        print(f"{length}: ropescale/native tokens/s {ratio['speed_ratio']:.3f}, peak memory {memory}")
    if args.output:
        atomic_write_json(
            os.path.join(args.output, "results.json"),
            {
                "device": device_name,
                "runtime": runtime.to_dict(),
                "method": args.method,
                "model": args.model,
                "rows": rows,
                "ratios": ratios,
            },
        )
    return 0


def run(model_name: str, method: str, lengths: list[int], runtime, repeats: int, data: str | None = None) -> list[dict]:
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    import ropescale
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.errors import RopescaleError
    from ropescale.models.loading import load_config, resolve_model
    from ropescale.patching.plan import provenance, trained_context
    from ropescale.scoring.perplexity import evaluate_perplexity

    tokenizer = ropescale.load_tokenizer(model_name)
    L = trained_context(load_config(model_name))
    longest = max(lengths)
    docs = tokenize_documents(tokenizer, load_documents(data), max_tokens=longest, min_tokens=longest)
    if not docs:
        raise ValueError(f"no document of the corpus has {longest} tokens")
    ids_all = docs[0]
    bos = tokenizer.bos_token_id
    cuda = runtime.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(runtime.device)

    def measure(fn) -> tuple[float, float, float]:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(runtime.device)
        sync()
        start = time.perf_counter()
        ppl = fn()
        sync()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(runtime.device) / 2**30 if cuda else 0.0
        return seconds, peak, ppl

    rows = []
    for length in lengths:
        factor = max(1.0, length / L)
        ours = runtime.place(
            ropescale.from_pretrained(model_name, method=method, factor=factor, **runtime.load_kwargs())
        )
        if not provenance(ours.config)["native"]:
            raise RopescaleError(f"method '{method}' is not native to transformers; nothing to compare against")
        config = copy.deepcopy(ours.config)  # the same rope_parameters, the model's own attention kernel
        resolved = resolve_model(model_name)
        native = runtime.place(
            AutoModelForCausalLM.from_pretrained(
                resolved.path, config=config, **resolved.kwargs, **runtime.load_kwargs()
            ).eval()
        )
        ids = ids_all[:length]
        x = (
            torch.tensor([[bos, *ids]], device=runtime.device)
            if bos is not None
            else torch.tensor([ids], device=runtime.device)
        )

        def ropescale_ppl(ours=ours, ids=ids, length=length) -> float:
            return evaluate_perplexity(
                ours, [ids], window=length, mode="nonoverlap", bos_token_id=bos, progress=False
            ).ppl

        def native_ppl(native=native, x=x) -> float:
            with torch.inference_mode():
                return math.exp(native(x, labels=x).loss.float().item())

        short = min(length, 1024)  # warm-up: kernels, allocator
        evaluate_perplexity(ours, [ids[:short]], window=short, mode="nonoverlap", bos_token_id=bos, progress=False)
        with torch.inference_mode():
            native(x[:, :short])
        samples: dict[str, list] = {"ropescale": [], "native": []}
        for _ in range(repeats):
            for variant, fn in (("ropescale", ropescale_ppl), ("native", native_ppl)):
                samples[variant].append(measure(fn))
        for variant, got in samples.items():
            seconds = statistics.median(s for s, _, _ in got)
            rows.append(
                {
                    "length": length,
                    "variant": variant,
                    "factor": factor,
                    "seconds": seconds,
                    "tokens_per_s": length / seconds,
                    "peak_gib": max(p for _, p, _ in got),
                    "ppl": got[0][2],
                }
            )
        del ours, native
        if cuda:
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    sys.exit(main())
