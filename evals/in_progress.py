"""What a suite's unfinished retrieval cells hold so far, for ``ropescale eval suite --report-only``.

A passkey cell records each decoded prompt in its journal (:class:`.generation.PromptJournal`) until
the cell is written; these helpers read the journals (never write them) and score what is there,
so a run cut short, or one still going, can be reported with its cells in progress marked as such.
"""

from __future__ import annotations

from typing import Any


def partial_cells(runner: Any) -> list[tuple[Any, str, int, dict[str, Any]]]:
    """``(entry, task, length, result flagged "partial")`` of the unfinished
    passkey cells whose journals hold some prompts: what a run cut short has so far. Reads the
    tokenizer, never the weights; the journals are only read. ``runner``: a :class:`.suite.SuiteRunner`."""
    from ropescale.evals.passkey import partial_passkey
    from ropescale.models.loading import load_tokenizer

    todo = [c for c in runner.pending() if c[1] == "passkey" and runner.journal(*c).path.is_file()]
    if not todo:
        return []
    tokenizer = load_tokenizer(runner.suite.model)
    depths, trials = runner.suite.passkey.get("depths", [0.5]), int(runner.suite.passkey.get("trials", 1))
    jitter = runner.suite.passkey.get("jitter", 0.0)
    records = []
    for entry, task, length in todo:
        journal = runner.journal(entry, task, length)
        result = partial_passkey(tokenizer, journal, [length], depths, trials, seed=runner.suite.seed, jitter=jitter)
        if result is None:
            continue
        total = len(depths) * trials
        done = {**result.to_dict(), "partial": {"prompts": len(result.records), "of": total}}
        records.append((entry, task, length, done))
    return records
