"""A RULER cell finished from the journal of an interrupted run says so (issue 54: each cell records what
it ran under): ``resumed`` gives how many prompts came from the journal, what they cost and the load
averages they ran under, and ``elapsed_s`` counts their time, not only the minutes of the run that
finished the cell. A cell measured in one run has no ``resumed`` key, as files before it."""

from __future__ import annotations

import pytest

from ropescale.evals.tasks.generation import PromptJournal
from ropescale.evals.tasks.ruler import cell as cell_module
from ropescale.evals.tasks.ruler.cell import RulerCell
from ropescale.evals.tasks.ruler.tasks import TASKS
from tests.evals.ruler_fixtures import ruler_tokenizer


def test_a_cell_resumed_from_its_journal_counts_the_journaled_prompts_time(monkeypatch, tmp_path):
    tok, task = ruler_tokenizer(), TASKS["niah_single_1"]
    journal = PromptJournal(tmp_path / "cell.partial.jsonl", {"f": 1})

    def interrupted(model, tokenizer, prompts, max_new_tokens, journal=None, **kw):
        journal.texts(prompts, max_new_tokens)  # starts the file, as greedy_generate does
        journal.record(prompts[0], max_new_tokens, " 1", seconds=120.0, load=1.9)  # one prompt, two minutes
        journal.record(prompts[1], max_new_tokens, " 2", seconds=60.0, load=2.4)
        raise KeyboardInterrupt

    def finishing(model, tokenizer, prompts, max_new_tokens, journal=None, **kw):
        return [" 7"] * len(prompts)  # the rest, in no time

    monkeypatch.setattr(cell_module, "greedy_generate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cell_module.run_ruler_cell(None, tok, task, 1024, 3, journal=journal)
    monkeypatch.setattr(cell_module, "greedy_generate", finishing)
    cell = cell_module.run_ruler_cell(None, tok, task, 1024, 3, journal=journal)
    assert cell.resumed == {"prompts": 2, "seconds": 180.0, "load_avg": [1.9, 2.4]}
    assert 180.0 <= cell.elapsed_s < 240.0  # the journaled prompts' three minutes, and this run's seconds
    data = cell.to_dict()
    assert data["resumed"] == cell.resumed and RulerCell.from_dict(data).resumed == cell.resumed

    fresh = cell_module.run_ruler_cell(None, tok, task, 1024, 3, journal=None)
    assert fresh.resumed is None and "resumed" not in fresh.to_dict() and fresh.elapsed_s < 60.0
