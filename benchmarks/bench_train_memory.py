"""Training memory and speed of the long-window options, side by side, on a random-init model (no download).

    python benchmarks/bench_train_memory.py --shape 7b --lengths 8192,16384,32768 --device cuda
    python benchmarks/bench_train_memory.py --shape small --lengths 1024,2048,4096 --device cpu --steps 1
    python benchmarks/bench_train_memory.py --shape tiny --lengths 64,128 --device cpu      # smoke (seconds)

One training micro-step (forward + backward of the trainer's loss module, LoRA r=16 on every linear
layer, activation checkpointing on, loss in chunks of ``--loss-chunk``) per length and option:

* ``plain``: activation checkpointing only (what the recipes do);
* ``offload``: + the checkpointed layer inputs in pinned host memory (``train.offload_activations``);
* ``tiled``: + every MLP in checkpointed tiles of ``--tile`` tokens (``train.mlp_tile_tokens``, default
  hidden_size as in arXiv 2506.13996);
* ``offload+tiled``: both; ``nockpt``: no checkpointing at all (for reference).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (absolute, weights included) in this process;
on the CPU every option runs in a fresh child process, lengths in increasing order, and the peak is the
growth of the resident set (``VmHWM`` after the step minus ``VmRSS`` before it, the peak reset through
``/proc/self/clear_refs`` and ``malloc_trim`` between lengths; glibc's mmap threshold is fixed at 64 KiB so
freed tensors leave the resident set). On the CPU the activations already live
in host memory: offloading cannot lower the peak there. Writes ``results.json`` in ``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {  # Llama-family shapes: hidden, intermediate, layers, heads, kv heads, vocab
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128),
    "small": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),  # Llama-3.2-1B
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),  # Llama-2-7B
}  # fmt: skip
OPTIONS = {
    "plain": {},
    "offload": {"offload_activations": True},
    "tiled": {"mlp_tile_tokens": None},
    "offload+tiled": {"offload_activations": True, "mlp_tile_tokens": None},
    "nockpt": {"gradient_checkpointing": False},
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="override the shape's number of layers")
    ap.add_argument("--lengths", default="64,128", help="window lengths (tokens), comma-separated")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--options", default="plain,offload,tiled,offload+tiled", help=f"of {', '.join(OPTIONS)}")
    ap.add_argument("--tile", type=int, default=None, help="MLP tile in tokens (default: hidden_size)")
    ap.add_argument("--loss-chunk", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2, help="micro-steps per cell; the last one is timed")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    ap.add_argument("--output", default="runs/bench-train-memory")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one option in this process
    return ap.parse_args(argv)


def build(args, option: str, torch):
    """A random-init Llama of the shape with LoRA and the option's memory settings: (loss module, dtype)."""
    import transformers

    from ropescale.training.config import config_from_dict
    from ropescale.training.modeling import CausalLMLoss, apply_memory_options, wrap_lora

    shape = {**SHAPES[args.shape], **({"num_hidden_layers": args.layers} if args.layers else {})}
    tile = args.tile or shape["hidden_size"]
    train = {"gradient_checkpointing": True, "loss_chunk": args.loss_chunk}
    train.update({k: (tile if v is None else v) for k, v in OPTIONS[option].items()})
    config = config_from_dict(
        {
            "model": {"name": f"random-{args.shape}"},
            "scaling": {"method": "yarn", "factor": 4},
            "lora": {"r": 16, "alpha": 32, "target_modules": TARGETS},
            "train": train,
        }
    )
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    hf_config = transformers.LlamaConfig(**shape, max_position_embeddings=1 << 20, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(args.device):
            model = transformers.LlamaForCausalLM(hf_config)
    finally:
        torch.set_default_dtype(previous)
    model.config.use_cache = False
    peft_model = wrap_lora(model, config)
    apply_memory_options(peft_model.get_base_model(), config)
    return CausalLMLoss(peft_model, args.loss_chunk).train(), dtype


def micro_step(module, length: int, device: str, dtype, torch) -> float:
    """One forward + backward on a random window; returns its seconds."""
    vocab = module.model.get_base_model().config.vocab_size
    ids = torch.randint(0, vocab, (1, length), device=device)
    pos = torch.arange(length, device=device)[None]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        loss = module(ids, pos, ids)
    loss.backward()
    sync()
    seconds = time.perf_counter() - t0
    module.zero_grad(set_to_none=True)
    return seconds


def _proc_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def run_cpu_child(args) -> None:
    """This process measures one option at every length (increasing) and prints one JSON line each."""
    import ctypes
    import gc

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    module, dtype = build(args, args.child, torch)
    libc = ctypes.CDLL("libc.so.6")
    for length in sorted(int(x) for x in args.lengths.split(",")):
        gc.collect()
        libc.malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _proc_kib("VmRSS")
        times = [micro_step(module, length, "cpu", dtype, torch) for _ in range(args.steps)]
        peak = _proc_kib("VmHWM") - before
        cell = {"option": args.child, "length": length, "seconds": times[-1], "peak_mib": peak / 1024}
        print(json.dumps(cell), flush=True)


def measure_cpu(args, option: str, argv: list[str]) -> list[dict]:
    """One fresh child process for ``option`` (the same settings ``argv``), all lengths."""
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", option]
    # A fixed mmap threshold turns off glibc's dynamic one, under which freed multi-MiB tensors stay in the
    # heap: then RSS would count what the allocator keeps, not what the step holds.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    cells = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    done = {c["length"] for c in cells}
    for length in (int(x) for x in args.lengths.split(",")):
        if length not in done:  # killed (out of memory) or failed at this length
            cells.append({"option": option, "length": length, "error": f"child exited {proc.returncode}"})
    if proc.returncode:
        print(proc.stderr[-2000:], file=sys.stderr)
    return cells


def measure_cuda(args, option: str) -> list[dict]:
    import gc

    import torch

    module, dtype = build(args, option, torch)
    cells = []
    for length in sorted(int(x) for x in args.lengths.split(",")):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            times = [micro_step(module, length, "cuda", dtype, torch) for _ in range(args.steps)]
        except torch.OutOfMemoryError:
            module.zero_grad(set_to_none=True)
            cells.append({"option": option, "length": length, "error": "out of memory"})
            print(f"{option} {length}: out of memory", file=sys.stderr, flush=True)
            continue
        peak = torch.cuda.max_memory_allocated() / 2**20
        cells.append({"option": option, "length": length, "seconds": times[-1], "peak_mib": peak})
        print(f"{option} {length}: {length / times[-1]:.0f} tok/s, peak {peak:.0f} MiB", file=sys.stderr, flush=True)
    del module
    gc.collect()
    torch.cuda.empty_cache()
    return cells


def table(cells: list[dict], options: list[str], lengths: list[int]) -> str:
    """Markdown: one row per length, tokens/s and peak memory per option."""
    from ropescale import markdown

    heads = ["length", *(f"{o} {what}" for o in options for what in ("tok/s", "peak MiB"))]
    by = {(c["option"], c["length"]): c for c in cells}
    rows = []
    for n in lengths:
        row = [str(n)]
        for o in options:
            c = by.get((o, n), {"error": "?"})
            row += [c["error"], ""] if "error" in c else [f"{n / c['seconds']:.0f}", f"{c['peak_mib']:.0f}"]
        rows.append(row)
    return markdown.table(heads, rows, align="r" * len(heads))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.child:
        run_cpu_child(args)
        return 0
    options = [o.strip() for o in args.options.split(",") if o.strip()]
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        raise SystemExit(f"unknown option {unknown[0]!r}; known: {', '.join(OPTIONS)}")
    lengths = sorted(int(x) for x in args.lengths.split(","))
    t0 = time.perf_counter()
    cells = []
    for option in options:
        cells += measure_cpu(args, option, argv) if args.device == "cpu" else measure_cuda(args, option)
        print(f"{option}: done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    text = table(cells, options, lengths)
    device = "CPU" if args.device == "cpu" else __import__("torch").cuda.get_device_name()
    meta = {
        "command": "python benchmarks/bench_train_memory.py " + " ".join(argv),
        "shape": {**SHAPES[args.shape], **({"num_hidden_layers": args.layers} if args.layers else {})},
        "tile": args.tile or SHAPES[args.shape]["hidden_size"],
        "device": device,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "wall_s": time.perf_counter() - t0,
        "peak": "max_memory_allocated (absolute)" if args.device == "cuda" else "RSS growth during the step",
    }
    from ropescale._io import atomic_write_json

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", {**meta, "cells": cells, "table": text})
    print(f"{args.shape} ({meta['shape']['num_hidden_layers']} layers), {device}, peak = {meta['peak']}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
