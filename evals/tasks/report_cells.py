"""How a suite report shows cells: the number formats and the sections of the built-in tasks.

The rows of :mod:`.task_table` render their report sections with these (a task with no section of
its own gets :func:`render_values`); :mod:`.aggregate` puts the sections together. Nothing here reads
files or knows a task by name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ropescale.markdown import table as md_table
from ropescale.plots.curves import plot_perplexity_curves
from ropescale.plots.grids import plot_accuracy_grid

PPL_CONVENTIONS = {
    "yarn": "sliding window, stride {stride}: each token scored once with up to a window of context "
    "(PI/YaRN convention); PPL is token-weighted, the papers' mean over windows is also given",
    "longlora": "windows every {stride} tokens, every token of every window scored (LongLoRA convention)",
    "nonoverlap": "non-overlapping windows (lm-eval rolling convention)",
}


NOT_RUN = "n/r"


class PlotContext(TypedDict):
    """What a suite's plots name beside the numbers (:func:`.aggregate.plot_context`): the model, the factor when
    every scaled method shares one, and the trained context L (a dashed line; None where it cannot be read)."""

    model: str
    factor: float | None
    trained_context: int | None
    titles: dict[str, str]  # label -> the row's name with its factor (:func:`row_name`)


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{digits}f}" if x < 1e4 else f"{x:.3g}"


def row_name(entries: Any, label: str) -> str:
    """The name of a method's row: its label with its factor (:attr:`.runner.MethodEntry.title`), so that a
    comparison never shows ``yarn`` for ``yarn ×4``; ``entries``: label -> the suite's method entry."""
    return str(getattr(entries.get(label), "title", label))


def plot_name(*parts: str) -> str:
    """A plot's file name from its parts (``passkey``, ``yarn x2 (saved)``): lowercase letters, digits,
    ``_``, ``-`` and ``.`` only (``passkey_yarn-x2-saved.png``), so that it needs no quoting in a shell,
    a URL or Markdown."""
    stem = "_".join(re.sub(r"[^a-z0-9_.-]+", "-", str(p).lower()).strip("-.") or "method" for p in parts)
    return f"{stem}.png"


def cell_line(kind: Any, entry: Any, length: int, result: Any, seconds: float, done: int, total: int) -> str:
    """The line a finished cell prints without a terminal: which cell (the method with its factor), its
    number as the report shows it, and how long it took (``cell 3/12: passkey yarn ×4 at 4,096:
    accuracy 0.80 (41 s)``); ``kind``: the task's row of :mod:`.task_table`."""
    value = kind.value(result, length)
    return f"cell {done}/{total}: {kind.name} {entry.title} at {length:,}: {kind.metric} {fmt(value)} ({seconds:.0f} s)"


def length_table(lengths: list[int], rows: list[list[str]], extra: tuple[str, ...] = ()) -> list[str]:
    """A table of one row per method and one column per length (``extra`` columns after), as lines."""
    return md_table(["method", *(f"{n:,}" for n in lengths), *extra], rows).splitlines()


def render_values(kind, tt: Any, labels: list[str], entries) -> list[str]:
    """A task's section from its row alone: its ``metric`` per method and length (a task with no
    renderer of its own, :meth:`.task_base.Task.render`)."""
    better = "higher" if kind.higher_is_better else "lower"
    lines = [f"## {kind.name}", "", f"{kind.metric} ({better} is better):", ""]
    rows = [
        [
            row_name(entries, label),
            *(
                (fmt(kind.value(tt.results[label][n], n)) if n in tt.results[label] else "—")
                if entries[label].runs(tt.task, n)
                else NOT_RUN
                for n in tt.lengths
            ),
        ]
        for label in labels
    ]
    return lines + length_table(tt.lengths, rows) + [""]


def render_perplexity(tt: Any, labels: list[str], entries) -> list[str]:
    """The perplexity section, from the cells' :class:`~.task_perplexity.PerplexityCell` results."""
    results, lengths, settings, task = tt.results, tt.lengths, tt.kind.read(tt.settings), tt.task
    r0 = next((r for rows in results.values() for r in rows.values()), None)
    mode = settings.mode if r0 is None else r0.mode
    stride = "?" if r0 is None or r0.stride is None else r0.stride
    lines = [
        "## Perplexity",
        "",
        "Convention: "
        + PPL_CONVENTIONS.get(mode, mode).format(stride=stride)
        + f"; BOS before every window; up to {settings.max_tokens or 'four windows of'} tokens scored per cell.",
        "",
        "Token-weighted perplexity (lower is better):",
        "",
    ]

    def rows(show) -> list[list[str]]:
        return [
            [
                row_name(entries, label),
                *(
                    fmt(show(results[label][n]) if n in results[label] else None)
                    if entries[label].runs(task, n)
                    else NOT_RUN
                    for n in lengths
                ),
            ]
            for label in labels
        ]

    lines += length_table(lengths, rows(lambda r: r.ppl))
    if mode != "nonoverlap":
        lines += ["", "Mean over windows, exp(mean window NLL) as in the YaRN paper:", ""]
        lines += length_table(lengths, rows(lambda r: r.mean_window_ppl))
    scored = {
        n: max((results[lb][n].tokens_scored if n in results[lb] else 0 for lb in labels), default=0) for n in lengths
    }
    return lines + ["", "Tokens scored per cell: " + ", ".join(f"{n:,}: {scored[n]:,}" for n in lengths), ""]


def render_retrieval(tt: Any, labels: list[str], entries) -> list[str]:
    """A retrieval section (passkey, needle), from the cells' :class:`~.task_retrieval.RetrievalCell` results."""
    results, lengths, task, stats, kind = tt.results, tt.lengths, tt.task, tt.stats or {}, tt.kind
    settings = kind.read(tt.settings)
    thresholds = sorted({threshold(kind, r) for rows in results.values() for r in rows.values()})
    at_least = " / ".join(f"{t:g}" for t in thresholds)
    context_rule = f" Context: the largest length with accuracy ≥ {at_least}." if thresholds else ""
    lines = [
        f"## {kind.title(settings)}",
        "",
        f"Accuracy over depths {list(settings.depths)} × {settings.trials} trial(s) "
        "per length; greedy decoding with the KV cache" + kind.scoring + context_rule,
        "",
    ]
    rows = []
    for label in labels:
        accs = {n: st.accuracy for n, st in stats[label].items()}
        ok = [  # a cell in progress says nothing yet about the context
            n for n, a in accs.items() if a >= threshold(kind, results[label][n]) and not results[label][n].partial
        ]
        cells = (
            fmt_retrieval(stats[label].get(n), results[label].get(n)) if entries[label].runs(task, n) else NOT_RUN
            for n in lengths
        )
        rows.append([row_name(entries, label), *cells, str(max(ok)) if ok else "—"])
    lines += length_table(lengths, rows, extra=("context",))
    placement = kind.placement(settings, results)
    return lines + ["", "Cells: accuracy · successes/trials [95% Wilson interval]." + placement, ""]


def placement_line(settings: Any, results: dict[str, dict[int, Any]], differ: str = "the key") -> str:
    """How independent a retrieval cell's trials are: the placement, and how often the trials of one
    depth answered alike in this table (:func:`~ropescale.evals.tasks.proportions.group_agreement`); ``results``:
    label -> length -> :class:`~.task_retrieval.RetrievalCell`; ``differ``: what the trials of one fixed
    depth differ in (passkey: the key)."""
    from ropescale.evals.tasks.proportions import depth_groups, group_agreement

    jitter = settings.jitter or 0
    placement = (
        f" Placement: each trial's depth drawn from depth ± {jitter:g}."
        if jitter
        else f" Placement: fixed, so the trials of one depth share one position and differ only in {differ}."
    )
    unanimous = groups = 0
    effective: list[float] = []
    for rows in results.values():
        for result in rows.values():
            try:
                stats = group_agreement(depth_groups(result.records))
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


def threshold(kind, result: Any) -> float:
    """The accuracy a length needs to count towards the context: the one its result (a
    :class:`~.task_retrieval.RetrievalCell`) recorded."""
    if result.threshold is not None:
        return float(result.threshold)
    return kind.threshold()  # cells written without a threshold: the engine's default


class StatisticsJSON(TypedDict):
    """A retrieval cell's statistics as ``results.json``'s ``statistics`` holds them (:meth:`RetrievalStats.to_json`)."""

    accuracy: float
    trials: int
    successes: float
    wilson95: list[float]


@dataclass(frozen=True)
class RetrievalStats:
    """A retrieval cell's statistics at one length: accuracy, trials, successes (accuracy × trials) and
    the 95% Wilson interval (``results.json``'s ``statistics``, :meth:`to_json`)."""

    accuracy: float
    trials: int
    successes: float
    wilson95: tuple[float, float]

    def to_json(self) -> StatisticsJSON:
        return {
            "accuracy": self.accuracy,
            "trials": self.trials,
            "successes": self.successes,
            "wilson95": [*self.wilson95],
        }


def retrieval_stats(result: Any, length: int) -> RetrievalStats:
    """Accuracy, trials, successes and the 95% Wilson interval of a passkey/needle cell (its
    :class:`~.task_retrieval.RetrievalCell`).

    Cells written before the intervals were recorded are recomputed from their records (or, lacking
    those, from the accuracy grid and depths × trials).
    """
    from ropescale.evals.tasks.proportions import wilson_interval

    key = str(length)
    records = [r for r in result.records if r.get("length", length) == length]
    if key in result.length_trials:
        trials, accuracy = int(result.length_trials[key]), float(result.length_accuracy[key])
    elif records:
        scores = [float(r["score"]) if "score" in r else float(bool(r["correct"])) for r in records]
        trials, accuracy = len(scores), sum(scores) / len(scores)
    else:
        trials = len(result.depths) * int(result.trials)
        accuracy = mean_accuracy(result)
    low, high = result.length_interval.get(key) or wilson_interval(accuracy * trials, trials)
    return RetrievalStats(accuracy, trials, accuracy * trials, (low, high))


def fmt_retrieval(stat: RetrievalStats | None, result: Any = None) -> str:
    if stat is None:
        return "—"
    k, n = stat.successes, stat.trials
    count = f"{round(k)}/{n}" if abs(k - round(k)) < 1e-9 else f"n={n}"
    low, high = stat.wilson95
    partial = None if result is None else result.partial
    running = f" (in progress: {partial['prompts']} of {partial['of']} prompts)" if partial else ""
    return f"{stat.accuracy:.2f} · {count} [{low:.2f}, {high:.2f}]{running}"


def mean_accuracy(result: Any) -> float:
    grid = result.accuracy or [[0.0]]
    values = [v for row in grid for v in row]
    return sum(values) / len(values)


def plot_ppl(
    output: Path, results, labels, lengths, model=None, factor=None, trained_context=None, titles=None
) -> str | None:
    """Perplexity against length, titled with the model and factor, the trained context L dashed
    (``results``: label -> length -> :class:`~.task_perplexity.PerplexityCell`)."""
    titles = titles or {}
    curves = {
        titles.get(label, label): {n: results[label][n].ppl for n in lengths if n in results[label]} for label in labels
    }
    path = plot_perplexity_curves(
        curves,
        lengths,
        output / "perplexity_vs_length.png",
        model=model,
        factor=factor,
        trained_context=trained_context,
    )
    return None if path is None else str(path)


def plot_grids(output: Path, task: str, results, labels, lengths, titles=None) -> list[str]:
    """One heatmap per method: lengths × depths, accuracy in each cell (``results``: label -> length ->
    :class:`~.task_retrieval.RetrievalCell`)."""
    paths: list[str] = []
    used: set[str] = set()
    for label in labels:
        rows = [n for n in lengths if n in results[label]]
        if not rows:
            continue
        # the union of the cells' depths: a cell in progress may have sampled only some of them
        depths = sorted({d for n in rows for d in results[label][n].depths})

        def acc(n: int, d: float) -> float:
            cell = results[label][n]
            return cell.accuracy[0][cell.depths.index(d)] if d in cell.depths else math.nan

        def said(n: int, d: float) -> str | None:  # a cell in progress: correct / decoded at that depth
            cell = results[label][n]
            if not cell.partial or d not in cell.depths or cell.cell_trials is None:
                return None
            k = cell.cell_trials[0][cell.depths.index(d)]
            return f"{round(acc(n, d) * k)}/{k}"

        grid = [[acc(n, d) for n in rows] for d in depths]  # [depth][length]
        texts = [[said(n, d) for n in rows] for d in depths]
        running = any(results[label][n].partial for n in rows)
        title = f"{task}: {(titles or {}).get(label, label)}" + (" (cells in progress)" if running else "")
        name = plot_name(task, label)
        if name in used:  # labels that differ only in case or punctuation: each its own picture
            name = plot_name(task, label, str(len(used)))
        used.add(name)
        paths.append(str(plot_accuracy_grid(rows, depths, grid, output / name, title, texts)))
    return paths


__all__ = [
    "NOT_RUN",
    "cell_line",
    "PPL_CONVENTIONS",
    "PlotContext",
    "RetrievalStats",
    "StatisticsJSON",
    "fmt",
    "fmt_retrieval",
    "length_table",
    "placement_line",
    "plot_grids",
    "plot_name",
    "plot_ppl",
    "render_perplexity",
    "render_retrieval",
    "render_values",
    "retrieval_stats",
    "row_name",
    "threshold",
]
