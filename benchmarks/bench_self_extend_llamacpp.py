"""Passkey answers of llama.cpp's Self-Extend beside ropescale's ``self_extend_llamacpp`` (and LongLM's
``self_extend`` for contrast) on the embedded SmolLM2-135M (trained at 8192).

For each (depth, trial): the passkey prompt of ``ropescale eval passkey`` (``evals/tasks/passkey.py``, key
from ``passkey_key``) at ``--length`` tokens, decoded to text; ``llama-completion`` runs it greedily
on the exported GGUF (f32 weights, ``ropescale export-gguf``) with ``--grp-attn-n G --grp-attn-w W``
(llama.cpp's default f16 KV cache, and ``-ctk f32 -ctv f32`` with ``--f32-cache``); ropescale decodes
llama.cpp's own prompt tokens (``--verbose-prompt``) greedily in fp32 with ``self_extend_llamacpp``
(same G, W, n_batch; llama.cpp's shipped K-shift sign, and ``kshift=intended``) and with LongLM's
``self_extend`` (same G, W). Each answer is the first ``--new`` tokens.

    python benchmarks/bench_self_extend_llamacpp.py --llama-completion .llamacpp/build/bin/llama-completion \\
        [--length 16384] [--depths 0.25,0.5,0.75] [--output runs/bench-grp-attn]

Results go (atomically) to ``OUTPUT/results.json`` after each cell; a re-run skips cells already there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODEL = "smollm2-135m"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-completion", required=True, help="llama.cpp's llama-completion binary")
    p.add_argument("--length", type=int, default=16384, help="prompt tokens (ropescale's tokenization)")
    p.add_argument("--depths", default="0.25,0.5,0.75")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--new", type=int, default=8, help="tokens generated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--f32-cache", action="store_true", help="llama.cpp with an f32 KV cache")
    p.add_argument("--skip-intended", action="store_true", help="leave out self_extend_llamacpp kshift=intended")
    p.add_argument("--output", default="runs/bench-grp-attn")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import functools

    import torch

    from ropescale import patch
    from ropescale._io import atomic_write_json
    from ropescale.evals.tasks.passkey import build_passkey_prompt, passkey_key, score_passkey
    from ropescale.export.llamacpp_completion import compare_greedy, prepare_comparison
    from ropescale.models.loading import from_pretrained

    torch.set_num_threads(args.threads)
    out = Path(args.output)
    setup = prepare_comparison(MODEL, out, "smollm2-135m-f32.gguf")
    results = setup.results
    G, W = args.group_size, args.window
    variants = {
        "self_extend_llamacpp": ("self_extend_llamacpp", {"n_batch": args.n_batch}),
        "self_extend_llamacpp_intended": ("self_extend_llamacpp", {"n_batch": args.n_batch, "kshift": "intended"}),
        "self_extend": ("self_extend", {}),
    }
    if args.skip_intended:
        del variants["self_extend_llamacpp_intended"]

    @functools.cache
    def model(name: str):
        method, params = variants[name]
        return patch(from_pretrained(MODEL, dtype=torch.float32), method, group_size=G, window=W, **params)

    for depth in [float(d) for d in args.depths.split(",")]:
        cell = f"{args.length}@{depth}" + ("/f32cache" if args.f32_cache else "")
        if cell in results:
            continue
        key = passkey_key(0, args.length, depth, 0)
        prompt = build_passkey_prompt(setup.tokenizer, args.length, depth, key)
        got = compare_greedy(
            args.llama_completion, setup, prompt.input_ids, {name: functools.partial(model, name) for name in variants},
            args.new, text=out / f"prompt-{depth}.txt", log=out / f"llama-{depth}.log", threads=args.threads,
            group_size=G, window=W, n_batch=args.n_batch, f32_cache=args.f32_cache,
        )  # fmt: skip
        row = {"key": key, "prompt_tokens": len(got.prompt_ids), **got.row()}
        for name in ("llama.cpp", *variants):
            row[f"{name}_correct"] = score_passkey(row[name], key)
        row["same"] = row["llama.cpp"] == row["self_extend_llamacpp"]
        results[cell] = row
        atomic_write_json(setup.results_path, results)
        print(cell, json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
