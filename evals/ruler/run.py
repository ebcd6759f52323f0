"""``ropescale eval ruler``'s runner: one model, one scaling, tasks × lengths, one file per cell.

Cells are written atomically to ``OUTPUT/cells/`` as they finish and skipped on a re-run when
their file records the same model, scaling request, samples, seed and runtime; a cell cut short
resumes at its first undecoded prompt (a journal beside it). Runs of other methods into the same
folder add their cells, and the report (:mod:`.report`) compares them with the unscaled model's. A
cell file is a :class:`~.record.CellRecord` (:mod:`.record`: its layout, writing and reading).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ropescale._io import atomic_write_json
from ropescale.evals.ruler.cell import run_ruler_cell
from ropescale.evals.ruler.record import SCHEMA, CellFingerprint, CellRecord, Scaling, load_cells, read_cells
from ropescale.evals.ruler.tasks import RulerTask, essay_haystack


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

    def fingerprint(self, task: str, length: int) -> CellFingerprint:
        """What a cell's file must record for the cell to count as done."""
        runtime = {k: v for k, v in self.runtime.to_dict().items() if k != "attention"} if self.runtime else {}
        return CellFingerprint(
            str(self.model), self.scaling, task, length, self.samples, self.seed, runtime, self.prompt
        )

    def path(self, task: str, length: int) -> Path:
        return self.cells_dir / f"{cell_name(self.scaling, task, length, self.prompt)}.json"

    def is_done(self, task: str, length: int) -> bool:
        path = self.path(task, length)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        ours = json.loads(json.dumps(self.fingerprint(task, length).to_json()))
        return record.get("schema") == SCHEMA and record.get("fingerprint") == ours

    def pending(self) -> list[tuple[RulerTask, int]]:
        return [(t, n) for t in self.tasks for n in self.lengths if not self.is_done(t.name, n)]

    def run(self) -> list[Path]:
        """Run the pending cells (holding the folder's lock); return every cell file of this run."""
        from ropescale._lock import output_lock

        with output_lock(self.output, "results folder"):
            todo = self.pending()
            if todo:
                from ropescale.evals.ruler.prompt import check_prompt
                from ropescale.evals.ruler.tasks import check_fits
                from ropescale.models.loading import load_tokenizer

                tokenizer = load_tokenizer(self.model)
                check_prompt(self.prompt, tokenizer, str(self.model))  # a base model asked for chat: before weights
                essay = essay_haystack(self.essay_text) if self.essay_text else None
                for task, length in todo:  # a length lm-eval's generators cannot fill: said before weights load
                    check_fits(task, tokenizer, length, essay)
                self._run(todo)
        return [self.path(t.name, n) for t in self.tasks for n in self.lengths]

    def _run(self, todo: list[tuple[RulerTask, int]]) -> None:
        from ropescale.evals.generation import PromptJournal
        from ropescale.models.loading import from_pretrained, load_tokenizer
        from ropescale.patching.model import attention_kernel, describe

        tokenizer = load_tokenizer(self.model)
        essay = essay_haystack(self.essay_text) if self.essay_text else None
        kwargs = self.runtime.load_kwargs() if self.runtime else {}
        s = self.scaling
        model = from_pretrained(
            self.model, method=s.method, factor=s.factor, replace=True, method_params=dict(s.params) or None, **kwargs
        )
        model = (self.runtime.place(model) if self.runtime else model).eval()
        runtime = {**(self.runtime.to_dict() if self.runtime else {}), "attention": attention_kernel(model)}
        for task, length in todo:
            fingerprint = self.fingerprint(task.name, length)
            journal = PromptJournal(self.path(task.name, length).with_suffix(".partial.jsonl"), fingerprint.to_json())
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
