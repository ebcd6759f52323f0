"""Greedy passkey answers of llama.cpp on an exported GGUF, with no rope flags, beside ropescale's
on the checkpoint it was exported from: does the model's retrieval leave with the file?

For each (depth, trial): the passkey prompt of ``ropescale eval passkey`` (``evals/tasks/passkey.py``: the
same keys, depths and text) at ``--length`` tokens, decoded to text; ``llama-completion`` runs it
greedily on the GGUF (``ropescale export-gguf CHECKPOINT``, f32 matrices: the rope scaling travels in
the file's metadata, no ``--rope-*`` flag is given); ropescale decodes llama.cpp's own prompt tokens
(``--verbose-prompt``) greedily with the checkpoint loaded by plain ``from_pretrained`` (fp32). Both
are kept from ending the answer early (end-of-text banned on both sides). Each answer is the first
``--new`` tokens; "same" compares the bytes, "correct" the first integer against the key.

    python benchmarks/bench_gguf_passkey.py --checkpoint runs/extension-x4/yarn-export \\
        --llama-completion .llamacpp/build/bin/llama-completion --length 8192 --trials 2

Results go (atomically) to ``OUTPUT/results.json`` after each prompt; a re-run skips prompts already there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="a saved checkpoint (ropescale export / train output)")
    p.add_argument("--llama-completion", required=True, help="llama.cpp's llama-completion binary")
    p.add_argument("--length", type=int, default=8192, help="prompt tokens (ropescale's tokenization)")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1")
    p.add_argument("--trials", type=int, default=2, help="trials per depth (keys as `ropescale eval passkey`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--new", type=int, default=10, help="tokens generated (`ropescale eval passkey`: 10)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default="runs/bench-gguf-passkey")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import functools

    import torch

    from ropescale._io import atomic_write_json
    from ropescale.evals.tasks.passkey import build_passkey_prompt, passkey_key, score_passkey
    from ropescale.export.llamacpp_completion import compare_greedy, prepare_comparison
    from ropescale.models.loading import from_pretrained

    torch.set_num_threads(args.threads)
    out = Path(args.output)
    setup = prepare_comparison(args.checkpoint, out, "model-f32.gguf")
    results = setup.results
    model = functools.cache(lambda: from_pretrained(args.checkpoint, dtype=torch.float32).eval())
    for depth in [float(d) for d in args.depths.split(",")]:
        for trial in range(args.trials):
            cell = f"{args.length}@{depth}#{trial}"
            if cell in results:
                continue
            key = passkey_key(args.seed, args.length, depth, trial)
            prompt = build_passkey_prompt(setup.tokenizer, args.length, depth, key)
            got = compare_greedy(
                args.llama_completion,
                setup,
                prompt.input_ids,
                {"ropescale": model},
                args.new,
                text=out / "prompt.txt",
                log=out / "llama.log",
                threads=args.threads,
                group_size=1,
                window=512,
            )  # fmt: skip  (--grp-attn-n 1: Self-Extend off, llama.cpp's default)
            same_tokens = got.prompt_ids == list(prompt.input_ids)
            row = {"key": key, "prompt_tokens": len(got.prompt_ids), "same_tokens": same_tokens, **got.row()}
            row["llama.cpp_correct"] = score_passkey(row["llama.cpp"], key)
            row["ropescale_correct"] = score_passkey(row["ropescale"], key)
            row["same"] = got.answers["llama.cpp"] == got.answers["ropescale"]
            results[cell] = row
            atomic_write_json(setup.results_path, results)
            print(cell, json.dumps(row), flush=True)
    rows = [results[k] for k in results if k.startswith(f"{args.length}@")]
    same = sum(r["same"] for r in rows)
    print(
        f"{args.checkpoint} at {args.length}: {same}/{len(rows)} answers identical; correct: llama.cpp "
        f"{sum(r['llama.cpp_correct'] for r in rows)}/{len(rows)}, ropescale {sum(r['ropescale_correct'] for r in rows)}"
        f"/{len(rows)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
