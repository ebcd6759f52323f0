"""RULER battery cells at one length, method beside method on the same prompts (issue 54, part 3).

For each task: every method's score at ``--length`` with its 95 % Wilson interval and its share of the
unscaled model's score at ``--base-length``; then, for every pair of methods, the prompts each scored
higher than the other and the exact two-sided p of that split (McNemar's test where a prompt scores 0 or
1; the sign test for the multi-value task, whose prompts score the share of their values found). Two
cells are paired only where they hold the same prompts, checked by each prompt's expected answers.

    python benchmarks/battery_pairs.py                                            # the shipped battery at 16k
    python benchmarks/battery_pairs.py evals/measured/finetune-cpu-x2/ruler/yarn  # and the x2 fine-tune's cells
    python benchmarks/battery_pairs.py --length 32768 --tasks "niah_single_2[austen]"

Reads the cell files only (both layouts: one file per task, or the suite runner's one per length); loads
no model. Cells of another prompt format than the plain one, and unfinished ones, are left out.
"""

from __future__ import annotations

import argparse
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATTERY = ROOT / "evals" / "measured" / "ruler" / "smollm2-135m-x4-cpu"
TASKS = "niah_single_1,niah_single_2[austen],niah_multikey_1[austen],niah_multivalue[austen]"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="*", type=Path, help="more cell folders (a run's, or a fine-tune's shipped cells)")
    ap.add_argument("--battery", type=Path, default=BATTERY, help="the battery folder with the unscaled model's cells")
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--base-length", type=int, default=4096, help="where the unscaled model's score is the base")
    ap.add_argument("--tasks", default=TASKS, help="comma-separated tasks (the four countable ones by default)")
    return ap.parse_args(argv)


def cells_by_task(folders: list[Path], battery: Path) -> dict[tuple[str, int], dict[str, object]]:
    """``(task, length) -> {row name: cell}``; a row of an extra folder is named with its folder."""
    from ropescale.evals.report.ruler_folder import load_ruler_cells

    out: dict[tuple[str, int], dict[str, object]] = {}
    for folder in [battery, *folders]:
        for c in load_ruler_cells(folder):
            if c.prompt != "plain" or not c.complete:
                continue
            name = c.label if folder == battery else f"{c.label} [{folder}]"
            out.setdefault((c.task, c.length), {})[name] = c
    return out


def pair(a, b) -> tuple[int, int, float] | None:
    """Prompts ``a`` scored higher, prompts ``b`` did, and the exact p; None where the prompts differ."""
    from ropescale.evals.tasks.proportions import paired_split

    ra = sorted(a.result.records, key=lambda r: r.index)
    rb = sorted(b.result.records, key=lambda r: r.index)
    if [r.outputs for r in ra] != [r.outputs for r in rb]:
        return None
    return paired_split([r.score for r in ra], [r.score for r in rb])


def main(argv=None) -> int:
    from ropescale.evals.tasks.proportions import wilson_interval

    args = parse_args(argv)
    by = cells_by_task(args.folders, args.battery)
    for task in [t for t in args.tasks.split(",") if t]:
        base = by.get((task, args.base_length), {}).get("none")
        rows = by.get((task, args.length), {})
        b = base.score if base is not None else None
        print(
            f"== {task} at {args.length}: unscaled at {args.base_length} "
            + ("not measured" if b is None else f"{100 * b:.1f}")
        )
        for name, c in sorted(rows.items()):
            n = len(c.result.records)
            lo, hi = wilson_interval(c.score * n, n)
            share = "" if not b else f", {100 * c.score / b:.0f} % of base"
            print(f"  {name}: {100 * c.score:.1f} [{100 * lo:.0f}, {100 * hi:.0f}]{share}")
        for x, y in combinations(sorted(rows), 2):
            got = pair(rows[x], rows[y])
            said = "not the same prompts" if got is None else f"{got[0]} / {got[1]}, p = {got[2]:.2g}"
            print(f"  {x} vs {y}: {said}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
