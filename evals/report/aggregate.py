"""Aggregating a suite's cells into ``results.json``, a Markdown report and PNG plots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale.evals.report.cell_record import SuiteCell, load_cells
from ropescale.evals.report.records import RegressionFlag, ResultsJSON, ScalingJSON, Settings
from ropescale.evals.tasks.report_cells import NOT_RUN, PlotContext, RetrievalStats, fmt, plot_grids, retrieval_stats
from ropescale.models.runtime import runtime_text

_plot_grids = plot_grids  # the name tests and older callers import


def _load_cells(output: Path) -> list[SuiteCell]:
    """Every cell file of a results folder, as records; a damaged one (a copy cut short, a key missing or of
    the wrong type) or a newer one is named in one line (:func:`.cell_record.load_cells`)."""
    return load_cells(output)


@dataclass
class TaskTable:
    """One task of a suite, computed: every method's cell per length (and, for retrieval tasks, its
    statistics per length). Rendering and plotting read it; nothing here formats text."""

    task: str
    settings: Settings  # the task's block as the suite wrote it
    lengths: list[int]
    cells: dict[str, dict[int, SuiteCell]]  # label -> length -> cell
    stats: dict[str, dict[int, RetrievalStats]] | None = None  # retrieval: label -> length -> statistics
    kind: Any = None  # the task's row in .task_table: how it renders, plots, and what it measures

    @property
    def retrieval(self) -> bool:
        return self.kind.retrieval

    @cached_property
    def table(self) -> dict[str, dict[int, dict[str, Any]]]:
        """label -> length -> the cell's result as its file holds it (what ``results.json`` writes)."""
        return {label: {n: cell.result_json for n, cell in rows.items()} for label, rows in self.cells.items()}

    @cached_property
    def results(self) -> dict[str, dict[int, Any]]:
        """label -> length -> the cell's typed result, an instance of the task's ``result`` (what the task
        rows' renderers and plots read, by attribute). Anything else (a raw dict) is refused naming the cell."""
        want = self.kind.result
        for label, rows in self.cells.items():
            for n, cell in rows.items():
                if not isinstance(cell.result, want):
                    raise TypeError(
                        f"{self.task} cell of '{label}' at {n}: the result is a {type(cell.result).__name__}, "
                        f"not the task's {want.__name__}"
                    )
        return {label: {n: cell.result for n, cell in rows.items()} for label, rows in self.cells.items()}


def collect(suite, cells: list[SuiteCell]) -> list[TaskTable]:
    """Compute: the suite's cells arranged per task, method and length, with retrieval statistics."""
    labels = [m.label for m in suite.methods]
    tables = []
    for task in suite.tasks():
        settings = suite.block(task)
        by_label: dict[str, dict[int, SuiteCell]] = {label: {} for label in labels}
        for cell in cells:
            if cell.task == task and cell.label in by_label:
                by_label[cell.label][cell.length] = cell
        tt = TaskTable(task, settings, settings["lengths"], by_label, kind=suite.kind(task))
        if tt.retrieval:
            results = tt.results
            tt.stats = {label: {n: retrieval_stats(results[label][n], n) for n in results[label]} for label in labels}
        tables.append(tt)
    return tables


def write_report(suite, output: str | Path, partial: list[SuiteCell] | None = None) -> ResultsJSON:
    """Write ``results.json``, ``report.md`` and plots for whatever cells exist; return the summary.

    ``partial``: records of unfinished retrieval cells (:func:`.in_progress.partial_cells`),
    shown with their prompts so far and marked in progress; they do not count as finished.

    Raises:
        CellFileError: a cell file this ropescale does not read (:func:`.cell_record.load_cells`).
    """
    output = Path(output)
    finished = _load_cells(output)
    cells = finished + list(partial or [])
    entries = {m.label: m for m in suite.methods}
    runtimes = sorted({json.dumps(c.runtime, sort_keys=True) for c in cells if c.runtime is not None})
    tables = collect(suite, cells)  # compute
    from ropescale.evals.report.results_schema import stamp

    summary: ResultsJSON = {
        **stamp(),
        "suite": suite.name,
        "model": suite.model,
        "dtype": suite.dtype,
        "runtimes": [json.loads(r) for r in runtimes],
        # what each label ran: the file reads back without its suite.yaml (evidence.load_results); a saved
        # row as its cells read the scaling back from the model
        "methods": {m.label: _ran(m, cells) for m in suite.methods},
        **({"carries": suite.carries} if getattr(suite, "carries", None) else {}),
        **({"sized": suite.sized} if getattr(suite, "sized", None) else {}),
        "tasks": {},
    }
    if suite.passkey is not None:  # the placement its passkey numbers were measured with (0: fixed depths)
        summary["passkey_jitter"] = float(suite.settings("passkey").jitter)
    for tt in tables:
        summary["tasks"][tt.task] = {label: {str(n): r for n, r in rows.items()} for label, rows in tt.table.items()}
        if tt.stats is not None:
            summary.setdefault("statistics", {})[tt.task] = {
                label: {str(n): st.to_json() for n, st in rows.items()} for label, rows in tt.stats.items()
            }
    flags, flag_lines = short_context_regressions(suite, tables)
    summary["regressions"] = flags
    plots = [p for p in plot_tables(output, tables, [m.label for m in suite.methods], plot_context(suite)) if p]
    done = sum(1 for c in finished if c.label in entries and entries[c.label].runs(c.task, c.length))
    total = len(suite.cells())
    lines = render(suite, tables, runtimes, flag_lines, [str(Path(p).relative_to(output)) for p in plots], done, total)
    summary["plots"] = plots
    summary["cells_finished"], summary["cells_total"] = done, total
    atomic_write_json(output / "results.json", summary)
    atomic_write_text(output / "report.md", "\n".join(lines) + "\n")
    summary["report"] = str(output / "report.md")
    summary["markdown"] = "\n".join(lines)
    return summary


def _ran(entry, cells: list[SuiteCell]) -> ScalingJSON:
    """What a label ran: its entry, or for ``saved`` the scaling its cells read back from the model
    (``{"method": "yarn", "factor": 4.0, "params": {...}, "as": "saved"}``; ``saved`` before any cell)."""
    if entry.method == "saved":
        for cell in cells:
            scaling = cell.scaling
            if cell.label == entry.label and scaling is not None and scaling.get("method"):
                params = {k: v for k, v in (scaling.get("params") or {}).items() if k != "factor" and v is not None}
                return {"method": scaling["method"], "factor": scaling.get("factor"), "params": params, "as": "saved"}
    return {"method": entry.method, "factor": entry.factor, "params": dict(entry.params)}


def plot_tables(
    output: Path, tables: list[TaskTable], labels: list[str], context: PlotContext | None = None
) -> list[str | None]:
    """Plot: perplexity against length, one accuracy grid per method and retrieval task. ``context`` is
    what a plot names beside the numbers (:func:`plot_context`)."""
    plots: list[str | None] = []
    for tt in tables:
        plots += tt.kind.plot(output, tt, labels, context=context)
    return plots


def plot_context(suite) -> PlotContext:
    """What the suite's plots name: the model, the factor when every scaled method shares one, and the
    trained context L (a dashed line), when its config can be read here."""
    factors = {float(m.factor) for m in suite.methods if m.factor and float(m.factor) != 1.0}
    return {
        "model": suite.model,
        "factor": factors.pop() if len(factors) == 1 else None,
        "trained_context": _trained_context(suite.model),
        "titles": {m.label: m.title for m in suite.methods},
    }


def _method_text(m) -> str:
    """A method entry as the header lists it: its row name, then what it runs where the name does not say it
    (a ``saved`` row's label already names the scaling it carries)."""
    detail = m.method + (f" ×{m.factor:g}" if m.factor else "") + (f", {m.params}" if m.params else "")
    if m.method == "saved" or m.title == detail:
        return m.title
    return f"{m.title} ({detail})"


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
            f"The checkpoint carries **{carries}**: a `(saved)` row runs it as saved, the model as shipped and the "
            "baseline of the short-context comparison; `none (scaling removed)` runs plain RoPE at the pretraining "
            "frequencies; a row naming another method replaces the saved scaling (from the original RoPE). "
            "Each cell records the scaling it ran, read back from the model (`scaling` in cells/*.json).",
            "",
        ]
    if suite.note:
        lines += [suite.note, ""]
    if getattr(suite, "sized", None):  # a sized-down run is not the suite's result: said before any number
        lines += [f"**{suite.sized}**", ""]
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


PPL_MARGIN = 0.02


def short_context_regressions(suite, tables: list[TaskTable]) -> tuple[list[RegressionFlag], list[str]]:
    """Methods that lose what the unscaled model has at short contexts, read from the suite's tables
    (the retrieval tasks' statistics, the perplexity cells' typed results).

    Flagged: retrieval (passkey, needle) at the shortest length both ran, when the 95% interval of
    the accuracy difference (unscaled − method; Newcombe's, from both cells' Wilson intervals) lies
    above 0; perplexity at a length within the trained context, when the method's is more than
    :data:`PPL_MARGIN` above the unscaled model's on the same tokens (cells record summed NLLs, not
    per-token ones, so a margin stands in for an interval).

    Returns:
        ``(flags, report lines)``; each flag has ``method``, ``task``, ``length``, ``value`` and
        ``baseline`` (retrieval flags also the difference's ``interval``).
    """
    from ropescale.evals.tasks.proportions import difference_interval
    from ropescale.methods import method_class

    base = next((m for m in suite.methods if m.method != "saved" and method_class(m.method).name == "default"), None)
    shipped = next((m for m in suite.methods if m.method == "saved"), None) if getattr(suite, "carries", None) else None
    base, who = (shipped, "as shipped") if shipped is not None else (base, "unscaled")
    lines = ["## Short-context regressions", ""]
    if base is None:
        return [], lines + ["No unscaled method (`none`) in the suite: nothing to compare against.", ""]
    flags: list[RegressionFlag] = []
    # the model as shipped is the baseline up to the context it serves; plain RoPE up to its trained one
    trained = (
        _shipped_context(suite.model, suite.shipped_context) if shipped is not None else _trained_context(suite.model)
    )
    ppl = next((tt.results for tt in tables if tt.task == "perplexity"), {})
    for m in suite.methods:
        if m is base:
            continue
        for tt in tables:
            if tt.stats is None:  # not a retrieval task
                continue
            stats = tt.stats
            both = sorted(set(stats.get(base.label, {})) & set(stats.get(m.label, {})))
            if both:
                ref, got = stats[base.label][both[0]], stats[m.label][both[0]]
                gap = difference_interval(ref.successes, ref.trials, got.successes, got.trials)
                if gap[0] > 0:  # the unscaled model is better beyond both cells' noise
                    flags.append(_flag(m.label, tt.task, both[0], got.accuracy, ref.accuracy, gap))
        for n in sorted(set(ppl.get(base.label, {})) & set(ppl.get(m.label, {}))):
            if trained is not None and n <= trained:
                got, ref = ppl[m.label][n].ppl, ppl[base.label][n].ppl
                if got > ref * (1 + PPL_MARGIN):
                    flags.append(_flag(m.label, "perplexity", n, got, ref))
    context = f"{trained:,}" if trained else "(unknown)"
    titles = {m.label: m.title for m in suite.methods}
    lines += [
        f"Against `{base.title}`: retrieval at the shortest length (flagged when the 95% interval of the accuracy "
        f"difference, from both cells' Wilson intervals, excludes 0) and perplexity at lengths ≤ the "
        f"{'shipped' if shipped is not None else 'trained'} context {context} (flagged beyond +{PPL_MARGIN:.0%}).",
        "",
    ]
    for f in flags:
        if "interval" in f:
            low, high = f["interval"]
            detail = f"(difference {f['baseline'] - f['value']:+.2f}, 95% [{low:.2f}, {high:.2f}])"
        else:
            detail = f"({f['value'] / f['baseline'] - 1:+.1%})"
        lines.append(
            f"- ⚠ **{titles.get(f['method'], f['method'])}**: {f['task']} at {int(f['length']):,} is "
            f"{fmt(f['value'])} {detail}; {who} {fmt(f['baseline'])}"
        )
    if not flags:
        lines.append("- none flagged")
    return flags, lines + [""]


def _flag(method: str, task: str, length: int, value: float, baseline: float, interval=None) -> RegressionFlag:
    flag: RegressionFlag = {"method": method, "task": task, "length": int(length), "value": value, "baseline": baseline}
    if interval is not None:
        flag["interval"] = list(interval)
    return flag


def _shipped_context(model: str, given: int | None = None) -> int | None:
    """The context the checkpoint serves as shipped (the suite's ``shipped_context``, else
    :func:`ropescale.patching.shipped.shipped_of`), or None."""
    if given is not None:
        return given
    try:
        from ropescale.models.loading import load_config
        from ropescale.patching.shipped import shipped_of

        return int(shipped_of(load_config(model)).context)
    except Exception:  # noqa: BLE001 - a report is still written without the flag's perplexity half
        return None


def _trained_context(model: str) -> int | None:
    """The model's trained context L, from its config (None if it cannot be read here)."""
    try:
        from ropescale.models.loading import load_config
        from ropescale.patching.plan import trained_context

        return int(trained_context(load_config(model)))
    except Exception:  # noqa: BLE001 - a report is still written without the flag's perplexity half
        return None
