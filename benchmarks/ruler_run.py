"""The runner of RULER's earlier cell layout (one file per task and length), for the experiment drivers.

``ropescale eval ruler`` runs through the suite runner (issue 53); the drivers here
(``extension_ruler.py``, ``cpu_finetune_x2.py``) keep this layout because their folders are seeded and
resumed task by task from the shipped cells (``evals/measured/ruler/``), which a suite cell (every task of
the battery at one length) cannot take one task at a time. The keying of the layout stays in the library
(:class:`ropescale.evals.tasks.ruler.earlier.EarlierCells`), which ``eval ruler`` reads to count such cells
as done; the running is here, as every experiment driver is (the library never imports benchmarks/).

Cells are written atomically to ``OUTPUT/cells/`` as they finish and skipped on a re-run when their file
records the same model (by content where recorded; its path is incidental), scaling request, samples, seed, haystack and runtime; a cell
cut short resumes at its first undecoded prompt (a journal beside it). A cell at a path this run writes
that measured something else stops the run naming the difference, as a suite's does
(:mod:`ropescale.evals.tasks.run_folder`); so do a folder of another task and files of a newer schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ropescale._io import atomic_write_json
from ropescale.evals.tasks.ruler.cell import run_ruler_cell
from ropescale.evals.tasks.ruler.earlier import EarlierCells, row_label
from ropescale.evals.tasks.ruler.record import SCHEMA, CellRecord, read_cells
from ropescale.evals.tasks.ruler.report import RulerReport
from ropescale.evals.tasks.ruler.tasks import RulerTask, essay_haystack
from ropescale.scaling import REPLACE


class RulerRun(EarlierCells):
    """Runs ``tasks`` × ``lengths`` of one scaling of ``model`` into ``output``; call :meth:`run`."""

    #: the report :meth:`run` wrote with ``report=True``
    summary: RulerReport | None = None
    #: called with each cell's path once it is written (a driver commits it at once: a sitting cut short
    #: inside the next cell keeps this one)
    on_cell: Callable[[Path], None] | None = None

    def check(self) -> None:
        """Stop, naming it, where the folder holds what this run must not replace or mix with its own
        cells: a file of another task or a newer schema, a cell at one of this run's paths that
        measured something else, or a cell of the same model name with other content
        (:mod:`ropescale.evals.tasks.run_folder`)."""
        from ropescale.evals.tasks.ruler.report import RESULTS_SCHEMA
        from ropescale.evals.tasks.run_folder import check_folder, check_model_content, compare

        check_folder(self.output, SCHEMA, RESULTS_SCHEMA, "ropescale eval ruler")
        records, _ = read_cells(sorted(self.cells_dir.glob("*.json")))
        cells = [(r.path, r.model, r.fingerprint.model_content) for r in records]
        check_model_content(self.output, cells, str(self.model), self.model_content)
        for task in self.tasks:
            for length in self.lengths:
                record = self.record(task.name, length)
                if record is not None:
                    ours = self.fingerprint(task.name, length).measured()
                    compare(record.path, record.fingerprint.measured(), ours, self.output)

    def pending(self) -> list[tuple[RulerTask, int]]:
        return [(t, n) for t in self.tasks for n in self.lengths if not self.is_done(t.name, n)]

    def run(self, report: bool = False) -> list[Path]:
        """Run the pending cells (holding the folder's lock); return every cell file of this run. With
        ``report``, write the folder's report under the same lock (:attr:`summary`: what it returned).

        Raises:
            RopescaleError: the folder holds what this run must not replace (:meth:`check`).
            ValueError: a length lm-eval's generators cannot fill, or fill with fewer samples than asked
                (:func:`.cell.cell_docs`), before the weights load.
        """
        from ropescale._lock import output_lock

        with output_lock(self.output, "results folder"):
            self.check()  # before anything is written
            todo = self.pending()
            if todo:
                from ropescale.evals.tasks.ruler.cell import cell_docs
                from ropescale.evals.tasks.ruler.prompt import check_prompt
                from ropescale.evals.tasks.ruler.tasks import check_fits
                from ropescale.models.loading import load_tokenizer

                tokenizer = load_tokenizer(self.model)
                check_prompt(self.prompt, tokenizer, str(self.model))  # a base model asked for chat: before weights
                essay = essay_haystack(self.essay_text) if self.essay_text else None
                for task, length in todo:  # a length lm-eval's generators cannot fill: said before weights load
                    check_fits(task, tokenizer, length, essay)
                docs = {  # a cell lm-eval fills short: said before weights load
                    (t.name, n): cell_docs(t, tokenizer, n, self.samples, self.seed, essay, self.prompt)
                    for t, n in todo
                }
                self._run(todo, docs)
            if report:
                from ropescale.evals.tasks.ruler.report import write_report

                self.summary = write_report(self.output, model=self.model)
        return [self.path(t.name, n) for t in self.tasks for n in self.lengths]

    def _run(self, todo: list[tuple[RulerTask, int]], docs: dict[tuple[str, int], Any]) -> None:
        from ropescale.evals.tasks.generation import PromptJournal
        from ropescale.models.loading import from_pretrained, load_tokenizer
        from ropescale.patching.model import attention_kernel, describe

        tokenizer = load_tokenizer(self.model)
        essay = essay_haystack(self.essay_text) if self.essay_text else None
        kwargs = self.runtime.load_kwargs() if self.runtime else {}
        s = self.scaling  # a method named here replaces a scaling the checkpoint ships with, unless asked to compose
        model = from_pretrained(self.model, s if s.as_saved or s.start else s.with_(start=REPLACE), **kwargs)
        model = (self.runtime.place(model) if self.runtime else model).eval()
        runtime = {**(self.runtime.to_dict() if self.runtime else {}), "attention": attention_kernel(model)}
        for task, length in todo:
            fingerprint = self.fingerprint(task.name, length)
            key, *before = fingerprint.journals()  # keyed by the model's content; journals keyed before resume
            journal = PromptJournal(self.path(task.name, length).with_suffix(".partial.jsonl"), key, also=before)
            cell = run_ruler_cell(
                model,
                tokenizer,
                task,
                length,
                self.samples,
                self.seed,
                essay,
                journal=journal,
                progress=self.progress,
                prompt=self.prompt,
                docs=docs[(task.name, length)],
            )
            record = CellRecord(
                fingerprint,
                label=row_label(s, self.prompt),
                unscaled=s.unscaled,
                scaling=describe(model),  # what the loaded model ran: the method and its resolved parameters
                rope_parameters=_rope_parameters(model),  # as the config holds them (a checkpoint as saved too)
                lm_eval_version=_lm_eval_version(),
                runtime=runtime,
                original_context=_original_context(model),
                result=cell,
            )
            atomic_write_json(self.path(task.name, length), record.to_json())
            journal.remove()
            if self.on_cell is not None:
                self.on_cell(self.path(task.name, length))


def _rope_parameters(model: Any) -> Any:
    return json.loads(json.dumps(getattr(model.config, "rope_parameters", None), default=str))


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def _original_context(model: Any) -> int:
    from ropescale.patching.plan import trained_context

    return trained_context(model.config)


__all__ = ["RulerRun"]
