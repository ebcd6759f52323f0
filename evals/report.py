"""Aggregating a suite's cells into ``results.json``, a Markdown report and PNG plots."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale.models.runtime import runtime_text
from ropescale.plots.curves import plot_perplexity_curves
from ropescale.plots.grids import plot_accuracy_grid

PPL_CONVENTIONS = {
    "yarn": "sliding window, stride {stride}: each token scored once with up to a window of context "
    "(PI/YaRN convention); PPL is token-weighted, the papers' mean over windows is also given",
    "longlora": "windows every {stride} tokens, every token of every window scored (LongLoRA convention)",
    "nonoverlap": "non-overlapping windows (lm-eval rolling convention)",
}


def _load_cells(output: Path) -> list[dict[str, Any]]:
    """Every cell file of a results folder; a damaged one (a copy cut short) is named, not a parser position."""
    from ropescale.evals.cell_keys import CELL_REMEDY
    from ropescale.models.integrity import read_json_file

    return [read_json_file(p, "cell file", CELL_REMEDY) for p in sorted((output / "cells").glob("*.json"))]


NOT_RUN = "n/r"


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}" if x < 1e4 else f"{x:.3g}"


@dataclass
class TaskTable:
    """One task of a suite, computed: every method's result per length (and, for retrieval tasks, its
    statistics per length). Rendering and plotting read it; nothing here formats text."""

    task: str
    settings: dict[str, Any]
    lengths: list[int]
    table: dict[str, dict[int, dict[str, Any]]]  # label -> length -> cell result
    stats: dict[str, dict[int, dict[str, Any]]] | None = None  # retrieval: label -> length -> statistics

    @property
    def kind(self):
        """The task's row in :mod:`.task_table` (how it renders, plots, and what it measures)."""
        from ropescale.evals import task_table

        return task_table.get(self.task)

    @property
    def retrieval(self) -> bool:
        return self.kind.retrieval


def collect(suite, cells: list[dict[str, Any]]) -> list[TaskTable]:
    """Compute: the suite's cells arranged per task, method and length, with retrieval statistics."""
    labels = [m.label for m in suite.methods]
    tables = []
    for task in suite.tasks():
        settings = suite.block(task)
        table: dict[str, dict[int, dict[str, Any]]] = {label: {} for label in labels}
        for cell in cells:
            if cell["task"] == task and cell["method"] in table:
                table[cell["method"]][cell["length"]] = cell["result"]
        tt = TaskTable(task, settings, settings["lengths"], table)
        if tt.retrieval:
            tt.stats = {label: {n: retrieval_stats(table[label][n], n) for n in table[label]} for label in labels}
        tables.append(tt)
    return tables


def write_report(suite, output: str | Path, partial: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Write ``results.json``, ``report.md`` and plots for whatever cells exist; return the summary.

    ``partial``: records of unfinished retrieval cells (:func:`.in_progress.partial_cells`),
    shown with their prompts so far and marked in progress; they do not count as finished.
    """
    output = Path(output)
    finished = _load_cells(output)
    cells = finished + list(partial or [])
    entries = {m.label: m for m in suite.methods}
    runtimes = sorted({json.dumps(c["runtime"], sort_keys=True) for c in cells if "runtime" in c})
    tables = collect(suite, cells)  # compute
    from ropescale.evals.results_schema import stamp

    summary: dict[str, Any] = {
        **stamp(),
        "suite": suite.name,
        "model": suite.model,
        "dtype": suite.dtype,
        "runtimes": [json.loads(r) for r in runtimes],
        # what each label ran: the file reads back without its suite.yaml (evidence.load_results); a saved
        # row as its cells read the scaling back from the model
        "methods": {m.label: _ran(m, cells) for m in suite.methods},
        **({"carries": suite.carries} if getattr(suite, "carries", None) else {}),
        "tasks": {},
    }
    if suite.passkey is not None:  # the placement its passkey numbers were measured with (0: fixed depths)
        summary["passkey_jitter"] = float(suite.settings("passkey").jitter)
    for tt in tables:
        summary["tasks"][tt.task] = {label: {str(n): r for n, r in rows.items()} for label, rows in tt.table.items()}
        if tt.stats is not None:
            summary.setdefault("statistics", {})[tt.task] = {
                label: {str(n): st for n, st in rows.items()} for label, rows in tt.stats.items()
            }
    flags, flag_lines = short_context_regressions(suite, summary)
    summary["regressions"] = flags
    plots = [p for p in plot_tables(output, tables, [m.label for m in suite.methods]) if p]  # plot
    done = sum(1 for c in finished if c["method"] in entries and entries[c["method"]].runs(c["task"], c["length"]))
    total = len(suite.cells())
    lines = render(suite, tables, runtimes, flag_lines, [str(Path(p).relative_to(output)) for p in plots], done, total)
    summary["plots"] = plots
    summary["cells_finished"], summary["cells_total"] = done, total
    atomic_write_json(output / "results.json", summary)
    atomic_write_text(output / "report.md", "\n".join(lines) + "\n")
    summary["report"] = str(output / "report.md")
    summary["markdown"] = "\n".join(lines)
    return summary


def _ran(entry, cells: list[dict[str, Any]]) -> dict[str, Any]:
    """What a label ran: its entry, or for ``saved`` the scaling its cells read back from the model
    (``{"method": "yarn", "factor": 4.0, "params": {...}, "as": "saved"}``; ``saved`` before any cell)."""
    if entry.method == "saved":
        for cell in cells:
            scaling = cell.get("scaling")
            if cell.get("method") == entry.label and isinstance(scaling, dict) and scaling.get("method"):
                params = {k: v for k, v in (scaling.get("params") or {}).items() if k != "factor" and v is not None}
                return {"method": scaling["method"], "factor": scaling.get("factor"), "params": params, "as": "saved"}
    return {"method": entry.method, "factor": entry.factor, "params": dict(entry.params)}


def plot_tables(output: Path, tables: list[TaskTable], labels: list[str]) -> list[str | None]:
    """Plot: perplexity against length, one accuracy grid per method and retrieval task."""
    plots: list[str | None] = []
    for tt in tables:
        plots += tt.kind.plot(output, tt, labels)
    return plots


def _method_text(m) -> str:
    """A method entry as the header lists it: its label, then what it runs where the label does not say it
    (a ``saved`` row's label already names the scaling it carries)."""
    detail = m.method + (f" ×{m.factor:g}" if m.factor else "") + (f", {m.params}" if m.params else "")
    return m.label if m.method == "saved" or m.label == detail else f"{m.label} ({detail})"


def render(suite, tables: list[TaskTable], runtimes, flag_lines, plots, done: int, total: int) -> list[str]:
    """Render: the Markdown report's lines (header, one section per task, regressions, plots, progress)."""
    labels = [m.label for m in suite.methods]
    runtime = ", ".join(runtime_text(json.loads(rt)) for rt in runtimes) or f"dtype {suite.dtype}"
    lines = [
        f"# {suite.name}: {suite.model}",
        "",
        f"{runtime}; data `{suite.data or 'austen'}`; methods: " + ", ".join(_method_text(m) for m in suite.methods),
        "",
    ]
    carries = getattr(suite, "carries", None)
    if carries:
        lines += [
            f"The checkpoint carries **{carries}**: a `(saved)` row runs it as saved; `none (scaling removed)` "
            "runs the original RoPE; a row naming another method replaces the saved scaling (from the original RoPE). "
            "Each cell records the scaling it ran, read back from the model (`scaling` in cells/*.json).",
            "",
        ]
    if suite.note:
        lines += [suite.note, ""]
    entries = {m.label: m for m in suite.methods}
    for tt in tables:
        lines += tt.kind.render(tt, labels, entries)
    lines += flag_lines
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    if total < sum(len(suite.block(t)["lengths"]) for t in suite.tasks()) * len(labels):
        lines.append(f"{NOT_RUN}: not run for that method (the suite's `only`).")
        lines.append("")
    lines.append(f"_{done}/{total} cells finished._")
    return lines


def _header(lengths: list[int]) -> tuple[str, str]:
    return "| method | " + " | ".join(f"{n:,}" for n in lengths) + " |", "|---|" + "---|" * len(lengths)


def render_values(kind, tt: TaskTable, labels: list[str], entries) -> list[str]:
    """A task's section from its row alone: its ``metric`` per method and length (a task with no
    renderer of its own, :meth:`.task_base.Task.render`)."""
    header, rule = _header(tt.lengths)
    better = "higher" if kind.higher_is_better else "lower"
    lines = [f"## {kind.name}", "", f"{kind.metric} ({better} is better):", "", header, rule]
    for label in labels:
        cells = (
            (_fmt(kind.value(tt.table[label][n], n)) if n in tt.table[label] else "—")
            if entries[label].runs(tt.task, n)
            else NOT_RUN
            for n in tt.lengths
        )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def _render_perplexity(tt: TaskTable, labels: list[str], entries) -> list[str]:
    table, lengths, settings, task = tt.table, tt.lengths, tt.settings, tt.task
    header, rule = _header(lengths)
    r0 = next((r for rows in table.values() for r in rows.values()), {})
    mode = r0.get("mode", settings.get("mode", "yarn"))
    lines = [
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

    def row(label: str, key: str) -> str:
        cells = (_fmt(table[label].get(n, {}).get(key)) if entries[label].runs(task, n) else NOT_RUN for n in lengths)
        return f"| {label} | " + " | ".join(cells) + " |"

    lines += [row(label, "ppl") for label in labels]
    if mode != "nonoverlap":
        lines += ["", "Mean over windows, exp(mean window NLL) as in the YaRN paper:", "", header, rule]
        lines += [row(label, "mean_window_ppl") for label in labels]
    scored = {n: max((table[lb].get(n, {}).get("tokens_scored", 0) for lb in labels), default=0) for n in lengths}
    return lines + ["", "Tokens scored per cell: " + ", ".join(f"{n:,}: {scored[n]:,}" for n in lengths), ""]


def _render_retrieval(tt: TaskTable, labels: list[str], entries) -> list[str]:
    table, lengths, task, stats, kind = tt.table, tt.lengths, tt.task, tt.stats or {}, tt.kind
    settings = kind.read(tt.settings)
    header, rule = _header(lengths)
    thresholds = sorted({_threshold(task, r) for rows in table.values() for r in rows.values()})
    at_least = " / ".join(f"{t:g}" for t in thresholds)
    context_rule = f" Context: the largest length with accuracy ≥ {at_least}." if thresholds else ""
    lines = [
        f"## {kind.title(settings)}",
        "",
        f"Accuracy over depths {list(settings.depths)} × {settings.trials} trial(s) "
        "per length; greedy decoding with the KV cache" + kind.scoring + context_rule,
        "",
        header + " context |",
        rule + "---|",
    ]
    for label in labels:
        accs = {n: st["accuracy"] for n, st in stats[label].items()}
        ok = [  # a cell in progress says nothing yet about the context
            n for n, a in accs.items() if a >= _threshold(task, table[label][n]) and not table[label][n].get("partial")
        ]
        cells = (
            _fmt_retrieval(stats[label].get(n), table[label].get(n)) if entries[label].runs(task, n) else NOT_RUN
            for n in lengths
        )
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {max(ok) if ok else '—'} |")
    placement = kind.placement(settings, table)
    return lines + ["", "Cells: accuracy · successes/trials [95% Wilson interval]." + placement, ""]


def _placement_line(settings: Any, table: dict[str, dict[int, Any]]) -> str:
    """How independent a passkey cell's trials are: the placement, and how often the trials of one
    depth answered alike in this table (:func:`~ropescale.evals.proportions.group_agreement`)."""
    from ropescale.evals.proportions import depth_groups, group_agreement

    jitter = settings.jitter or 0
    placement = (
        f" Placement: each trial's depth drawn from depth ± {jitter:g}."
        if jitter
        else " Placement: fixed, so the trials of one depth share one position and differ only in the key."
    )
    unanimous = groups = 0
    effective: list[float] = []
    for rows in table.values():
        for result in rows.values():
            try:
                stats = group_agreement(depth_groups(result.get("records", [])))
            except ValueError:  # one depth, one trial per depth, or a cell in progress
                continue
            unanimous, groups = unanimous + stats["unanimous"], groups + stats["groups"]
            if stats["icc"] is not None:  # all right or all wrong: the cell says nothing about it
                effective.append(stats["effective_n"] / stats["n"])
    if not groups:
        return placement
    line = placement + f" In this table {unanimous} of {groups} depth groups answered alike throughout"
    if effective:
        share = sum(effective) / len(effective)
        line += (
            f"; where cells had both answers, a length's trials weighed as {share:.0%} of as many "
            "independent ones (design effect; docs/evaluation.md)"
        )
    return line + "."


def _threshold(task: str, result: dict[str, Any]) -> float:
    """The accuracy a length needs to count towards the context: the one its result recorded."""
    from ropescale.evals import task_table

    if "threshold" in result:
        return float(result["threshold"])
    return task_table.get(task).threshold()  # cells written without a threshold: the engine's default


def retrieval_stats(result: dict[str, Any], length: int) -> dict[str, Any]:
    """Accuracy, trials, successes and the 95% Wilson interval of a passkey/needle cell.

    Cells written before the intervals were recorded are recomputed from their records (or, lacking
    those, from the accuracy grid and depths × trials).
    """
    from ropescale.evals.proportions import wilson_interval

    key = str(length)
    records = [r for r in result.get("records", []) if r.get("length", length) == length]
    if key in result.get("length_trials", {}):
        trials, accuracy = int(result["length_trials"][key]), float(result["length_accuracy"][key])
    elif records:
        scores = [float(r["score"]) if "score" in r else float(bool(r["correct"])) for r in records]
        trials, accuracy = len(scores), sum(scores) / len(scores)
    else:
        trials = len(result.get("depths", [0.5])) * int(result.get("trials", 1))
        accuracy = _mean_accuracy(result)
    low, high = result.get("length_interval", {}).get(key) or wilson_interval(accuracy * trials, trials)
    return {"accuracy": accuracy, "trials": trials, "successes": accuracy * trials, "wilson95": [low, high]}


def _fmt_retrieval(stat: dict[str, Any] | None, result: dict[str, Any] | None = None) -> str:
    if stat is None:
        return "—"
    k, n = stat["successes"], stat["trials"]
    count = f"{round(k)}/{n}" if abs(k - round(k)) < 1e-9 else f"n={n}"
    low, high = stat["wilson95"]
    partial = (result or {}).get("partial")
    running = f" (in progress: {partial['prompts']} of {partial['of']} prompts)" if partial else ""
    return f"{stat['accuracy']:.2f} · {count} [{low:.2f}, {high:.2f}]{running}"


#: a perplexity more than this fraction above the unscaled model's (same tokens) is a regression
PPL_MARGIN = 0.02


def short_context_regressions(suite, summary: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Methods that lose what the unscaled model has at short contexts.

    Flagged: retrieval (passkey, needle) at the shortest length both ran, when the 95% interval of
    the accuracy difference (unscaled − method; Newcombe's, from both cells' Wilson intervals) lies
    above 0; perplexity at a length within the trained context, when the method's is more than
    :data:`PPL_MARGIN` above the unscaled model's on the same tokens (cells record summed NLLs, not
    per-token ones, so a margin stands in for an interval).

    Returns:
        ``(flags, report lines)``; each flag has ``method``, ``task``, ``length``, ``value`` and
        ``baseline`` (retrieval flags also the difference's ``interval``).
    """
    from ropescale.evals.proportions import difference_interval
    from ropescale.methods import method_class

    base = next((m for m in suite.methods if m.method != "saved" and method_class(m.method).name == "default"), None)
    lines = ["## Short-context regressions", ""]
    if base is None:
        return [], lines + ["No unscaled method (`none`) in the suite: nothing to compare against.", ""]
    flags: list[dict[str, Any]] = []
    trained = _trained_context(suite.model)
    ppl = summary["tasks"].get("perplexity", {})
    for m in suite.methods:
        if m is base:
            continue
        for task in summary.get("statistics", {}):  # the retrieval tasks
            stats = summary["statistics"][task]
            both = sorted(set(stats.get(base.label, {})) & set(stats.get(m.label, {})), key=int)
            if both:
                ref, got = stats[base.label][both[0]], stats[m.label][both[0]]
                gap = difference_interval(ref["successes"], ref["trials"], got["successes"], got["trials"])
                if gap[0] > 0:  # the unscaled model is better beyond both cells' noise
                    flags.append(_flag(m.label, task, both[0], got["accuracy"], ref["accuracy"], gap))
        for n in sorted(set(ppl.get(base.label, {})) & set(ppl.get(m.label, {})), key=int):
            if trained is not None and int(n) <= trained:
                got, ref = ppl[m.label][n]["ppl"], ppl[base.label][n]["ppl"]
                if got > ref * (1 + PPL_MARGIN):
                    flags.append(_flag(m.label, "perplexity", n, got, ref))
    context = f"{trained:,}" if trained else "(unknown)"
    lines += [
        f"Against `{base.label}`: retrieval at the shortest length (flagged when the 95% interval of the accuracy "
        f"difference, from both cells' Wilson intervals, excludes 0) and perplexity at lengths ≤ the trained "
        f"context {context} (flagged beyond +{PPL_MARGIN:.0%}).",
        "",
    ]
    for f in flags:
        if "interval" in f:
            low, high = f["interval"]
            detail = f"(difference {f['baseline'] - f['value']:+.2f}, 95% [{low:.2f}, {high:.2f}])"
        else:
            detail = f"({f['value'] / f['baseline'] - 1:+.1%})"
        lines.append(
            f"- ⚠ **{f['method']}**: {f['task']} at {int(f['length']):,} is {_fmt(f['value'])} {detail}; "
            f"unscaled {_fmt(f['baseline'])}"
        )
    if not flags:
        lines.append("- none flagged")
    return flags, lines + [""]


def _flag(method: str, task: str, length: str, value: float, baseline: float, interval=None) -> dict[str, Any]:
    flag = {"method": method, "task": task, "length": int(length), "value": value, "baseline": baseline}
    if interval is not None:
        flag["interval"] = list(interval)
    return flag


def _trained_context(model: str) -> int | None:
    """The model's trained context L, from its config (None if it cannot be read here)."""
    try:
        from ropescale.models.loading import load_config
        from ropescale.patching.plan import trained_context

        return int(trained_context(load_config(model)))
    except Exception:  # noqa: BLE001 - a report is still written without the flag's perplexity half
        return None


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
        # the union of the cells' depths: a cell in progress may have sampled only some of them
        depths = sorted({d for n in rows for d in table[label][n]["depths"]})

        def acc(n: int, d: float) -> float:
            cell = table[label][n]
            return cell["accuracy"][0][cell["depths"].index(d)] if d in cell["depths"] else math.nan

        def said(n: int, d: float) -> str | None:  # a cell in progress: correct / decoded at that depth
            cell = table[label][n]
            if not cell.get("partial") or d not in cell["depths"] or "cell_trials" not in cell:
                return None
            k = cell["cell_trials"][0][cell["depths"].index(d)]
            return f"{round(acc(n, d) * k)}/{k}"

        grid = [[acc(n, d) for n in rows] for d in depths]  # [depth][length]
        texts = [[said(n, d) for n in rows] for d in depths]
        running = any(table[label][n].get("partial") for n in rows)
        title = f"{task}: {label}" + (" (cells in progress)" if running else "")
        paths.append(str(plot_accuracy_grid(rows, depths, grid, output / f"{task}_{label}.png", title, texts)))
    return paths
