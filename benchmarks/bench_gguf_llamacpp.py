"""Does llama.cpp run an exported GGUF with the same RoPE scaling as ropescale? Perplexity of both on
the same tokens, under llama.cpp's own protocol.

For each method and length: patch the embedded SmolLM2-135M (trained at 8192) at factor
length / 8192 (``none``: unscaled), export it with ``ropescale.export.export_gguf`` (f32), run
``llama-perplexity`` on it with NO rope flags (``-c LENGTH --chunks 1``; everything comes from the
GGUF metadata), and compute ropescale's perplexity on the same token ids the way
``tools/perplexity/perplexity.cpp`` does: the first ``LENGTH`` tokens of the text in one window,
its first token replaced by BOS when the tokenizer adds one, and only the second half scored
(logits at positions n/2 .. n−2 predicting tokens n/2+1 .. n−1). The text is Emma (Austen corpus,
``ropescale.data.load_corpus("austen")``), written to ``OUTPUT/emma.txt``.

Token agreement is checked with ``llama-tokenize`` when it sits beside ``llama-perplexity``: its ids
for the whole text against the Hugging Face tokenizer's.

    python benchmarks/bench_gguf_llamacpp.py --llama-perplexity /path/to/llama-perplexity \\
        [--lengths 16384,32768] [--methods none,linear,ntk,yarn] [--output runs/bench-gguf]

Results are written (atomically) to ``OUTPUT/results.json`` after every cell; re-running skips the
cells already there. Measured results: docs/gguf.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

TRAINED = 8192
MODEL = "smollm2-135m"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--llama-perplexity",
        default=os.environ.get("LLAMA_PERPLEXITY"),
        help="path of llama.cpp's llama-perplexity (default: $LLAMA_PERPLEXITY)",
    )
    p.add_argument("--lengths", default="16384,32768")
    p.add_argument("--methods", default="none,linear,ntk,yarn")
    p.add_argument("--output", default="runs/bench-gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2048, help="llama-perplexity -b (its default)")
    p.add_argument("--keep-gguf", action="store_true", help="keep the exported files (540 MB each)")
    p.add_argument(
        "--checkpoint",
        default=None,
        help="a saved checkpoint (e.g. a `ropescale export` of a fine-tuned run) to check as saved, "
        "instead of patching the embedded model per method (--methods is then ignored)",
    )
    args = p.parse_args(argv)
    if not args.llama_perplexity or not Path(args.llama_perplexity).is_file():
        p.error("--llama-perplexity (or $LLAMA_PERPLEXITY) must name the llama-perplexity binary")
    return args


def check_tokens(binary: str, gguf: Path, text: Path, hf_ids: list[int], needed: int) -> dict:
    """Compare llama.cpp's tokenization of the text with the Hugging Face ids (first ``needed``)."""
    from ropescale.export.llamacpp import llama_tokenize

    tokenize = Path(binary).with_name("llama-tokenize")
    if not tokenize.is_file():
        return {"checked": False, "why": f"{tokenize} not found"}
    ids = llama_tokenize(tokenize, gguf, text)
    first_diff = next((i for i, (a, b) in enumerate(zip(ids, hf_ids)) if a != b), None)
    return {
        "checked": True,
        "llama_cpp_tokens": len(ids),
        "hf_tokens": len(hf_ids),
        "first_difference": first_diff,
        "identical_first_needed": (first_diff is None and min(len(ids), len(hf_ids)) >= needed)
        or (first_diff is not None and first_diff >= needed),
    }


def other_sources(results: dict, keys: list[str], source: str, checkpoint: bool) -> list[str]:
    """The cells among ``keys`` already in ``results`` that another model or checkpoint measured (two
    checkpoints of one folder name share a cell key). A checkpoint's cell from before sources were
    recorded cannot say which it was and counts as another's; the embedded model's methods can."""
    cells = results.get("cells", {})
    legacy = None if checkpoint else source
    return [k for k in keys if k in cells and cells[k].get("source", legacy) != source]


def checkpoint_source(path: str | Path) -> str:
    """A checkpoint as a cell records it: its resolved path and a digest of its config and weights, so a
    re-export to the same folder (other weights, same name and path) reads as another checkpoint (the
    weights are read once a run: seconds for 135M, about a minute for 7B; cells recorded before the digest
    was are refused as another's)."""
    import hashlib

    from ropescale._io import sha256_file

    folder = Path(path).resolve()
    files = sorted(f for f in folder.glob("*") if f.name == "config.json" or f.suffix in (".safetensors", ".bin"))
    digest = hashlib.sha256("".join(f"{f.name}:{sha256_file(f)};" for f in files).encode()).hexdigest()
    return f"{folder} sha256:{digest[:16]}"


def cell_identity(source: str, config) -> dict:
    """What measured a cell: the checkpoint (:func:`checkpoint_source`) or the embedded model, and the factor the
    loaded config carries, read as export-gguf reads it (so the factor is the one the GGUF was given)."""
    from ropescale.export.gguf import scaling_of

    return {"source": source, "factor": scaling_of(config)[0].factor}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import ropescale
    from ropescale._io import atomic_write_json
    from ropescale.data import load_corpus
    from ropescale.export import export_gguf
    from ropescale.export.llamacpp import perplexity_protocol_nll, run_llama_perplexity

    torch.set_num_threads(args.threads)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"cells": {}}
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = [Path(args.checkpoint).name] if args.checkpoint else [m.strip() for m in args.methods.split(",")]
    source = checkpoint_source(args.checkpoint) if args.checkpoint else MODEL  # a checkpoint carries its own scaling
    mixed = other_sources(results, [f"{m}@{n}" for n in lengths for m in methods], source, bool(args.checkpoint))
    if mixed:
        print(
            f"{results_path}: {', '.join(mixed)} measured another model (or, from before sources were recorded, cannot say which); use another --output",
            file=sys.stderr,
        )
        return 2

    emma = next(d for d in load_corpus("austen") if "emma" in d.title.lower())
    text = out / "emma.txt"
    text.write_text(emma.text, encoding="utf-8")
    tokenizer = ropescale.load_tokenizer(MODEL)
    ids = tokenizer(emma.text)["input_ids"]  # add_special_tokens=True, as llama.cpp's common_tokenize
    adds_bos = len(ids) > len(tokenizer(emma.text, add_special_tokens=False)["input_ids"])
    bos = tokenizer.bos_token_id if adds_bos else None
    results.update(
        model=MODEL,
        text="Emma (austen corpus)",
        hf_tokens=len(ids),
        bos_replaced=bos is not None,
        llama_perplexity=str(args.llama_perplexity),
        threads=args.threads,
    )

    for length in lengths:
        for method in methods:
            key = f"{method}@{length}"
            if key in results["cells"]:
                continue
            factor = max(1.0, length / TRAINED)  # below the trained context (quick checks): unscaled
            kwargs = {} if method == "none" or args.checkpoint else {"method": method, "factor": factor}
            model = ropescale.from_pretrained(
                args.checkpoint or MODEL, dtype=torch.float32, attn_implementation="sdpa", **kwargs
            )
            gguf = out / f"{method}-{length}.gguf"
            export_gguf(model, gguf, "f32", tokenizer=tokenizer, overwrite=True)
            if "tokens" not in results:
                results["tokens"] = check_tokens(args.llama_perplexity, gguf, text, ids, max(lengths))
                print(f"tokens: {results['tokens']}", flush=True)
            start = time.perf_counter()
            ppl_cpp, pm, log = run_llama_perplexity(args.llama_perplexity, gguf, text, length, args.threads, args.batch)
            cpp_s = time.perf_counter() - start
            (out / f"{method}-{length}.log").write_text(log)
            start = time.perf_counter()
            nll, n = perplexity_protocol_nll(model, ids, length, bos)
            ours_s = time.perf_counter() - start
            ppl_ours = math.exp(nll / n)
            results["cells"][key] = {
                "method": method,
                "length": length,
                **cell_identity(source, model.config),
                "ropescale_ppl": ppl_ours,
                "llama_cpp_ppl": ppl_cpp,
                "llama_cpp_pm": pm,
                "ratio": ppl_cpp / ppl_ours,
                "scored_tokens": n,
                "ropescale_s": round(ours_s, 1),
                "llama_cpp_s": round(cpp_s, 1),
            }
            atomic_write_json(results_path, results)
            print(
                f"{key}: ropescale {ppl_ours:.4f}  llama.cpp {ppl_cpp:.4f}  ratio {ppl_cpp / ppl_ours:.4f}", flush=True
            )
            if not args.keep_gguf:
                gguf.unlink()
            del model
    print(table(results))
    return 0


def table(results: dict) -> str:
    """method × length: ropescale PPL, llama.cpp PPL, ratio."""
    from ropescale import markdown

    rows = [
        [c["method"], c["length"], f"{c['factor']:g}", f"{c['ropescale_ppl']:.3f}", f"{c['llama_cpp_ppl']:.3f}"]
        + [f"{c['ratio']:.4f}"]
        for c in sorted(results["cells"].values(), key=lambda c: (c["length"], c["method"]))
    ]
    heads = ["method", "length", "factor", "ropescale PPL", "llama.cpp PPL", "llama.cpp / ropescale"]
    return markdown.table(heads, rows, align="lrrrrr")


if __name__ == "__main__":
    sys.exit(main())
