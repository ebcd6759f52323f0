"""The RULER battery beside the frontier (``ropescale eval frontier --battery DIR``): per method at the
frontier's factor, its worst RULER retention at ≤ L and its relative effective length, both over the tasks
the model can do (a task whose unscaled base is below 30 % is beyond the model: named, not counted), read
from :func:`~.ruler.report.summarize` of the battery folder's cells (:mod:`.battery_evidence`)."""

from __future__ import annotations

from dataclasses import dataclass

from ropescale.evals.advice.battery_evidence import Folder, Row
from ropescale.evals.advice.evidence import Evidence
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.markdown import table


@dataclass(frozen=True)
class MethodMeasures:
    """A battery row's measures over the tasks the model can do that it measured."""

    worst_retention: float | None  #: None where no cell at ≤ L
    effective_length_relative: int | None  #: the shortest; None where a task reaches none
    tasks: list[str]  #: the tasks counted
    limiting_task: str | None  #: the task of the shortest effective length (one reaching none first)


def method_measures(folder: Folder, row: Row) -> MethodMeasures:
    """Over the tasks the model can do that ``row`` measured: the worst retention at ≤ L (None where no cell
    at ≤ L), the shortest relative effective length (None where a task reaches none) and the tasks counted."""
    beyond = set(folder.beyond())
    measures = {t: m for t, m in folder.summary["measures"].get(row.label, {}).items() if t not in beyond}
    kept = [m["worst_retention"] for m in measures.values() if m.get("worst_retention") is not None]
    lengths = {t: m.get("effective_length_relative") for t, m in measures.items()}
    shortest = None if not lengths or None in lengths.values() else min(lengths.values())
    short_task = next((t for t, n in sorted(lengths.items()) if n is None), None) or (
        min(lengths, key=lambda t: lengths[t]) if lengths else None
    )
    return MethodMeasures(min(kept) if kept else None, shortest, sorted(measures), short_task)


def battery_section(ev: Evidence, folders: list[Folder], original_context: int, target_length: int) -> list[str]:
    """Markdown lines: one row per method of the battery at the frontier's factor N / L, titled as the
    frontier's row of the same method, factor and parameters where there is one."""
    factor = target_length / original_context
    lines = ["", "## RULER battery (the same methods on RULER's offline tasks)", ""]
    for folder in folders:
        rows = []
        for row in folder.rows.values():
            if row.kind != "method" or row.factor is None or abs(row.factor - factor) > 1e-6:
                continue
            twin = next(
                (r for r in ev.rows if r.method == row.method and r.at_factor(row.factor) and r.params == row.params),
                None,
            )
            m = method_measures(folder, row)
            worst = m.worst_retention
            eff = m.effective_length_relative
            limit = f" ({m.limiting_task})" if m.limiting_task and len(m.tasks) > 1 else ""
            shown = ("none" if m.tasks else "n/m") if eff is None else _k(eff)
            rows.append(
                [
                    twin.title if twin else folder.title(row),
                    "n/m" if worst is None else f"{worst:.1f} %",
                    shown + (limit if m.tasks else ""),
                    ", ".join(m.tasks) or "none",
                ]
            )
        lines.append(f"Cells: {folder.source}.")
        lines.append("")
        if rows:
            heads = [
                "method",
                "worst RULER retention ≤ L",
                "effective length (85 % of base, shortest)",
                "tasks counted",
            ]
            lines.append(table(heads, rows))
        else:
            lines.append(f"No cell of a method at ×{factor:g} in this folder.")
        beyond = folder.beyond()
        lines += [
            "",
            f"Beyond the model at any length (unscaled base < 30 %, not counted): {', '.join(beyond) or 'none'}.",
        ]
        if not folder.base():
            lines += [
                "",
                "No unscaled cells in this folder: no retention, and effective length against each method's own score.",
            ]
        lines += [f"Skipped: {s}" for s in folder.skipped]
    lines += [
        "",
        "Retention: a method's RULER score at each length ≤ L as % of the unscaled model's (LongRoPE2's bar 98.5 %), "
        "the worst over tasks and lengths; effective length: the longest length scoring ≥ 85 % of the unscaled "
        "model's mean at ≤ L (NoLiMa's rule), the shortest over tasks; n/m: not measured (docs/battery.md).",
    ]
    return lines


__all__ = ["MethodMeasures", "battery_section", "method_measures"]
