"""The frontier's bar read part by part with point estimates (:mod:`.frontier` reads it with intervals),
and rows shown beside a frontier without competing in it."""

from __future__ import annotations

from dataclasses import replace

from ropescale.evals.advice.evidence import Evidence
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.frontier_verdict import FrontierVerdict, Reference
from ropescale.markdown import table


def bar_parts(v: FrontierVerdict, ref: Reference, tolerance: float = 0.01) -> dict[str, tuple[bool | None, str]]:
    """Each part of the bar read with point estimates, as ``{part: (met, shown)}`` (met None: not
    measured): perplexity beyond L within ``tolerance`` of native at L, perplexity within L within
    ``tolerance`` of native at the same length, and the passkey accuracy at each measured length at
    least the native one it is read against (:meth:`Reference.passkey_bar`)."""
    out: dict[str, tuple[bool | None, str]] = {}
    for part, ratio in (("PPL beyond L", v.ppl_ratio), ("PPL within L", v.short_ratio)):
        out[part] = (None, "n/m") if ratio is None else (ratio <= 1 + tolerance, f"{ratio:.3f}×")
    for n, acc, trials, _ in v.passkey_cells:
        bar = ref.passkey_bar(n)
        shown = f"{acc:.2f}" + (f" ({round(acc * trials)}/{trials})" if trials else "")
        out[f"passkey {_k(n)}"] = (None if bar is None else acc >= bar, shown)
    return out


def bar_table(found: list[FrontierVerdict], ref: Reference, tolerance: float, original_context: int) -> list[str]:
    """The bar part by part (:func:`bar_parts`), one row per method: ✓ met, ✗ not, n/m not measured."""
    lengths = sorted({n for v in found for n, *_ in v.passkey_cells})
    heads = [
        f"PPL beyond {_k(original_context)} ≤ {1 + tolerance:g}× native {_k(ref.ppl_length)}",
        f"PPL ≤ {_k(original_context)} ≤ {1 + tolerance:g}× native",
    ]
    for n in lengths:
        bar = ref.passkey_bar(n)
        heads.append(f"passkey {_k(n)} ≥ {bar:.2f}" if bar is not None else f"passkey {_k(n)}")
    rows = []
    for v in sorted(found, key=lambda v: (not v.keeps_both, v.ppl_ratio or float("inf"))):
        parts = bar_parts(v, ref, tolerance)
        keys = ["PPL beyond L", "PPL within L", *(f"passkey {_k(n)}" for n in lengths)]
        shown = []
        for key in keys:
            met, text = parts.get(key, (None, "n/m"))
            shown.append("n/m" if text == "n/m" else f"{'✓' if met else '✗'} {text}")
        rows.append([v.row.title, *shown])
    return [
        "The bar, part by part (point estimates; ✓ met, ✗ not met, n/m not measured):",
        "",
        table(["method", *heads], rows),
    ]


def with_rows(ev: Evidence, extra: Evidence) -> Evidence:
    """``ev`` with the rows of ``extra`` whose labels it lacks (same protocol assumed: the caller
    says so), each keeping its budget: a fine-tuned model shown beside the training-free frontier.
    Its rows are never :func:`frontier_choice`'s candidates."""
    have = {r.label for r in ev.rows}
    rows = [replace(r, budget=extra.budget) if r.budget == "training-free" else r for r in extra.rows]
    added = tuple(r for r in rows if r.label not in have)
    if not added:
        return ev
    note = f"{ev.note}; {', '.join(r.label for r in added)} ({extra.budget}) from {extra.source}"
    return replace(ev, rows=ev.rows + added, note=note)
