"""Where in a long window does a model pay? Perplexity of one window of held-out Emma, split by the
position of the predicted token (0-2k, 2k-4k, 4k-8k, 8k-16k, 16k-32k), for several checkpoints on the
same tokens.

Written to read the extension experiment's open question: the fine-tune with recall sentences costs
1 % perplexity at 2k and 3.4 % at 32k against the same fine-tune without them. A cost the same at every
position points at the text the sentences displace; one that grows past the trained context (8k) fits
a model that reaches far back in prose too (consistent with it, not a proof).

    python benchmarks/bench_loss_by_position.py \\
        "no sentences=runs/extension-x4-af1.07/yarn-export" \\
        "recall sentences=runs/extension-x4-af1.07-recall4/yarn-export"

Each checkpoint is loaded and scaled as the extension experiment's perplexity suite does
(``from_pretrained`` in the machine's precision, then ``patch(method, factor)``: the export's attention
factor is kept), one window of ``--length`` real tokens with BOS, every token scored; the whole-window
perplexity is printed beside the buckets, so it can be checked against the suite's cell. One JSON per
checkpoint in ``--output``, named after its label (atomic; a re-run reuses each, and refuses one measured
with another length, buckets, text, tokens, scaling or precision). Checkpoints whose tokenizers turn the
text into other tokens are refused: their ratios would compare different tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoints", nargs="+", metavar="LABEL=PATH", help="the first is the reference of the ratios")
    ap.add_argument("--length", type=int, default=32768, help="real tokens in the window (BOS extra)")
    ap.add_argument("--edges", default="2048,4096,8192,16384", help="bucket edges (token positions)")
    ap.add_argument("--data", default="austen", help="any --data value (documents with titles)")
    ap.add_argument("--document", default="Emma", help="the held-out document's title")
    ap.add_argument("--method", default="yarn")
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--output", default="runs/loss-by-position")
    return ap.parse_args(argv)


def buckets(length: int, edges: list[int]) -> list[tuple[int, int]]:
    """Half-open position ranges [a, b) of the predicted tokens, covering 0..length."""
    cuts = [0, *sorted({e for e in edges if 0 < e < length}), length]
    return list(zip(cuts, cuts[1:], strict=False))


def file_name(label: str) -> str:
    """The label as a file name inside ``--output``: anything but letters, digits, '.', '_' and '-' reads as
    '-' (so a label such as ``../x`` cannot write outside it)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip(".-") or "checkpoint"


def digest(ids) -> str:
    """What identifies the scored tokens: the first 16 hex digits of the sha256 of their ids."""
    return hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16]


def refuse(message: str) -> int:
    print(f"bench_loss_by_position: {message}", file=sys.stderr)
    return 2


def measure(path: str, ids, spans, args, runtime) -> dict:
    """Summed NLL and token count of the whole window and of each bucket (keyed 'a-b')."""
    import torch

    from ropescale.models.loading import from_pretrained
    from ropescale.patching.model import patch
    from ropescale.scoring.nll import IGNORE_INDEX, final_hidden_states, summed_nll

    model = runtime.place(from_pretrained(path, **runtime.load_kwargs())).eval()
    patch(model, args.method, factor=args.factor, replace=True)
    x = torch.tensor([ids], device=runtime.device)  # [1, 1 + length]: BOS, then the text
    with torch.inference_mode():
        hidden = final_hidden_states(model, x)
        nll = {}
        for a, b in [(0, args.length), *spans]:  # position p of the text is predicted from x[:, p]
            labels = torch.full_like(x, IGNORE_INDEX)
            labels[:, 1 + a : 1 + b] = x[:, 1 + a : 1 + b]
            total, n = summed_nll(hidden, model.lm_head, labels)
            nll[f"{a}-{b}"] = {"nll": total.item(), "tokens": n}
    return nll


def protocol(path: str, ids, spans, args, runtime) -> dict:
    """What a measurement depends on (the tokens scored, the precision as resolved here): a file measured
    otherwise is not reused."""
    keys = ("data", "document", "method", "factor")
    return (
        {"checkpoint": path, "length": args.length, "buckets": [list(s) for s in spans]}
        | {k: getattr(args, k) for k in keys}
        | {"tokens": digest(ids), "precision": runtime.dtype}
    )


def main(argv=None) -> int:
    from ropescale.markdown import table

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import ropescale as rs
    from ropescale._io import atomic_write_json
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.errors import RopescaleError
    from ropescale.models.runtime import resolve_runtime
    from ropescale.training.data import split_holdout

    pairs = [c.split("=", 1) for c in args.checkpoints]
    if any(len(p) != 2 or not p[0] for p in pairs):
        return refuse(f"checkpoints are LABEL=PATH, got {args.checkpoints!r}")
    if len({file_name(label) for label, _ in pairs}) < len(pairs):
        return refuse(f"two labels name the same file in {args.output} ({[file_name(lb) for lb, _ in pairs]})")
    spans = buckets(args.length, [int(e) for e in args.edges.split(",") if e])
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    runtime = resolve_runtime("auto", args.dtype)
    try:
        held = split_holdout(load_documents(args.data), [args.document])[1]
    except RopescaleError as exc:
        return refuse(f"--data {args.data} --document {args.document}: {exc}")
    tokens = {}  # every checkpoint's tokens first: a mismatch stops before anything is measured
    for label, path in pairs:
        tokenizer = rs.load_tokenizer(path)  # each checkpoint's own
        doc = tokenize_documents(tokenizer, held, max_tokens=args.length)[0]
        if len(doc) < args.length:
            return refuse(f"{args.document} has {len(doc)} tokens, fewer than --length {args.length}")
        tokens[label] = [tokenizer.bos_token_id, *doc[: args.length]]
        if tokens[label] != tokens[pairs[0][0]]:
            return refuse(f"{path}: its tokenizer reads {args.document} as other tokens than {pairs[0][1]}'s")
    results = {}
    for label, path in pairs:
        ids = tokens[label]
        file, asked = out / f"{file_name(label)}.json", protocol(path, ids, spans, args, runtime)
        if file.is_file():
            was = json.loads(file.read_text())
            diff = next((k for k in asked if was.get(k) != asked[k]), None)
            if diff:
                return refuse(
                    f"{file} was measured with {diff} {was.get(diff)!r}, not {asked[diff]!r}: use another --output"
                )
        else:
            atomic_write_json(file, {**asked, "nll": measure(path, ids, spans, args, runtime)})
        results[label] = json.loads(file.read_text())
    ppl = {k: {s: math.exp(v["nll"] / v["tokens"]) for s, v in r["nll"].items()} for k, r in results.items()}
    ref = pairs[0][0]
    keys = [f"0-{args.length}", *(f"{a}-{b}" for a, b in spans)]
    print(f"perplexity by position of the predicted token, one {args.length}-token window of held-out {args.document}")
    rows = [
        [
            label,
            *(
                f"{ppl[label][k]:.2f}" + (f" ({ppl[label][k] / ppl[ref][k]:.3f}×)" if label != ref else "")
                for k in keys
            ),
        ]
        for label in ppl
    ]
    print(table(["model", *(f"{k} (whole)" if i == 0 else k for i, k in enumerate(keys))], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
