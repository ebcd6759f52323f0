"""``ropescale eval longppl``'s results folder: LongPPL's cells of both layouts, listed in one shape, and
the folder's own report, for the suite the command runs through the suite runner.

Since ``eval longppl`` became a front-end of the suite runner (issue 53), a folder holds suite cells
(:class:`~.cell_record.SuiteCell` of the LongPPL row, one per scaling and length, at the file names the
command always used) and, from runs before, cells of ``ropescale.longppl.cell/1``. :func:`folder_cells`
lists both as :class:`~ropescale.evals.tasks.records.LongPPLCellFile` (what ``results.json`` lists);
:class:`LongPPLFolder` is what the runner asks of the command: an earlier cell that measured what this
run would is read as done (:meth:`LongPPLFolder.check`), and the report is LongPPL's over every cell of the
folder scored with this run's evaluator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.tasks.longppl_run import RESULTS_SCHEMA, SCHEMA, CellKeys, write_report
from ropescale.evals.tasks.records import EvaluatorJSON, LongPPLCellFile, LongPPLFingerprint, LongPPLSummary
from ropescale.scaling import Scaling

COMMAND = "ropescale eval longppl"


def cell_row(cell: SuiteCell) -> LongPPLCellFile:
    """A suite's LongPPL cell as ``results.json`` lists the command's cells: what it measured (the model by
    name and content, the scaling asked, the length, the evaluator, the windows and the data), its label,
    the scaling the model ran (read back from it) and its result (the evaluator moved to the fingerprint)."""
    from ropescale.evals.tasks.saved import is_saved

    result = dict(cell.result_json)
    judge = result.pop("evaluator", {})
    measured = cell.measured
    model = measured.model if measured is not None else {}
    protocol = measured.protocol if measured is not None else {}
    asked = Scaling.from_request(None if is_saved(cell.method_name) else cell.method_name, cell.factor, cell.params)
    fingerprint = LongPPLFingerprint(
        model=str(model.get("name")),
        scaling_requested=asked.request(),
        length=cell.length,
        evaluator=judge,  # type: ignore[typeddict-item] - the result's evaluator record
        documents=int(protocol.get("documents", 1)),  # type: ignore[arg-type] - a positive int, checked
    )
    if model.get("fingerprint") is not None:
        fingerprint["model_content"] = str(model["fingerprint"])
    if measured is not None and measured.data is not None:
        fingerprint["data"] = measured.data
    return {
        "fingerprint": fingerprint,
        "label": cell.label,
        "scaling": dict(cell.scaling or {}),  # type: ignore[typeddict-item] - what the model ran, read back
        "length": cell.length,
        "result": result,  # type: ignore[typeddict-item] - the row's totals
    }


def folder_cells(output: str | Path) -> list[tuple[Path, LongPPLCellFile]]:
    """Every LongPPL cell of ``output``, both layouts, with its file; a file of neither (another task's, not
    JSON) is left out (the run refuses those that matter before it writes, :func:`.cell_keys.check_measured`)."""
    out = []
    for path in sorted((Path(output) / "cells").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if data.get("schema") == SCHEMA:
            out.append((path, data))
            continue
        try:
            cell = SuiteCell.from_json(data, path)
        except RopescaleError:
            continue
        if cell.task == "longppl":
            out.append((path, cell_row(cell)))
    return out


class LongPPLFolder:
    """What the suite runner asks of ``ropescale eval longppl`` (:class:`~ropescale.evals.suite.runner.SuiteRunner`'s
    ``front``): its ``results.json`` checked for its own schema, the earlier layout's cells read as done,
    and LongPPL's report written."""

    #: cells of other scalings or evaluators are the report's to tell apart: only this run's are compared
    own_cells_only = True

    def __init__(self) -> None:
        self._adopted: set[tuple[str, int]] = set()
        self.judge: EvaluatorJSON | None = None

    def check_results(self, output: Path) -> None:
        """A ``results.json`` of another task or a newer schema: refused, naming it, before anything is written."""
        from ropescale.evals.tasks.run_folder import check_results

        check_results(output, RESULTS_SCHEMA, COMMAND)

    def _judge(self, runner: Any) -> EvaluatorJSON:
        from ropescale.evals.tasks.longppl_run import evaluator_record
        from ropescale.evals.tasks.task_longppl import evaluator_scaling

        settings = runner.suite.settings("longppl")
        scaling = evaluator_scaling(settings)
        return evaluator_record(runner.suite.model, settings.evaluator, scaling, settings.trunc_len, settings.internal)

    def check(self, runner: Any) -> None:
        """Refuse a cell of the model's name that recorded other weights; read as done a cell of the earlier
        layout at a path this run writes that measured what it would (:class:`CellKeys`), refuse one that
        measured something else (never replaced: the path is the same).

        Raises:
            RopescaleError: ``results folder 'o' holds none__longppl__160.json, measured with a different
                data: 'a.txt' -> 'b.txt'; ...``.
        """
        from ropescale.evals.tasks.run_folder import check_model_content, model_content

        suite = runner.suite
        self.judge = self._judge(runner)
        cells = [
            (p, str(r["fingerprint"].get("model")), r["fingerprint"].get("model_content"))
            for p, r in folder_cells(runner.output)
        ]
        check_model_content(runner.output, cells, str(suite.model), model_content(str(suite.model)))
        earlier = [
            (entry, length)
            for entry, task, length in suite.cells()
            if task == "longppl" and _schema(runner.cell_path(entry, task, length)) == SCHEMA
        ]
        if not earlier:
            return
        keys = self._keys(runner)
        for entry, length in earlier:
            scaling = Scaling.from_request(entry.method, entry.factor, entry.params)
            if keys.done(runner.output, scaling, length):
                self._adopted.add((entry.label, length))
                continue
            keys.check(runner.output, [scaling], [length])  # names the difference
            raise RopescaleError(
                f"results folder '{runner.output}' holds {runner.cell_path(entry, 'longppl', length).name}, a LongPPL "
                "cell of the layout before eval longppl ran through the suite runner, that this run would replace: "
                "give another --output"
            )

    def _keys(self, runner: Any) -> CellKeys:
        """What an earlier cell of this run recorded: its windows come from the tokenizer and the data."""
        from ropescale.data.documents import load_documents
        from ropescale.evals.tasks.longppl_run import text_windows
        from ropescale.models.loading import load_tokenizer

        suite = runner.suite
        settings = suite.settings("longppl")
        data = settings.data or suite.data
        lengths = suite.block("longppl")["lengths"]
        windows = text_windows(load_tokenizer(suite.model), load_documents(data), lengths, settings.documents)
        assert self.judge is not None
        return CellKeys(suite.model, self.judge, settings.documents, data, windows)

    def done(self, entry: Any, task: str, length: int) -> bool:
        """Whether an earlier layout's cell holds this (scaling, length) (:meth:`check`)."""
        return (entry.label, length) in self._adopted

    def write_report(self, runner: Any) -> LongPPLSummary:
        """LongPPL's report of the folder's cells scored with this run's evaluator (``report.md``, ``results.json``)."""
        judge = self.judge or self._judge(runner)
        return write_report(runner.output, judge, [row for _, row in folder_cells(runner.output)])


def _schema(path: Path) -> Any:
    from ropescale.evals.tasks.run_folder import schema_of

    return schema_of(path)[1] if path.is_file() else None


__all__ = ["COMMAND", "LongPPLFolder", "cell_row", "folder_cells"]
