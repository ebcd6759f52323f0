"""RULER battery cells as ``ropescale recommend`` evidence: what each method keeps past the trained context.

A battery folder is what ``ropescale eval ruler`` writes (``OUTPUT/cells/*.json``: suite cells of the RULER
row, or one file per task where an earlier ropescale wrote them) or a folder of such cells shipped in ``evals/measured/ruler/<model>-x<factor>-<machine>/``. Folders are matched by what their cells
record, never by their names: a folder belongs to a model when one of its cells' fingerprints names that
model (``fingerprint.model``); each cell is then a row by its requested scaling (``fingerprint.
scaling_requested``: method, factor, parameters), so a folder may hold several factors. Cells of another
model in the same folder (a fine-tuned export, its control) are rows labelled with that checkpoint's name,
never candidates and never the unscaled base. A file that is not a cell this ropescale reads (a newer
schema) is skipped and said (:func:`ropescale.evals.report.ruler_folder.read_ruler_cells`).

Scores, retention at ≤ L and effective length come from :func:`~.ruler.report.summarize` against the
unscaled model's cells of the same folder; past L a cell is quoted as a share of that base (the unscaled
mean at ≤ L, :func:`~.ruler.measures.base_score`), and a task whose base is below
:data:`~.ruler.report.BEYOND_FLOOR` is beyond the model at any length: listed as such, not counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.advice.evidence import MEASURED_DIR, same_model
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.records import BatteryRecord, Comparison, FolderRecord, Params
from ropescale.evals.tasks.ruler.report import RulerSummary, ScoreEntry

#: the shipped battery folders
BATTERY_DIR = MEASURED_DIR / "ruler"


@dataclass
class Row:
    """One scaling of one folder: ``kind`` is ``unscaled``, ``method`` (a candidate) or ``checkpoint``
    (another model's cells in the folder, or the model as saved: labelled by its name, never a candidate)."""

    label: str
    kind: str
    method: str | None = None
    factor: float | None = None
    params: Params = field(default_factory=dict)
    checkpoint: str | None = None

    def title(self, params: bool = True) -> str:
        if self.kind == "checkpoint":
            return f"checkpoint {self.checkpoint}"
        if self.kind == "unscaled":
            return "unscaled"
        text = f"{self.method} ×{self.factor:g}" if self.factor else str(self.method)
        return text + (f" ({', '.join(f'{k}={v}' for k, v in self.params.items())})" if params and self.params else "")


@dataclass
class Folder:
    """A battery folder's cells of one model, summarized."""

    source: str
    rows: dict[str, Row]
    summary: RulerSummary
    skipped: list[str]

    @property
    def context(self) -> int | None:
        return self.summary["original_context"]

    def scores(self, label: str) -> dict[str, dict[int, ScoreEntry]]:
        return self.summary["scores"].get(label, {})

    def base(self) -> dict[str, tuple[float, list[int]]]:
        """``{task: (base 0-100, the lengths ≤ L it is the mean of)}`` from the unscaled rows."""
        from ropescale.evals.tasks.ruler.measures import base_score

        merged: dict[str, dict[int, float]] = {}
        for label, row in self.rows.items():
            if row.kind == "unscaled":
                for task, by in self.scores(label).items():
                    merged.setdefault(task, {}).update({n: e["score"] for n, e in by.items()})
        out = {}
        for task, by in merged.items():
            short = sorted(n for n in by if self.context and n <= self.context)
            if short:
                out[task] = (base_score(by, self.context), short)
        return out

    def beyond(self) -> list[str]:
        from ropescale.evals.tasks.ruler.measures import reaches
        from ropescale.evals.tasks.ruler.report import BEYOND_FLOOR

        return sorted(t for t, (b, _) in self.base().items() if not reaches(b, BEYOND_FLOOR))

    def of_base(self, task: str, score: float) -> float | None:
        b = self.base().get(task)
        return None if b is None or b[0] == 0 else 100.0 * score / b[0]

    def title(self, row: Row) -> str:
        """The row's title, with its parameters only where another row has the same method and factor."""
        twins = [
            r for r in self.rows.values() if r.kind == "method" and (r.method, r.factor) == (row.method, row.factor)
        ]
        return row.title(params=len(twins) > 1)

    def find(self, method: str, factor: float | None, params: Params) -> Row | None:
        want = json.loads(json.dumps(params or {}, default=str))
        for row in self.rows.values():
            same_factor = factor is not None and row.factor is not None and abs(row.factor - factor) < 1e-6
            if row.kind == "method" and row.method == method and same_factor and row.params == want:
                return row
        return None


def read_folder(folder: str | Path, model: str, prompt: str = "plain") -> Folder | None:
    """The cells of ``model`` in ``folder`` (and the checkpoints beside them) whose prompts were of format
    ``prompt`` (:mod:`~.ruler.prompt`: a chat cell is compared with chat cells only); None when it has none."""
    from ropescale.evals.advice.evidence import _method_name
    from ropescale.evals.report.ruler_folder import read_ruler_cells as read_cells
    from ropescale.evals.tasks.ruler.record import cell_files
    from ropescale.evals.tasks.ruler.report import summarize

    folder = Path(folder)
    records, skipped = read_cells(cell_files(folder))
    records = [r for r in records if r.prompt == prompt]
    ours = {id(r) for r in records if same_model(r.model, model)}
    if not ours:
        return None
    rows: dict[str, Row] = {}
    cells = []
    for record in records:
        asked = record.fingerprint.scaling_requested
        if id(record) in ours and record.unscaled:
            row = Row(record.label, "unscaled")
        elif id(record) in ours and asked.method is not None:
            row = Row(
                record.label,
                "method",
                _method_name(asked.method) or asked.method,
                None if asked.factor is None else float(asked.factor),
                dict(asked.params),
            )
        else:  # another model's cells (a fine-tune, its control) or the model as saved: named, not a candidate
            unscaled = " unscaled" if record.unscaled else ""
            checkpoint = f"{Path(record.model).name or record.model}{unscaled}"
            row = Row(f"checkpoint:{checkpoint}", "checkpoint", checkpoint=checkpoint)
            record = replace(record, label=row.label, unscaled=False)
        rows[row.label] = row
        cells.append(record)
    shipped = folder.resolve().parent == BATTERY_DIR.resolve()
    source = f"evals/measured/ruler/{folder.name}" if shipped else str(folder)
    source += "" if prompt == "plain" else f" ({prompt} template)"
    return Folder(source, rows, summarize(cells), skipped)


def read_folders(folder: str | Path, model: str) -> list[Folder]:
    """:func:`read_folder` for each prompt format with cells of ``model`` in ``folder`` (plain first)."""
    from ropescale.evals.tasks.ruler.prompt import PROMPTS

    found = [f for f in (read_folder(folder, model, p) for p in PROMPTS) if f is not None]
    for f in found[1:]:  # the files skipped are said once, with the first
        f.skipped = []
    return found


def is_battery(path: str | Path) -> bool:
    """Whether ``--results PATH`` names a RULER battery (a folder with ``cells/``, a folder of cell files,
    or the ``results.json`` ``ropescale eval ruler`` writes beside them)."""
    from ropescale.evals.tasks.ruler.record import SCHEMA

    path = Path(path)
    if path.is_file():
        try:
            return str(json.loads(path.read_text()).get("schema", "")).startswith("ropescale.ruler.")
        except (OSError, ValueError, AttributeError):
            return False
    if not path.is_dir():
        return False
    if (path / "cells").is_dir():
        return True
    from ropescale.evals.tasks.ruler.record import cell_files

    for f in cell_files(path)[:1]:
        try:
            return json.loads(f.read_text()).get("schema") == SCHEMA
        except (OSError, ValueError, AttributeError):
            return False
    return False


def battery_folders(model: str, paths: list[str | Path] | None = None, shipped: bool = True) -> list[Folder]:
    """The battery folders of ``model``: those named (``--results``; each must hold cells of it, or one
    line says why), then, with ``shipped``, the shipped ones that do. A folder holding cells of both prompt
    formats gives two (:func:`read_folders`)."""
    found = []
    for p in paths or []:
        folder = Path(p).parent if Path(p).is_file() else Path(p)
        got = read_folders(folder, model)
        if not got:
            from ropescale.evals.report.ruler_folder import read_ruler_cells as read_cells
            from ropescale.evals.tasks.ruler.record import cell_files

            records, skipped = read_cells(cell_files(folder))
            models = sorted({r.model for r in records})
            why = (
                f"its cells are of {', '.join(models)}"
                if models
                else (skipped[0] if skipped else "it has no cell files")
            )
            raise RopescaleError(f"RULER folder '{p}' holds no cell of model '{model}' ({why})")
        found += got
    if not shipped or not BATTERY_DIR.is_dir():
        return found
    return found + [f for d in sorted(d for d in BATTERY_DIR.glob("*") if d.is_dir()) for f in read_folders(d, model)]


def _cell_text(folder: Folder, task: str, entry: ScoreEntry) -> str:
    count = entry["score"] / 100 * entry["samples"]
    score = f"{round(count)}/{entry['samples']}" if abs(count - round(count)) < 1e-6 else f"{entry['score']:.0f} %"
    pct = folder.of_base(task, entry["score"])
    return score + ("" if pct is None else f" ({pct:.0f} % of base)")


def _fragment(folder: Folder, row: Row, target: int, params: bool) -> str:
    """``yarn ×4 niah_single_1 16k 27/30 (90 % of base), nothing at 32k``: the row's cells past L of the
    tasks the model can do (more than two at a length: their number and the worst, the rest in --verbose),
    then the lengths (up to the target) and tasks it has no cell for."""
    L, beyond, base = folder.context or 0, set(folder.beyond()), folder.base()
    scores = folder.scores(row.label)
    lengths = sorted({n for by in scores.values() for n in by if n > L} | {target})
    countable = sorted(t for t in base if t not in beyond) or sorted(t for t in scores if t not in beyond)
    items, gaps = [], []
    for n in lengths:
        there = [t for t in sorted(scores) if t not in beyond and n in scores[t]]
        if len(there) <= 2:
            items += [f"{t} {_k(n)} {_cell_text(folder, t, scores[t][n])}" for t in there]
        else:
            worst = min(there, key=lambda t: folder.of_base(t, scores[t][n]["score"]) or scores[t][n]["score"])
            items.append(f"{_k(n)} {len(there)} tasks, worst {worst} {_cell_text(folder, worst, scores[worst][n])}")
        missing = [t for t in countable if n not in scores.get(t, {})]
        if missing and len(missing) == len(countable):
            gaps.append(f"nothing at {_k(n)}")
        elif missing:
            gaps.append(f"{', '.join(missing) if len(missing) <= 2 else f'{len(missing)} tasks'} not at {_k(n)}")
    title = folder.title(row) if params else row.title(False)
    return f"{title} " + ", ".join(items + gaps) if items or gaps else f"{title}: no cell past L"


def holds(folder: Folder) -> list[Comparison]:
    """Per length past L where two or more methods have cells: over the tasks the model can do that two or
    more of them measured there, each method's worst score as % of the base, and the method(s) that hold
    across tasks: among the methods measured on every one of those tasks, the highest worst, when it keeps
    the relative effective-length share (85 % of base) on every task. Below that share on some task for
    every such method, none holds (empty ``holds``): the highest worst of methods that all fail is a
    comparison of two losses at 30 prompts, not a method that holds. A method measured on only some of the
    tasks (a variant tried on one task) is compared on those (``incomplete``: how many) and never holds;
    it does not shrink the others' comparison to its own tasks."""
    from ropescale.evals.tasks.ruler.measures import RELATIVE_SHARE, reaches

    base, beyond, L = folder.base(), set(folder.beyond()), folder.context or 0
    methods = [r for r in folder.rows.values() if r.kind == "method"]
    lengths = sorted({n for r in methods for by in folder.scores(r.label).values() for n in by if n > L})
    out: list[Comparison] = []
    for n in lengths:
        measured = {
            r.label: {t for t in base if t not in beyond and n in folder.scores(r.label).get(t, {})} for r in methods
        }
        shared = {t for ts in measured.values() for t in ts if sum(t in m for m in measured.values()) >= 2}
        tasks = sorted(shared)
        there = [r for r in methods if measured[r.label] & shared]
        if len(there) < 2:
            continue
        worst = {
            folder.title(r): min(
                folder.of_base(t, folder.scores(r.label)[t][n]["score"]) or 0.0 for t in measured[r.label] & shared
            )
            for r in there
        }
        incomplete = {folder.title(r): len(measured[r.label] & shared) for r in there if measured[r.label] < shared}
        complete = {m: v for m, v in worst.items() if m not in incomplete}
        top = max(complete.values(), default=None)
        held = [m for m, v in complete.items() if v == top and reaches(v, 100 * RELATIVE_SHARE)]
        out.append({"length": n, "tasks": tasks, "worst": worst, "holds": held, "incomplete": incomplete})
    return out


def _share() -> str:
    """The relative effective-length share as the messages say it: ``85 %``."""
    from ropescale.evals.tasks.ruler.measures import RELATIVE_SHARE  # not at import: it would load lm-eval's world

    return f"{100 * RELATIVE_SHARE:.0f} %"


def _floor() -> str:
    """The beyond-the-model floor as the messages say it: ``30 %``."""
    from ropescale.evals.tasks.ruler.report import BEYOND_FLOOR

    return f"{BEYOND_FLOOR:.0f} %"


def _holds_text(comparisons: list[Comparison], target: int, shown: set[str] = frozenset()) -> str | None:
    near = [c for c in comparisons if c["length"] <= target] or comparisons[:1]
    if not near:
        return None
    c = near[-1]
    # a method measured on only some tasks is left to --verbose: the short answer compares whole rows
    compared = [m for m in c["worst"] if m not in c.get("incomplete", {})]
    if set(compared) <= shown:  # every method compared is in the line already, each task with it (--verbose keeps it)
        return None
    best, others = c["holds"], [(m, _worst(c, m)) for m in compared if m not in c["holds"]]
    tasks = ", ".join(c["tasks"]) if len(c["tasks"]) <= 3 else f"{len(c['tasks'])} tasks"
    if not best:
        return (
            f"none holds across tasks at {_k(c['length'])} ({_share()} of base on each; worst "
            + ", ".join(f"{m} {v}" for m, v in others)
            + f"; over {tasks})"
        )
    return (
        f"holds across tasks at {_k(c['length'])}: {' and '.join(best)} (worst {c['worst'][best[0]]:.0f} % of base"
        + "".join(f"; {m} {v}" for m, v in others)
        + f"; over {tasks})"
    )


def _worst(c: Comparison, method: str) -> str:
    """``15 %``, or ``11 % (1 of 4 tasks)`` for a method measured on only some of the tasks compared."""
    k = c.get("incomplete", {}).get(method)
    return f"{c['worst'][method]:.0f} %" + ("" if k is None else f" ({k} of {len(c['tasks'])} tasks)")


def battery_line(rec: Any, folders: list[Folder]) -> tuple[str | None, BatteryRecord | None]:
    """The ``battery:`` line and the ``--json`` record, for ``rec`` (a Recommendation): the recommended
    method and its alternative past L, the method that holds across tasks, the tasks beyond the model;
    None when no battery cell of the model exists. The record's ``short`` is the short answer's line, built
    here from the cells (the recommended method's row, or the number of other scalings' rows where it has
    none, and the folder), not cut from the long line's text."""
    if not folders or rec.method is None:
        return None, None
    target, fine_tune = rec.target_length, rec.budget == "fine-tune"
    wanted = [(rec.method, rec.factor, rec.params, "")]
    if getattr(rec, "alternative", None):
        wanted.append((*rec.alternative, "alternative "))
    hits = [next(((f, r) for f in folders if (r := f.find(m, x, p))), None) for m, x, p, _ in wanted]
    home = next((h[0] for h in hits if h), folders[0])
    parts = []
    before = "before the fine-tune (training-free): " if fine_tune else ""
    short = None  # the short answer's clause where it differs from the line's first (a list it counts)
    if any(hits):
        for (m, x, _, role), hit in zip(wanted, hits):
            title = f"{role}{m} ×{x:g}"
            where = f" ({hit[0].source})" if hit and hit[0] is not home else ""  # another folder: its own base
            parts.append(
                f"{role}{_fragment(hit[0], hit[1], target, False)}{where}" if hit else f"{title}: not measured"
            )
        parts[0] = before + parts[0]
    else:
        names = " or ".join(f"{m} ×{x:g}" for m, x, _, _ in wanted)
        cells = [_fragment(home, r, target, True) for r in home.rows.values() if r.kind == "method"]
        parts.append(
            f"{before}not measured for {names} at {_k(target)}" + (f" (cells: {'; '.join(cells)})" if cells else "")
        )
        if cells:  # counted: the first cell alone would read as the only one there is
            n = len(cells)
            short = f"{before}not measured for {names} at {_k(target)} (cells of {n} other scaling{'s' * (n > 1)}: --verbose)"
    if fine_tune:
        parts += [_fragment(home, r, target, False) for r in home.rows.values() if r.kind == "checkpoint"]
    comparisons = holds(home)
    shown = {home.title(hit[1]) for hit in hits if hit and hit[0] is home}
    said = _holds_text(comparisons, target, shown)
    if said and not fine_tune:  # which training-free method holds is not the fine-tune's question
        parts.append(said)
    base = home.base()
    if home.beyond():
        at = {"/".join(_k(n) for n in base[t][1]) for t in home.beyond()}
        if len(at) == 1:
            from ropescale.evals.tasks.ruler.report import BEYOND_FLOOR

            # the short answer names them; --verbose has each base score
            parts.append(f"beyond the model (< {BEYOND_FLOOR:.0f} % at {at.pop()}): " + ", ".join(home.beyond()))
        else:
            listed = [f"{t} (base {base[t][0]:.0f} % at {'/'.join(_k(n) for n in base[t][1])})" for t in home.beyond()]
            parts.append("beyond the model at any length: " + ", ".join(listed))
    if not base:
        parts.append("no unscaled cells to compare with")
    skipped = [s for f in folders for s in f.skipped]
    where = f" ({home.source}" + (f"; {len(skipped)} files skipped, --verbose" if skipped else "") + ")"
    line = "; ".join(parts) + where
    # the short answer: the recommended method's row (or what there is instead) and the folder; the
    # alternative's row, what holds and the tasks beyond the model are --verbose's (its ``more:`` line says so)
    short = (short or parts[0]) + where
    record: BatteryRecord = {
        "line": line,
        "short": short,
        "holds": comparisons,
        "folders": [_record(f) for f in folders],
    }
    return line, record


def _record(folder: Folder) -> FolderRecord:
    rows = []  # RowRecord: the row's fields (Row's, in order) between its title and its scores
    order = {"unscaled": 0, "method": 1, "checkpoint": 2}
    for label, row in sorted(folder.rows.items(), key=lambda item: (order[item[1].kind], folder.title(item[1]))):
        tasks = {
            task: {str(n): {**e, "of_base": folder.of_base(task, e["score"])} for n, e in sorted(by.items())}
            for task, by in sorted(folder.scores(label).items())
        }
        measures = folder.summary["measures"].get(label, {})
        rows.append({"label": label, "title": row.title(), **row.__dict__, "tasks": tasks, "measures": measures})
    return {
        "source": folder.source,
        "original_context": folder.context,
        "base": {t: {"score": b, "lengths": n} for t, (b, n) in folder.base().items()},
        "beyond_the_model": folder.beyond(),
        "rows": rows,
        "holds": holds(folder),
        "skipped": folder.skipped,
    }


__all__ = [
    "BATTERY_DIR",
    "Folder",
    "Row",
    "battery_folders",
    "battery_line",
    "holds",
    "is_battery",
    "read_folder",
    "read_folders",
]
