"""What a suite's unfinished cells hold so far, for ``ropescale eval suite --report-only``.

A retrieval cell records each decoded prompt in its journal (:class:`.generation.PromptJournal`) until
the cell is written; a task's row scores what its journal holds (:meth:`.task_base.Task.partial`;
passkey's reads it back). These helpers read the journals (never write them), so a run cut short, or
one still going, can be reported with its cells in progress marked as such.
"""

from __future__ import annotations

from typing import Any

from ropescale.evals.report.cell_record import SuiteCell


def partial_cells(runner: Any) -> list[SuiteCell]:
    """The records of the unfinished cells whose journals hold some prompts, each result flagged
    ``partial``: what a run cut short has so far. Reads the tokenizer, never the weights; the journals
    are only read. ``runner``: a :class:`.runner.SuiteRunner`."""
    from ropescale.evals.tasks import task_table
    from ropescale.models.loading import load_tokenizer

    todo = [c for c in runner.pending() if runner.journal(*c).path.is_file()]
    if not todo:
        return []
    tokenizer = load_tokenizer(runner.suite.model)
    records = []
    for entry, task, length in todo:
        settings = runner.suite.settings(task)
        result = task_table.get(task).partial(runner, entry, length, settings, tokenizer)
        if result is not None:
            records.append(SuiteCell.of(entry, task, length, runner.runtime_for(entry), result, runner.measured(task)))
    return records
