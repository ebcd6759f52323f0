"""The table of issue 51's point 5: an already extended model taken further three ways (as shipped,
composed on its scaling, replaced from the pretraining frequencies), perplexity on the same windows.

    python benchmarks/shipped_ppl_table.py evals/measured/shipped-yarn2

Reads the suite's perplexity cells (``cells/*__perplexity__N.json``; every row scored the same windows, so
the comparison is paired) and prints, per length, each row's perplexity and, for composed against
replaced, the ratio of their perplexities with a 95 % interval from the per-window differences of mean
NLL (Student's t over the windows; the ratio is exp of the mean difference).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the drivers beside it, run from anywhere
from extension_cpu_goal import window_ratio  # noqa: E402


def cells(folder: Path) -> dict[tuple[str, int], dict]:
    """(row label, length) -> the cell's result (window NLLs and token counts included)."""
    from ropescale.evals.report.cell_record import load_cells

    return {(c.label, c.length): c.result_json for c in load_cells(folder) if c.task == "perplexity"}


def leading(result: dict, tokens: int | None) -> dict:
    """``result`` restricted to its leading windows within the first ``tokens`` tokens scored (None: all).

    A suite's ``max_tokens`` cuts each document, not the cell: ``smollm2-shipped-yarn2`` scores Emma's first
    131,072 tokens and then 55,608 of the next novel (Mansfield Park, which the fine-tunes trained on). The
    windows come in document order, so ``--first 131072`` keeps Emma's alone."""
    if tokens is None:
        return result
    keep, total = 0, 0
    for n in result["window_tokens"]:
        if total + n > tokens:
            break
        keep, total = keep + 1, total + n
    nll, counts = result["window_nll"][:keep], result["window_tokens"][:keep]
    return {
        **result,
        "window_nll": nll,
        "window_tokens": counts,
        "total_nll": sum(nll),
        "tokens_scored": total,
        "ppl": math.exp(sum(nll) / total),
    }


def paired_ratio(a: dict, b: dict) -> tuple[float, float, float, int]:
    """PPL(a) / PPL(b) and its 95 % interval, from the per-window differences of mean NLL
    (``extension_cpu_goal.window_ratio``; one window: no interval, nan)."""
    if a["window_tokens"] != b["window_tokens"]:
        raise SystemExit("the two rows did not score the same windows")
    paired = window_ratio(a, b)
    if paired is None:  # a single window: no spread to measure
        return math.exp((a["total_nll"] - b["total_nll"]) / a["tokens_scored"]), math.nan, math.nan, 1
    return paired


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--composed", default="yarn x2 on the shipped yarn x2 (composed)")
    ap.add_argument("--replaced", default="yarn x4 from 8k (replaced)")
    ap.add_argument("--shipped", default="yarn x2 (saved)")
    ap.add_argument("--first", type=int, default=None, help="only the windows within the first N tokens scored")
    args = ap.parse_args(argv)
    got = {key: leading(r, args.first) for key, r in cells(args.folder).items()}
    lengths = sorted({n for _, n in got})
    rows = [args.shipped, args.composed, args.replaced]
    print("| length | " + " | ".join(rows) + " | composed / replaced (95 %, windows) |")
    print("|---" * (len(rows) + 2) + "|")
    for n in lengths:
        ppl = [f"{got[r, n]['ppl']:.2f}" if (r, n) in got else "not measured" for r in rows]
        if (args.composed, n) in got and (args.replaced, n) in got:
            ratio, low, high, k = paired_ratio(got[args.composed, n], got[args.replaced, n])
            paired = f"{ratio:.4f} [{low:.4f}, {high:.4f}], {k} windows"
        else:
            paired = "not measured"
        print(f"| {n:,} | " + " | ".join(ppl) + f" | {paired} |")


if __name__ == "__main__":
    main()
