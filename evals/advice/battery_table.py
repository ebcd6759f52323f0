"""``ropescale recommend --verbose``'s battery table: every row of every battery folder the recommendation read.

The rows, scores and comparisons are :mod:`.battery_evidence`'s (its :class:`~.records.BatteryRecord`); this
module only lays them out: per folder, one line per scaling and task with each length's score, its share of
the unscaled base, the relative effective length and the worst retention at ≤ L, then which method holds
across tasks at each length past L.
"""

from __future__ import annotations

from ropescale.evals.advice.battery_evidence import _floor, _share, _worst
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.records import BatteryRecord, Comparison


def battery_table(record: BatteryRecord) -> list[str]:
    """``--verbose``: per folder, one line per scaling and task, each length's score with its share of
    the base, the relative effective length and the worst retention at ≤ L; then what holds and what
    was skipped."""
    lines = []
    for f in record["folders"]:
        lengths = sorted({int(n) for r in f["rows"] for by in r["tasks"].values() for n in by})
        width = max([len(r["title"]) for r in f["rows"]] + [8])
        twidth = max([len(t) for r in f["rows"] for t in r["tasks"]] + [4])
        lines += ["", f"battery: {f['source']} (RULER score %, n, and % of the unscaled base at ≤ L)"]
        head = f"  {'scaling':<{width}}  {'task':<{twidth}}" + "".join(f"{_k(n):>20}" for n in lengths)
        lines.append(head + f"{f'effective ({_share()} of base)':>26}{'worst retention ≤ L':>21}")
        for r in f["rows"]:
            for task, by in r["tasks"].items():
                cells = []
                for n in lengths:
                    e = by.get(str(n))
                    pct = "" if e is None or e["of_base"] is None else f" ({e['of_base']:.0f} %)"
                    text = "—" if e is None else f"{e['score']:.1f} n={e['samples']}{pct}"
                    cells.append(f"{text:>20}")
                m = r["measures"].get(task, {})
                eff = m.get("effective_length_relative")
                worst = m.get("worst_retention")
                lines.append(
                    f"  {r['title']:<{width}}  {task:<{twidth}}"
                    + "".join(cells)
                    + f"{_k(eff) if eff else 'none':>26}{'' if worst is None else f'{worst:.1f} %':>21}"
                )
        if f["beyond_the_model"]:
            lines.append(
                f"  beyond the model at any length (base < {_floor()}, not counted): {', '.join(f['beyond_the_model'])}"
            )
        lines += [f"  skipped: {s}" for s in f["skipped"]]
        lines += _holds_lines(f["holds"])
    return lines


def _holds_lines(comparisons: list[Comparison]) -> list[str]:
    lines = []
    for c in comparisons:
        worst = ", ".join(f"{m} {_worst(c, m)}" for m in c["worst"])
        who = " and ".join(c["holds"]) or f"none ({_share()} of base on each task)"
        lines.append(f"  holds across tasks at {_k(c['length'])} ({', '.join(c['tasks'])}): {who} (worst: {worst})")
    return lines


__all__ = ["battery_table"]
