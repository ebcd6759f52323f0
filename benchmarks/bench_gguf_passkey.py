"""Greedy passkey answers of llama.cpp on an exported GGUF, with no rope flags, beside ropescale's
on the checkpoint it was exported from: does the model's retrieval leave with the file?

For each (depth, trial): the passkey prompt of ``ropescale eval passkey`` (``evals/passkey.py``: the
same keys, depths and text) at ``--length`` tokens, decoded to text; ``llama-completion`` runs it
greedily on the GGUF (``ropescale export-gguf CHECKPOINT``, f32 matrices: the rope scaling travels in
the file's metadata, no ``--rope-*`` flag is given); ropescale decodes llama.cpp's own prompt tokens
(``--verbose-prompt``) greedily with the checkpoint loaded by plain ``from_pretrained`` (fp32). Both
are kept from ending the answer early (end-of-text banned on both sides). Each answer is the first
``--new`` tokens; "same" compares the bytes, "correct" the first integer against the key.

    python benchmarks/bench_gguf_passkey.py --checkpoint runs/extension-x4/yarn-export \\
        --llama-completion .llamacpp-cli/build/bin/llama-completion --length 8192 --trials 2

Results go (atomically) to ``OUTPUT/results.json`` after each prompt; a re-run skips prompts already there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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
    import torch

    from ropescale._io import atomic_write_json
    from ropescale.evals.passkey import build_passkey_prompt, passkey_key, score_passkey
    from ropescale.export import export_gguf
    from ropescale.export.llamacpp_completion import greedy_ids, run_llama_completion, token_bytes
    from ropescale.models.loading import from_pretrained, load_tokenizer

    torch.set_num_threads(args.threads)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    tokenizer = load_tokenizer(args.checkpoint)
    gguf = out / "model-f32.gguf"
    if not gguf.is_file():
        export_gguf(args.checkpoint, gguf, "f32")
    banned = list(tokenizer.all_special_ids)  # the answer is digits: no end of generation on either side
    model = None
    for depth in [float(d) for d in args.depths.split(",")]:
        for trial in range(args.trials):
            cell = f"{args.length}@{depth}#{trial}"
            if cell in results:
                continue
            key = passkey_key(args.seed, args.length, depth, trial)
            prompt = build_passkey_prompt(tokenizer, args.length, depth, key)
            text = out / "prompt.txt"
            text.write_text(tokenizer.decode(prompt.input_ids, skip_special_tokens=True), encoding="utf-8")
            t0 = time.time()
            ids, theirs, log = run_llama_completion(
                args.llama_completion,
                gguf,
                text,
                args.new,
                group_size=1,
                window=512,
                n_ctx=len(prompt.input_ids) + args.new + 64,
                banned=banned,
                threads=args.threads,
            )  # fmt: skip  (--grp-attn-n 1: Self-Extend off, llama.cpp's default)
            row = {"key": key, "prompt_tokens": len(ids), "same_tokens": ids == list(prompt.input_ids)}
            row["llama.cpp"], row["llama.cpp_s"] = theirs.decode("utf-8", "replace"), round(time.time() - t0, 1)
            (out / "llama.log").write_text(log[-20000:], encoding="utf-8")
            if model is None:
                model = from_pretrained(args.checkpoint, dtype=torch.float32).eval()
            t0 = time.time()
            ours = token_bytes(tokenizer, greedy_ids(model, ids, args.new, banned))
            row["ropescale"], row["ropescale_s"] = ours.decode("utf-8", "replace"), round(time.time() - t0, 1)
            row["llama.cpp_correct"] = score_passkey(row["llama.cpp"], key)
            row["ropescale_correct"] = score_passkey(row["ropescale"], key)
            row["same"] = theirs == ours
            results[cell] = row
            atomic_write_json(results_path, results)
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
