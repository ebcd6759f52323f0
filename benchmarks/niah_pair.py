"""Two RULER cells of the same prompts compared: each one's score with its Wilson interval, the
difference with Newcombe's interval (as the suite report computes it, unpaired, so conservative), and
the discordant prompts a paired reading rests on (McNemar's exact test over them).

    python benchmarks/niah_pair.py COMPOSED.json REPLACED.json

Both cells must hold the same prompts (model, task, length, samples, seed: RULER's generators draw the
same haystack and needles for each), which is checked by each prompt's expected answer. Issue 51 point 5
compares a method composed on a shipped scaling with the same method replacing it this way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _records(path: Path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    cell = data.get("cell") or data.get("result") or {}
    if "records" not in cell and "tasks" in cell:  # a suite cell: its one task
        (cell,) = cell["tasks"].values()
    return sorted(cell["records"], key=lambda r: r["index"])


def main(argv=None) -> int:
    from ropescale.evals.tasks.proportions import difference_interval, paired_split, wilson_interval

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    a, b = _records(args.a), _records(args.b)
    if [r["outputs"] for r in a] != [r["outputs"] for r in b]:
        raise SystemExit("niah_pair: the two cells do not hold the same prompts (their expected answers differ)")
    ka, kb, n = sum(r["score"] == 1.0 for r in a), sum(r["score"] == 1.0 for r in b), len(a)
    only_a, only_b, p = paired_split([float(r["score"] == 1.0) for r in a], [float(r["score"] == 1.0) for r in b])
    for name, k in ((args.a.name, ka), (args.b.name, kb)):
        lo, hi = wilson_interval(k, n)
        print(f"{name}: {k}/{n} = {k / n:.1%} [{lo:.0%}, {hi:.0%}]")
    lo, hi = difference_interval(ka, n, kb, n)
    print(f"difference (first - second): {(ka - kb) / n:+.1%}, 95% [{lo:+.1%}, {hi:+.1%}] (Newcombe, unpaired)")
    print(
        f"discordant prompts: {only_a} found by the first only, {only_b} by the second only; McNemar exact p = {p:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
