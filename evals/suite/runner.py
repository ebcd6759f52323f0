"""Running a suite: the model loaded once and re-patched per method, each pending cell run through its
task's row and written atomically to ``cells/`` as soon as it finishes, then the report.

Every (method, task, length) cell is never recomputed unless its method settings or resolved runtime —
device, dtype, attention kernel — differ from this run's (:mod:`.folder`), so an interrupted run loses at
most the cell in flight. Patching touches the rotary module, not the weights.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.suite.checks import check_against_model
from ropescale.evals.suite.folder import SuiteFolder
from ropescale.evals.suite.parse import load_suite
from ropescale.evals.suite.spec import MethodEntry, Suite, suite_dict
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.saved import is_saved
from ropescale.evals.tasks.task_base import CellContext
from ropescale.models.runtime import load_average


class Front(Protocol):
    """A command that runs its flags as a one-method suite and keeps a report of its own (``eval ruler``:
    :class:`~ropescale.evals.report.ruler_folder.RulerFolder`): the runner and the cells stay the suite's."""

    #: cells at other paths are other runs' rows of its report, not compared with this run's protocol
    own_cells_only: bool

    def check_results(self, output: Path) -> None:
        """Refuse a ``results.json`` the command does not write (instead of the suite's check)."""

    def check(self, runner: SuiteRunner) -> None:
        """Refuse, before anything is written, what the folder holds that this run must not mix with."""

    def done(self, entry: MethodEntry, task: str, length: int) -> bool:
        """A cell the folder holds in the command's earlier layout, read as done."""
        ...

    def write_report(self, runner: SuiteRunner) -> Any:
        """The command's report of the folder, returned to it."""


class SuiteRunner(SuiteFolder):
    """Runs a suite into ``output``; call :meth:`run`. ``front``: the command whose report it writes
    (None: the suite's own)."""

    def __init__(self, suite: Suite, output: str | Path, progress: bool = True, front: Front | None = None):
        self.progress = progress
        self.front = front
        self.data: dict[str, Any] = {}  # task -> what its cells read (Task.prepare)
        self._journals: list[Any] = []  # the prompt journals of the cell in flight
        self._bars = progress  # progress bars shown (a terminal watches): set per run
        super().__init__(suite, output)

    def run(self) -> dict[str, Any]:
        """Run the pending cells and write the report, holding the results folder's lock."""
        from ropescale._lock import output_lock
        from ropescale.evals.report.results_schema import check_suite_results

        with output_lock(self.output, "results folder"):
            # a newer or another task's results.json: before anything is written
            (self.front.check_results if self.front else check_suite_results)(self.output)
            return self._run()

    def pending(self) -> list[tuple[MethodEntry, str, int]]:
        """The cells to run: not done, nor held by the front's earlier layout (:meth:`Front.done`)."""
        return [c for c in super().pending() if self.front is None or not self.front.done(*c)]

    def _run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        from ropescale.evals.report.cell_keys import check_measured
        from ropescale.evals.tasks.saved import scaling_origin
        from ropescale.models.loading import from_pretrained, load_config, load_tokenizer
        from ropescale.patching.model import attention_kernel, patch
        from ropescale.patching.readback import restore_scaling, scaling_of, snapshot_scaling

        self.runtime  # noqa: B018 — a device/dtype/kernel this machine lacks fails before anything is written
        # everything that can fail on bad input is checked before the output or the weights are touched
        config = load_config(self.suite.model)
        check_against_model(self.suite, config)  # each method planned on the config, before any weights
        from ropescale.evals.suite.lengths import check_lengths
        from ropescale.patching.shipped import shipped_of

        shipped = shipped_of(
            config, self.suite.shipped_context
        )  # the contexts the patch starts from, as the suite's L and S resolved
        check_lengths(self.suite, shipped.pretraining, shipped.context)
        check_measured(self)  # cells of another model, data or protocol: stop before anything is written
        if self.front is not None:
            self.front.check(self)  # the command's earlier cells, read as done or refused
        todo = self.pending()
        if todo:  # the tokenizer and the data can be refused too: before the folder is written
            tokenizer = load_tokenizer(self.suite.model)
            self._prepare_data(tokenizer)
        self.output.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.output / "suite.yaml", yaml.safe_dump(suite_dict(self.suite), sort_keys=False))
        if todo:
            model = self.runtime.place(from_pretrained(self.suite.model, **self.runtime.load_kwargs()))
            as_loaded = snapshot_scaling(model)  # the checkpoint's own scaling, for its `saved` rows
            key = lambda s: (s["method"], s["params"])  # noqa: E731 — what makes two scalings the same
            loaded = key(scaling_of(model))
            total = len(self.suite.cells())
            # a bar only where someone watches it; in a log (nohup, CI, a pipe) or under --no-progress a
            # run says one line per finished cell, so that hours of cells are never hours of silence
            self._bars = self.progress and sys.stderr.isatty()
            lines = not self._bars or not sys.stdout.isatty()  # a log of stdout gets them beside a bar too
            bar = tqdm(total=total, initial=total - len(todo), desc="suite cells", disable=not self._bars, unit="cell")
            if lines:
                print(f"{self.suite.name}: {len(todo)} of {total} cells to run, into {self.output}", flush=True)
            current = None
            for i, (entry, task, length) in enumerate(todo):
                if entry != current and is_saved(entry.method):
                    restore_scaling(model, as_loaded)
                elif entry != current:
                    if entry.scaling.compose:  # on the scaling the checkpoint ships with
                        restore_scaling(model, as_loaded)
                    patch(model, entry.scaling)
                current = entry
                bar.set_postfix_str(f"{entry.label} {task} {length}")
                load = load_average()  # beside the result: a cell timed beside another job says so
                started = time.monotonic()
                result = self._run_cell(model, tokenizer, entry, task, length)
                seconds = time.monotonic() - started
                # the kernel that ran: an attention-level mode runs SDPA/eager, not the suite's flash-attn
                runtime = {**self.runtime.to_dict(), "attention": attention_kernel(model)}
                # what ran, read back from the model (not from the request), and how it relates to the saved one
                ran = scaling_of(model)
                scaling = {**ran, "as": scaling_origin(entry, self.suite.carries, key(ran) == loaded)}
                load_avg = [load, load_average()]
                cell = SuiteCell.of(entry, task, length, runtime, result, self.measured(task), scaling, load_avg)
                atomic_write_json(self.cell_path(entry, task, length), cell.to_json())
                for journal in self._journals:
                    journal.remove()
                bar.update(1)
                if lines:
                    from ropescale.evals.tasks.report_cells import cell_line

                    print(
                        cell_line(
                            task_table.get(task), entry, length, result, seconds, total - len(todo) + i + 1, total
                        ),
                        flush=True,
                    )
            bar.close()
        if self.front is not None:
            return self.front.write_report(self)
        from ropescale.evals.report.aggregate import write_report

        return write_report(self.suite, self.output)

    # -- data ------------------------------------------------------------------------------------
    def _prepare_data(self, tokenizer) -> None:
        """What each task reads (documents, a haystack), refused in one line before the weights load."""
        self.data = {
            t: task_table.get(t).prepare(self.suite, self.suite.settings(t), tokenizer) for t in self.suite.tasks()
        }

    # -- cells -----------------------------------------------------------------------------------
    def _run_cell(self, model, tokenizer, entry: MethodEntry, task: str, length: int) -> Any:
        """One cell through its task's row: its typed result (the row's ``result`` class)."""
        self._journals = []

        def journal_for(part: str):
            journal = self.journal(entry, task, length, part)
            self._journals.append(journal)
            return journal

        # a prompt bar only where the cell bar is shown
        ctx = CellContext(
            model, tokenizer, entry, self.suite.seed, self.data[task], self._bars, journal_for, self.output
        )
        return task_table.get(task).run_cell(ctx, self.suite.settings(task), length)


def run_suite(suite: Suite | str | Path, output: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a suite; returns the aggregated results also written to ``output``."""
    if not isinstance(suite, Suite):
        suite = load_suite(suite)
    return SuiteRunner(suite, output, progress).run()
