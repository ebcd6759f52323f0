"""The RULER battery's report: scores per scaling × task × length with their intervals, and, where the
unscaled model's cells of the same model are in the folder, short-context retention and effective
length (:mod:`.measures`) of every scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale.evals.tasks.ruler.measures import (
    RETENTION_BAR,
    effective_length_absolute,
    effective_length_relative,
    retention,
    worst_retention,
)
from ropescale.evals.tasks.ruler.record import CellRecord, load_cells
from ropescale.markdown import table as md_table

#: the layout of the ``results.json`` ``ropescale eval ruler`` writes
RESULTS_SCHEMA = "ropescale.ruler.results/1"
#: a task whose unscaled base (0-100) is below this is beyond the model at any length: reported, not counted
BEYOND_FLOOR = 30.0


class ScoreEntry(TypedDict):
    """One scaling × task × length of the summary: the score and its 95% Wilson interval (0-100)."""

    score: float
    interval: list[float]
    samples: int
    seed: int
    #: the samples asked, where fewer were decoded (a cell written before such a cell was refused)
    asked: NotRequired[int]
    #: its share (%) of the unscaled base: ``recommend --json``'s battery record only
    of_base: NotRequired[float | None]


class TaskMeasures(TypedDict, total=False):
    """One scaling × task's measures (:mod:`.measures`): the effective lengths, and where the unscaled
    model's cells are here, the retention per length (keys are strings) and its worst."""

    effective_length_ruler: int | None
    effective_length_relative: int | None
    relative_note: str
    base: str
    retention: dict[str, float]
    worst_retention: float | None


class RulerSummary(TypedDict):
    """:func:`summarize`'s summary: scores by label, task and length, the measures by label and task."""

    original_context: int | None
    scores: dict[str, dict[str, dict[int, ScoreEntry]]]
    measures: dict[str, dict[str, TaskMeasures]]
    has_unscaled: bool
    #: where the checkpoint ships a scaling and its cells as shipped are here: the baseline is the model as
    #: shipped, up to its shipped context (``original_context`` is then that context), and where it came from
    as_shipped: NotRequired[str]
    #: label -> prompt format, where a row is not plain
    prompts: NotRequired[dict[str, str]]


class RulerReport(RulerSummary):
    """:func:`write_report`'s return: the summary, the report's text and its path."""

    markdown: str
    report: str


def summarize(cells: list[CellRecord], model: str | None = None, shipped_context: int | None = None) -> RulerSummary:
    """Scores (0-100) of ``cells`` (:func:`.record.load_cells`) as ``{label: {task: {length: ...}}}``
    and the measures against the baseline's cells, when there are any: the model as shipped up to its
    shipped context where the checkpoint ships a scaling and its own cells are here (issue 51: "native" is
    the model as shipped; ``shipped_context``: ``--shipped-context``), else the unscaled model's up to the
    trained context."""
    if model is not None:
        cells = [c for c in cells if c.model == str(model)]
    shipped = as_shipped(cells, shipped_context)
    table: dict[str, dict[str, dict[int, ScoreEntry]]] = {}
    # the unscaled base of each prompt format: a row is compared with prompts of its own format only
    unscaled: dict[str, dict[str, dict[int, float]]] = {}
    prompt_of: dict[str, str] = {}
    context = None
    for c in cells:
        r = c.result
        lo, hi = r.interval
        entry = ScoreEntry(score=100 * r.score, interval=[100 * lo, 100 * hi], samples=r.samples, seed=r.seed)
        if c.short:  # fewer samples than asked (written before such a cell was refused): said, never done
            entry["asked"] = c.fingerprint.samples
        table.setdefault(c.label, {}).setdefault(r.task, {})[r.length] = entry
        prompt_of[c.label] = c.prompt
        context = c.original_context
        if c.fingerprint.scaling_requested.as_saved if shipped else c.unscaled:
            unscaled.setdefault(c.prompt, {}).setdefault(r.task, {})[r.length] = 100 * r.score
    measures: dict[str, dict[str, TaskMeasures]] = {}
    if shipped is not None:
        context = shipped[0]
    for label, tasks in table.items():
        for task, by_length in tasks.items():
            scores = {n: e["score"] for n, e in by_length.items()}
            row = TaskMeasures(effective_length_ruler=effective_length_absolute(scores))
            base = unscaled.get(prompt_of[label], {}).get(task)
            if context is not None:
                length, why = effective_length_relative(scores, context, base=base, floor=BEYOND_FLOOR)
                base_name = ("as shipped" if shipped else "unscaled") if base else "own"
                row.update(effective_length_relative=length, relative_note=why, base=base_name)
            if base and context is not None:
                kept = retention(scores, base, context)
                row.update(retention={str(n): v for n, v in kept.items()}, worst_retention=worst_retention(kept))
            measures.setdefault(label, {})[task] = row
    summary = RulerSummary(original_context=context, scores=table, measures=measures, has_unscaled=bool(unscaled))
    if set(prompt_of.values()) - {"plain"}:
        summary["prompts"] = prompt_of
    if shipped is not None:
        summary["as_shipped"] = shipped[1]
    return summary


def as_shipped(cells: list[CellRecord], given: int | None = None) -> tuple[int, str] | None:
    """The shipped context of the cells' checkpoint and where it came from, where it ships a scaling and
    cells of it as shipped (no ``--method``) are among ``cells``; None otherwise (a plain checkpoint, whose
    baseline stays the unscaled model, or a folder copied without its model)."""
    from ropescale.errors import RopescaleError
    from ropescale.models.loading import load_config
    from ropescale.patching.geometry import is_scaled
    from ropescale.patching.shipped import shipped_of

    saved = [c for c in cells if c.fingerprint.scaling_requested.as_saved]
    if not saved:
        return None
    try:
        config = load_config(saved[0].model)
    except (RopescaleError, OSError, ValueError):
        return None
    if not is_scaled(config):
        return None
    shipped = shipped_of(config, given)
    return shipped.context, "--shipped-context" if given else shipped.context_source


def markdown(summary: RulerSummary) -> str:
    """The summary as markdown: one table of scores, one of the measures."""
    table = summary["scores"]
    lengths = sorted({n for tasks in table.values() for by in tasks.values() for n in by})
    rows = [
        [
            label,
            task,
            *(
                ""
                if (e := by.get(n)) is None
                else f"{e['score']:.1f} [{e['interval'][0]:.0f}, {e['interval'][1]:.0f}] n={e['samples']}"
                + (f" of {e['asked']} asked (short)" if "asked" in e else "")
                for n in lengths
            ),
        ]
        for label, tasks in sorted(table.items())
        for task, by in sorted(tasks.items())
    ]
    lines = ["## RULER scores (% , 95% Wilson interval, samples per cell)", ""]
    lines += md_table(["scaling", "task", *(str(n) for n in lengths)], rows).splitlines()
    if summary.get("prompts"):
        lines += ["", "Rows marked `+chat`: prompts in the model's chat template (`--prompt chat`), compared with the"]
        lines += ["unscaled model's `+chat` cells only; the other rows are lm-eval's plain text."]
    context = summary["original_context"]
    if summary.get("as_shipped"):  # L is the shipped context, the base the model as shipped
        lines += ["", f"## Effective length and short-context retention (shipped context L = {context})", ""]
        lines += ["The base is the model as shipped (its own scaling, no `--method`), up to the context it serves"]
        lines += [f"({summary['as_shipped']}); the unscaled model (`--method none`) is a row like the others.", ""]
    else:
        lines += ["", f"## Effective length and short-context retention (trained context L = {context})", ""]
    if not summary["has_unscaled"]:
        lines += ["No cells of the unscaled model (`--method none`) here: no retention; the relative", ""]
        lines += ["effective length uses each scaling's own scores at ≤ L.", ""]
    rows = []
    for label, tasks in sorted(summary["measures"].items()):
        for task, m in sorted(tasks.items()):
            rel = m.get("effective_length_relative")
            rel_text = str(rel) if rel is not None else f"none: {m.get('relative_note', '')}"
            if m.get("base"):
                rel_text += f" (base: {m['base']})"
            worst = m.get("worst_retention")
            rows.append(
                [
                    label,
                    task,
                    m["effective_length_ruler"] or "none",
                    rel_text,
                    "" if worst is None else f"{worst:.1f} %",
                ]
            )
    headers = [
        "scaling",
        "task",
        "effective (RULER 85.6)",
        "effective (85 % of base at ≤ L)",
        f"worst retention ≤ L (bar {RETENTION_BAR} %)",
    ]
    lines += md_table(headers, rows).splitlines()
    return "\n".join(lines) + "\n"


def write_report(
    output: str | Path,
    model: str | None = None,
    cells: list[CellRecord] | None = None,
    shipped_context: int | None = None,
) -> RulerReport:
    """Write ``report.md`` and ``results.json`` of every cell in ``output`` (of ``model``) atomically;
    ``cells``: those records instead of the folder's cells of this layout (both layouts,
    :func:`ropescale.evals.report.ruler_folder.load_ruler_cells`)."""
    output = Path(output)
    summary = summarize(load_cells(output) if cells is None else cells, model, shipped_context)
    text = markdown(summary)
    atomic_write_text(output / "report.md", text)
    atomic_write_json(output / "results.json", {"schema": RESULTS_SCHEMA, **_jsonable(summary)})
    return RulerReport(**summary, markdown=text, report=str(output / "report.md"))


def _jsonable(summary: RulerSummary) -> dict[str, Any]:  # results.json: the file boundary
    scores = {
        label: {task: {str(n): e for n, e in by.items()} for task, by in tasks.items()}
        for label, tasks in summary["scores"].items()
    }
    return {**summary, "scores": scores}


__all__ = [
    "BEYOND_FLOOR",
    "RESULTS_SCHEMA",
    "RulerReport",
    "RulerSummary",
    "ScoreEntry",
    "TaskMeasures",
    "markdown",
    "summarize",
    "write_report",
]
