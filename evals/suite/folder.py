"""A suite's results folder, cell by cell: where each cell's file is, what a finished cell must record to
count as done (its method settings, the resolved runtime, and the fingerprint of the model, data and
protocol it measured), the prompt journals of a cell in flight, and the report of what is done.

Nothing here loads weights: ``ropescale eval suite --report-only`` and the checks before a run read the
folder through :class:`SuiteFolder`; :class:`~.runner.SuiteRunner` adds the running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ropescale.evals.report.cell_keys import cell_id, same_scaling, scaling_run
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.suite.checks import entry_kernel
from ropescale.evals.suite.spec import MethodEntry, Suite
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.saved import is_saved
from ropescale.models.runtime import same_runtime


class SuiteFolder:
    """A suite's cells in ``output``: which are done, what each must record, its report."""

    def __init__(self, suite: Suite, output: str | Path):
        self.suite, self.output = suite, Path(output)
        self.cells_dir = self.output / "cells"
        self._runtime = None
        self._identity: dict[str, Any] | None = None
        self._saved_mode: str | None = None  # the attention-level mode the saved scaling installs
        self._resolve_saved()

    def _resolve_saved(self) -> None:
        """Entries resolved against what the checkpoint carries (:func:`.saved.resolve_saved`); a
        report of a folder copied without its model keeps them as written."""
        from ropescale.errors import RopescaleError
        from ropescale.evals.tasks.saved import resolve_saved
        from ropescale.models.loading import load_config
        from ropescale.patching.plan import plan_from_provenance

        try:
            config = load_config(self.suite.model)
        except (RopescaleError, OSError, ValueError):
            return
        self.suite = resolve_saved(self.suite, config)
        plan = plan_from_provenance(config)
        self._saved_mode = plan.attention_mode if plan is not None else None

    def measured(self, task: str) -> dict[str, Any]:
        """What a cell of ``task`` measures besides its method and runtime (:func:`.cell_keys.measured`)."""
        from ropescale.evals.report.cell_keys import measured

        if self._identity is None:
            from ropescale.errors import RopescaleError
            from ropescale.models.identity import data_identity, model_identity

            try:
                model = model_identity(self.suite.model)
            except RopescaleError:  # --report-only of a folder copied without its model: nothing matches
                model = {"name": self.suite.model, "fingerprint": None}
            self._identity = {"model": model, "data": data_identity(self.suite.data)}
        return measured(self.suite, self._identity, task)

    @property
    def runtime(self):
        """The suite's device/dtype/attention with ``auto`` resolved for this machine."""
        if self._runtime is None:
            from ropescale.models.runtime import resolve_runtime

            self._runtime = resolve_runtime(self.suite.device, self.suite.dtype, self.suite.attn_implementation)
        return self._runtime

    def runtime_for(self, entry: MethodEntry) -> dict[str, str]:
        """The runtime ``entry``'s cells run on: the suite's, with the attention kernel its mode runs."""
        if is_saved(entry.method):
            from ropescale.attention import kernel_for

            kernel = kernel_for(self._saved_mode, self.runtime.attention)
        else:
            kernel = entry_kernel(entry.method, entry.factor, entry.params, self.runtime.attention)
        return {**self.runtime.to_dict(), "attention": kernel}

    def cell_path(self, entry: MethodEntry, task: str, length: int) -> Path:
        return self.cells_dir / f"{cell_id(entry, task, length)}.json"

    def is_done(self, entry: MethodEntry, task: str, length: int) -> bool:
        """A cell counts as done only if its file records the same method settings."""
        from ropescale.errors import RopescaleError

        path = self.cell_path(entry, task, length)
        if not path.is_file():
            return False
        try:
            cell = SuiteCell.read(path)
        except RopescaleError:  # damaged, or not a cell of this layout: recomputed
            return False
        # a cell computed elsewhere (another dtype or kernel: a GPU run resumed on the CPU, bf16 on AMX
        # resumed on AVX512-BF16) is redone; cells written before runtimes (or bf16 kernels) were
        # recorded count as matching
        ours = self.runtime_for(entry)
        measured = json.loads(json.dumps(self.measured(task)))  # as it reads back
        return (
            cell.runs(entry)
            and same_runtime(ours if cell.runtime is None else cell.runtime, ours)
            and task_table.same_measured(None if cell.measured is None else cell.measured.to_json(), measured, task)
            and same_scaling(cell, scaling_run(self.suite.model, entry), entry)
        )

    def journal(self, entry: MethodEntry, task: str, length: int, part: str = ""):
        """The prompts a retrieval cell has finished, kept beside the cell until it is written, so
        that an interrupted cell resumes at its first unfinished prompt (``part``: one of several
        journals of a cell, e.g. a RULER task of the battery)."""
        from ropescale.evals.tasks.generation import PromptJournal
        from ropescale.evals.tasks.run_folder import by_content

        measured = self.measured(task)
        fingerprint = {
            "model": by_content(measured)["model"],  # its content: the same folder under another path resumes
            "method_name": entry.method,
            "factor": entry.factor,
            "params": entry.params,
            "scaling": scaling_run(self.suite.model, entry),  # a checkpoint's own parameters, resolved
            "runtime": self.runtime_for(entry),
            "measured": by_content(measured),
            **({"part": part} if part else {}),
        }
        named = {**fingerprint, "model": self.suite.model, "measured": measured}  # journals written before
        path = self.cell_path(entry, task, length)
        journal = path.with_name(path.stem + (f".{part}" if part else "") + ".partial.jsonl")
        return PromptJournal(journal, fingerprint, also=[named])

    def report(self) -> dict[str, Any]:
        """Write the report of the finished cells and, marked in progress, the partial ones
        (:func:`.in_progress.partial_cells`), without running anything."""
        from ropescale.evals.report.aggregate import write_report
        from ropescale.evals.report.cell_keys import check_protocols
        from ropescale.evals.report.in_progress import partial_cells
        from ropescale.evals.report.results_schema import check_suite_results

        check_protocols(self)  # a sized-down cell is not reported as the full suite's
        check_suite_results(self.output)  # a newer or another task's results.json is left as it is
        return write_report(self.suite, self.output, partial=partial_cells(self))

    def pending(self) -> list[tuple[MethodEntry, str, int]]:
        return [c for c in self.suite.cells() if not self.is_done(*c)]
