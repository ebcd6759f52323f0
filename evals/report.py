"""Aggregating a suite's cells into ``results.json``, a Markdown report and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text
from ..plots.curves import plot_perplexity_curves
from ..plots.grids import plot_accuracy_grid

PPL_CONVENTIONS = {
    "yarn": "sliding window, stride {stride}: each token scored once with up to a window of context "
    "(PI/YaRN convention); PPL is token-weighted, the papers' mean over windows is also given",
    "longlora": "windows every {stride} tokens, every token of every window scored (LongLoRA convention)",
    "nonoverlap": "non-overlapping windows (lm-eval rolling convention)",
}


def _load_cells(output: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((output / "cells").glob("*.json"))]


NOT_RUN = "n/r"


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}" if x < 1e4 else f"{x:.3g}"


def write_report(suite, output: str | Path) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and plots for whatever cells exist; return the summary."""
    output = Path(output)
    cells = _load_cells(output)
    labels = [m.label for m in suite.methods]
    entries = {m.label: m for m in suite.methods}
    runtimes = sorted({json.dumps(c["runtime"], sort_keys=True) for c in cells if "runtime" in c})
    runtime = (
        ", ".join("{device} / {dtype} / {attention}".format(**json.loads(r)) for r in runtimes)
        or f"dtype {suite.dtype}"
    )
    summary: dict[str, Any] = {
        "suite": suite.name,
        "model": suite.model,
        "dtype": suite.dtype,
        "runtimes": [json.loads(r) for r in runtimes],
        "tasks": {},
    }
    lines = [
        f"# {suite.name}: {suite.model}",
        "",
        f"{runtime}; data `{suite.data or 'austen'}`; methods: "
        + ", ".join(
            f"{m.label} ({m.method}{f' ×{m.factor:g}' if m.factor else ''}"
            + (f", {m.params}" if m.params else "")
            + ")"
            for m in suite.methods
        ),
        "",
    ]
    if suite.note:
        lines += [suite.note, ""]
    plots: list[str] = []
    for task in suite.tasks():
        settings = getattr(suite, task)
        lengths = settings["lengths"]
        table: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in labels}
        for cell in cells:
            if cell["task"] == task and cell["method"] in table:
                table[cell["method"]][cell["length"]] = cell["result"]
        summary["tasks"][task] = {label: {str(n): r for n, r in rows.items()} for label, rows in table.items()}
        header = "| method | " + " | ".join(f"{n:,}" for n in lengths) + " |"
        rule = "|---|" + "---|" * len(lengths)
        if task == "perplexity":
            r0 = next((r for rows in table.values() for r in rows.values()), {})
            mode = r0.get("mode", settings.get("mode", "yarn"))
            lines += [
                "## Perplexity",
                "",
                "Convention: "
                + PPL_CONVENTIONS.get(mode, mode).format(stride=r0.get("stride", "?"))
                + f"; BOS before every window; up to {settings.get('max_tokens') or 'four windows of'} tokens scored per cell.",
                "",
                "Token-weighted perplexity (lower is better):",
                "",
                header,
                rule,
            ]
            for label in labels:
                lines.append(
                    f"| {label} | "
                    + " | ".join(
                        _fmt(table[label].get(n, {}).get("ppl")) if entries[label].runs(task, n) else NOT_RUN
                        for n in lengths
                    )
                    + " |"
                )
            if mode != "nonoverlap":
                lines += ["", "Mean over windows, exp(mean window NLL) as in the YaRN paper:", "", header, rule]
                for label in labels:
                    lines.append(
                        f"| {label} | "
                        + " | ".join(
                            _fmt(table[label].get(n, {}).get("mean_window_ppl"))
                            if entries[label].runs(task, n)
                            else NOT_RUN
                            for n in lengths
                        )
                        + " |"
                    )
            scored = {
                n: max((table[lb].get(n, {}).get("tokens_scored", 0) for lb in labels), default=0) for n in lengths
            }
            lines += ["", "Tokens scored per cell: " + ", ".join(f"{n:,}: {scored[n]:,}" for n in lengths), ""]
            plots.append(_plot_ppl(output, table, labels, lengths))
        else:
            name = "Passkey retrieval" if task == "passkey" else f"Needle suite ({settings.get('task', 'niah_single')})"
            thresholds = sorted({_threshold(task, r) for rows in table.values() for r in rows.values()})
            at_least = " / ".join(f"{t:g}" for t in thresholds)
            context_rule = f" Context: the largest length with accuracy ≥ {at_least}." if thresholds else ""
            lines += [
                f"## {name}",
                "",
                f"Accuracy over depths {settings.get('depths', [0.5])} × {settings.get('trials', 1)} trial(s) "
                "per length; greedy decoding with the KV cache"
                + ("; first integer must equal the key." if task == "passkey" else "; RULER string match.")
                + context_rule,
                "",
                header + " context |",
                rule + "---|",
            ]
            for label in labels:
                accs = {n: _mean_accuracy(table[label][n]) for n in lengths if n in table[label]}
                ok = [n for n, a in accs.items() if a >= _threshold(task, table[label][n])]
                lines.append(
                    f"| {label} | "
                    + " | ".join(_fmt(accs.get(n)) if entries[label].runs(task, n) else NOT_RUN for n in lengths)
                    + f" | {max(ok) if ok else '—'} |"
                )
            lines.append("")
            plots += _plot_grids(output, task, table, labels, lengths)
    plots = [p for p in plots if p]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).relative_to(output)})" for p in plots] + [""]
    done = sum(1 for c in cells if c["method"] in entries and entries[c["method"]].runs(c["task"], c["length"]))
    total = len(suite.cells())
    if total < sum(len(getattr(suite, t)["lengths"]) for t in suite.tasks()) * len(labels):
        lines.append(f"{NOT_RUN}: not run for that method (the suite's `only`).")
        lines.append("")
    lines.append(f"_{done}/{total} cells finished._")
    summary["plots"] = plots
    summary["cells_finished"], summary["cells_total"] = done, total
    atomic_write_json(output / "results.json", summary)
    atomic_write_text(output / "report.md", "\n".join(lines) + "\n")
    summary["report"] = str(output / "report.md")
    summary["markdown"] = "\n".join(lines)
    return summary


def _threshold(task: str, result: dict[str, Any]) -> float:
    """The accuracy a length needs to count towards the context: the one its result recorded."""
    if "threshold" in result:
        return float(result["threshold"])
    if task == "passkey":  # cells written without a threshold: the engine's default
        from .passkey import PASS_THRESHOLD

        return PASS_THRESHOLD
    from .needle import RULER_THRESHOLD

    return RULER_THRESHOLD


def _mean_accuracy(result: dict[str, Any]) -> float:
    grid = result.get("accuracy") or [[0.0]]
    values = [v for row in grid for v in row]
    return sum(values) / len(values)


def _plot_ppl(output: Path, table, labels, lengths) -> str | None:
    curves = {label: {n: table[label][n]["ppl"] for n in lengths if n in table[label]} for label in labels}
    path = plot_perplexity_curves(curves, lengths, output / "perplexity_vs_length.png")
    return None if path is None else str(path)


def _plot_grids(output: Path, task: str, table, labels, lengths) -> list[str]:
    """One heatmap per method: lengths × depths, accuracy in each cell."""
    paths = []
    for label in labels:
        rows = [n for n in lengths if n in table[label]]
        if not rows:
            continue
        depths = table[label][rows[0]]["depths"]
        grid = [[table[label][n]["accuracy"][0][j] for n in rows] for j in range(len(depths))]  # [depth][length]
        paths.append(str(plot_accuracy_grid(rows, depths, grid, output / f"{task}_{label}.png", f"{task}: {label}")))
    return paths
