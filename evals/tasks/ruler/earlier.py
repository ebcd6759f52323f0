"""The earlier layout of RULER's cells: one model, one scaling, tasks × lengths, one file per task and length.

``ropescale eval ruler`` runs through the suite runner since issue 53 (one runner for every task row);
what the library keeps of the earlier layout is its keying (:class:`EarlierCells`: a cell's fingerprint,
path and record, whether it is done), which :mod:`ropescale.evals.report.ruler_folder` reads to count
the cells ``eval ruler`` wrote before as done, and the row labels both layouts share. The runner that
writes this layout lives with the experiment drivers that still seed and resume their folders task by
task from the shipped cells (``benchmarks/ruler_run.py``: ``benchmarks/extension_ruler.py``,
``benchmarks/cpu_finetune_x2.py``); the library never imports it.

A cell file is a :class:`~.record.CellRecord` (:mod:`.record`: its layout, writing and reading); it counts
as done when it records the same model (name and content), scaling request, samples, seed, haystack and
runtime, with every sample asked.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from ropescale.evals.tasks.ruler.record import CellFingerprint, CellRecord
from ropescale.evals.tasks.ruler.tasks import RulerTask
from ropescale.scaling import Scaling


def row_label(scaling: Scaling, prompt: str = "plain") -> str:
    """A report row's label: the scaling's, with ``+chat`` for prompts in the chat template (a row of its
    own, compared with the unscaled model's chat cells only)."""
    return scaling.label + ("" if prompt == "plain" else f"+{prompt}")


def cell_name(scaling: Scaling, task: str, length: int, prompt: str = "plain") -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", f"{row_label(scaling, prompt)}__{task}__{length}")


class EarlierCells:
    """The cells of ``tasks`` × ``lengths`` of one scaling of ``model`` in ``output``, keyed as the earlier
    layout keyed them (``benchmarks/ruler_run.py``'s ``RulerRun`` adds the running)."""

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
        from ropescale.evals.tasks.run_folder import matches

        record = self.record(task, length)
        if record is None or not record.complete:
            return False
        ours = self.fingerprint(task, length)
        recorded = record.fingerprint
        return recorded.runtime == ours.runtime and matches(recorded.measured(), ours.measured())


__all__ = ["EarlierCells", "cell_name", "row_label"]
