"""``ropescale eval ruler``'s results folder: RULER's cells of both layouts, read as one kind of record, and
the folder's own report, for the one-method suite the command runs through the suite runner.

Since ``eval ruler`` became a front-end of the suite runner (issue 53), a folder holds suite cells
(:class:`~.cell_record.SuiteCell`, one per method and length holding every task of the battery:
:class:`~ropescale.evals.tasks.task_ruler.RulerBattery`) and, from runs before, RULER cells of
``ropescale.ruler.cell/1`` (one file per task: :class:`~ropescale.evals.tasks.ruler.record.CellRecord`).
:func:`read_ruler_cells` reads both as :class:`CellRecord` (one per task, what RULER's report, ``recommend``
and the frontier read); :class:`RulerFolder` is what the runner asks of the command: an earlier cell that
measured what a cell of this run would is read as done (:meth:`RulerFolder.check`), and the report is
RULER's (scores, retention, effective length) over every cell of the model in the folder, each run's.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.tasks.ruler.record import SCHEMA, CellFileError, CellFingerprint, CellRecord, cell_files
from ropescale.evals.tasks.ruler.report import RESULTS_SCHEMA, RulerReport, write_report
from ropescale.scaling import Scaling

COMMAND = "ropescale eval ruler"


@functools.lru_cache(maxsize=16)
def _trained_context(model: str) -> int | None:
    """The trained context L of ``model``'s config (what an earlier cell recorded as ``original_context``);
    None where the model is not here (a folder copied without it)."""
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import trained_context

    try:
        return int(trained_context(load_config(model)))
    except (RopescaleError, OSError, ValueError):
        return None


def task_records(cell: SuiteCell) -> list[CellRecord]:
    """A suite's RULER cell as one record per task of its battery, keyed as an earlier cell of that task
    was (the model by name and content, the scaling asked, samples, seed, runtime, prompt)."""
    from ropescale.evals.tasks.saved import is_saved

    battery = cell.result
    measured = cell.measured
    protocol = measured.protocol if measured is not None else {}
    model = str(measured.model.get("name")) if measured is not None else ""
    content = measured.model.get("fingerprint") if measured is not None else None
    scaling = Scaling.from_request(None if is_saved(cell.method_name) else cell.method_name, cell.factor, cell.params)
    runtime = dict(cell.runtime or {})
    out = []
    for name, result in battery.cells.items():
        fingerprint = CellFingerprint(
            model,
            scaling,
            name,
            result.length,
            int(protocol.get("samples", result.samples)),
            int(protocol.get("seed", result.seed)),
            {k: v for k, v in runtime.items() if k != "attention"},
            str(protocol.get("prompt", "plain")),
            content if isinstance(content, str) else None,
        )
        out.append(
            CellRecord(
                fingerprint,
                label=cell.label,
                unscaled=scaling.unscaled,
                scaling=dict(cell.scaling or {}),  # type: ignore[arg-type] - what the model ran, read back
                rope_parameters=None,
                lm_eval_version=battery.lm_eval_version or "",
                runtime=runtime,
                original_context=_trained_context(model),  # type: ignore[arg-type] - None: not known here
                result=result,
                path=cell.path,
            )
        )
    return out


def read_ruler_cells(paths: list[Path]) -> tuple[list[CellRecord], list[str]]:
    """The RULER cells among ``paths``, of either layout, as one record per task, and for every other file
    one line saying why it was skipped (not JSON, another task's cell, a schema this ropescale does not
    read, a key missing or of the wrong type)."""
    out: list[CellRecord] = []
    skipped: list[str] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            skipped.append(f"{path}: not readable as JSON ({exc.__class__.__name__})")
            continue
        if not isinstance(data, dict) or "schema" in data:  # the earlier layout names its schema
            try:
                out.append(CellRecord.from_json(data, path))
            except CellFileError as exc:
                skipped.append(f"{path}: {exc}")
            continue
        try:
            cell = SuiteCell.from_json(data, path)
        except RopescaleError as exc:
            skipped.append(f"{path}: {exc}")
            continue
        if cell.task != "ruler":
            skipped.append(f"{path}: a {cell.task} cell, not RULER's")
            continue
        out += task_records(cell)
    return out, skipped


def load_ruler_cells(folder: str | Path) -> list[CellRecord]:
    """Every RULER cell of ``folder`` (a run's, ``FOLDER/cells/``, or a shipped one), one record per task."""
    return read_ruler_cells(cell_files(folder))[0]


class RulerFolder:
    """What the suite runner asks of ``ropescale eval ruler`` (:class:`~ropescale.evals.suite.runner.SuiteRunner`'s
    ``front``): its ``results.json`` checked for its own schema, the earlier layout's cells read as done,
    and RULER's report written (:attr:`summary`)."""

    #: each run of the folder is a row of the report (a scaling, a prompt format, another model's cells):
    #: only this run's own cells are compared with what it measures (:meth:`check`)
    own_cells_only = True

    def __init__(self, essay_text: str | None = None):
        self.essay_text = essay_text
        self._adopted: set[tuple[str, int]] = set()

    def check_results(self, output: Path) -> None:
        """A ``results.json`` of another task or a newer schema: refused, naming it, before anything is written."""
        from ropescale.evals.tasks.run_folder import check_results

        check_results(output, RESULTS_SCHEMA, COMMAND)

    def check(self, runner: Any) -> None:
        """Refuse a cell of the model's name that recorded other weights; read as done each (method, length)
        of this run whose every task has a finished cell of the earlier layout that measured what this run would (:meth:`~ropescale.evals.tasks.ruler.earlier.EarlierCells.is_done`);
        refuse, naming the file, one that measured something else, or one of a (method, length) whose other
        tasks it lacks (running them would measure its tasks again beside it).

        Raises:
            RopescaleError: ``results folder 'o' holds none__fwe__1024.json, measured with a different
                protocol.samples: 1 -> 2; ...`` or ``... holds none__fwe__1024.json, a RULER cell of the
                earlier layout, without niah_single_1 at 1024 beside it; ...``.
        """
        from ropescale.evals.tasks.ruler.earlier import EarlierCells
        from ropescale.evals.tasks.ruler.tasks import get_task
        from ropescale.evals.tasks.run_folder import check_model_content, compare, model_content

        suite = runner.suite
        records = load_ruler_cells(runner.output)  # a cell of the model's name with other weights: refused
        cells = [(r.path, r.model, r.fingerprint.model_content) for r in records if r.path is not None]
        check_model_content(runner.output, cells, str(suite.model), model_content(str(suite.model)))
        settings = suite.settings("ruler")
        seed = suite.seed if settings.seed is None else settings.seed
        tasks = [get_task(t) for t in settings.tasks]
        for entry, task, length in suite.cells():
            if task != "ruler":
                continue
            scaling = Scaling.from_request(
                None if entry.method == "saved" else entry.method, entry.factor, entry.params
            )
            run = EarlierCells(
                suite.model,
                scaling,
                tasks,
                [length],
                settings.samples,
                runner.output,
                seed,
                runner.runtime,
                self.essay_text,
                progress=False,
                prompt=settings.prompt,
            )
            records = {t.name: r for t in tasks if (r := run.record(t.name, length)) is not None}
            if not records:  # none, or a damaged one: the report names it and skips it
                self._carry_journals(runner, run, entry, length)
                continue
            for name, record in records.items():
                ours = run.fingerprint(name, length).measured()
                compare(record.path, record.fingerprint.measured(), ours, runner.output)
            found = list(records)
            missing = [t.name for t in tasks if not run.is_done(t.name, length)]
            if not missing:
                self._adopted.add((entry.label, length))
                continue
            raise RopescaleError(
                f"results folder '{runner.output}' holds {run.path(found[0], length).name}, a RULER cell of the "
                f"layout before eval ruler ran through the suite runner, without a finished {missing[0]} at "
                f"{length} beside it: ask --tasks {','.join(found)} to read it as done, or give another --output"
            )

    @staticmethod
    def _carry_journals(runner: Any, run: Any, entry: Any, length: int) -> None:
        """A cell of the earlier layout in progress (its prompt journal, keyed as that layout keyed it):
        its decoded prompts carried into the journal of the suite cell that runs its task, so that the
        run resumes where it stopped (a 32k prompt costs minutes on a CPU); the old journal is left as it is."""
        from ropescale.evals.tasks.generation import PromptJournal

        if runner.is_done(entry, "ruler", length):
            return
        for task in run.tasks:
            old = run.path(task.name, length).with_suffix(".partial.jsonl")
            if old.is_file():
                fingerprint = run.fingerprint(task.name, length)
                key, *before = fingerprint.journals()
                earlier = PromptJournal(old, key, also=before)
                runner.journal(entry, "ruler", length, task.name).carry(earlier)

    def done(self, entry: Any, task: str, length: int) -> bool:
        """Whether the earlier layout's cells hold this (method, length) (:meth:`check`)."""
        return (entry.label, length) in self._adopted

    def write_report(self, runner: Any) -> RulerReport:
        """RULER's report of every cell of the model in the folder, both layouts (``report.md``, ``results.json``)."""
        records = load_ruler_cells(runner.output)
        return write_report(
            runner.output, model=runner.suite.model, cells=records, shipped_context=runner.suite.shipped_context
        )


__all__ = ["COMMAND", "RESULTS_SCHEMA", "SCHEMA", "RulerFolder", "load_ruler_cells", "read_ruler_cells", "task_records"]
