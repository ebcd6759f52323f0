"""The earlier layout of RULER's cells: one model, one scaling, tasks × lengths, one file per task and length.

``ropescale eval ruler`` runs through the suite runner since issue 53; what is left here is the keying
of the cells it wrote before (:meth:`RulerRun.fingerprint`, :meth:`RulerRun.is_done`, read by
:mod:`ropescale.evals.report.ruler_folder` to count them as done) and the runner the experiment drivers
still use (``benchmarks/extension_ruler.py``, ``benchmarks/cpu_finetune_x2.py``: their folders are of
this layout, seeded task by task from the shipped cells).

Cells are written atomically to ``OUTPUT/cells/`` as they finish and skipped on a re-run when
their file records the same model (name and content), scaling request, samples, seed, haystack and
runtime; a cell cut short resumes at its first undecoded prompt (a journal beside it). Runs of other
methods (or models) into the same folder add their cells, and the report (:mod:`.aggregate`) compares
them with the unscaled model's. A cell at a path this run writes that measured something else (another
model or content, seed, samples...) stops the run naming the difference, as a suite's does
(:mod:`ropescale.evals.tasks.run_folder`); so do a folder of another task and files of a newer schema. A
cell file is a :class:`~.record.CellRecord` (:mod:`.record`: its layout, writing and reading).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ropescale._io import atomic_write_json
from ropescale.evals.tasks.ruler.cell import run_ruler_cell
from ropescale.evals.tasks.ruler.record import SCHEMA, CellFingerprint, CellRecord, load_cells, read_cells
from ropescale.evals.tasks.ruler.tasks import RulerTask, essay_haystack
from ropescale.scaling import REPLACE, Scaling

if TYPE_CHECKING:
    from ropescale.evals.tasks.ruler.report import RulerReport


def row_label(scaling: Scaling, prompt: str = "plain") -> str:
    """A report row's label: the scaling's, with ``+chat`` for prompts in the chat template (a row of its
    own, compared with the unscaled model's chat cells only)."""
    return scaling.label + ("" if prompt == "plain" else f"+{prompt}")


def cell_name(scaling: Scaling, task: str, length: int, prompt: str = "plain") -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"{row_label(scaling, prompt)}__{task}__{length}")


class RulerRun:
    """Runs ``tasks`` × ``lengths`` of one scaling of ``model`` into ``output``; call :meth:`run`."""

    def __init__(
        self,
        model: str,
        scaling: Scaling,
        tasks: list[RulerTask],
        lengths: list[int],
        samples: int,
        output: str | Path,
        seed: int = 0,
        runtime: Any = None,
        essay_text: str | None = None,
        progress: bool = True,
        prompt: str = "plain",
    ):
        self.model, self.scaling, self.tasks, self.lengths = model, scaling, tasks, lengths
        self.samples, self.seed, self.output, self.progress = samples, seed, Path(output), progress
        self.runtime, self.essay_text, self.prompt = runtime, essay_text, prompt
        self.cells_dir = self.output / "cells"
        #: the report :meth:`run` wrote with ``report=True``
        self.summary: RulerReport | None = None

    @functools.cached_property
    def model_content(self) -> str | None:
        """The model's content fingerprint (:func:`ropescale.evals.tasks.run_folder.model_content`)."""
        from ropescale.evals.tasks.run_folder import model_content

        return model_content(str(self.model))

    def fingerprint(self, task: str, length: int) -> CellFingerprint:
        """What a cell's file must record for the cell to count as done."""
        from ropescale.evals.tasks.ruler.tasks import get_task
        from ropescale.evals.tasks.run_folder import text_fingerprint

        runtime = {k: v for k, v in self.runtime.to_dict().items() if k != "attention"} if self.runtime else {}
        essay = self.essay_text is not None and get_task(task).haystack == "essay"
        return CellFingerprint(
            str(self.model),
            self.scaling,
            task,
            length,
            self.samples,
            self.seed,
            runtime,
            self.prompt,
            self.model_content,
            text_fingerprint(self.essay_text) if essay else None,
        )

    def path(self, task: str, length: int) -> Path:
        return self.cells_dir / f"{cell_name(self.scaling, task, length, self.prompt)}.json"

    def record(self, task: str, length: int) -> CellRecord | None:
        path = self.path(task, length)
        try:
            return CellRecord.from_json(json.loads(path.read_text(encoding="utf-8")), path)
        except (OSError, ValueError):  # absent, damaged or not a cell of this layout: recomputed
            return None

    def is_done(self, task: str, length: int) -> bool:
        """The cell's file records what this run would measure (:meth:`fingerprint`; a key a cell
        written before it lacks counts as matching), on the same runtime, with every sample asked."""
        from ropescale.evals.tasks.run_folder import legacy

        record = self.record(task, length)
        if record is None or not record.complete:
            return False
        ours = self.fingerprint(task, length)
        recorded = record.fingerprint
        return recorded.runtime == ours.runtime and legacy(recorded.measured(), ours.measured()) == ours.measured()

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
            journal = PromptJournal(
                self.path(task.name, length).with_suffix(".partial.jsonl"),
                fingerprint.to_json(),
                also=[fingerprint.legacy_json()],  # a cell in progress before the content was recorded
            )
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


def _rope_parameters(model: Any) -> Any:
    return json.loads(json.dumps(getattr(model.config, "rope_parameters", None), default=str))


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def _original_context(model: Any) -> int:
    from ropescale.patching.plan import trained_context

    return trained_context(model.config)


__all__ = [
    "SCHEMA",
    "CellFingerprint",
    "CellRecord",
    "RulerRun",
    "Scaling",
    "cell_name",
    "row_label",
    "load_cells",
    "read_cells",
]
