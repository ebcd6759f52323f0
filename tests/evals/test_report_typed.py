"""The report's half reads each cell's typed result (issue 40, point 1): every task row's section, value
and plot is drawn from :attr:`.report.TaskTable.results` (the ``result`` class the row declares, read
once with the cell file), never from the result's JSON, and a table holding anything else refuses it.

The cells are ``tests/data/suite_cells/`` (see ``test_suite_cell_record.py``); the sections they render
are those of its golden ``report.md``.
"""

from __future__ import annotations

import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest

from ropescale.evals.report.aggregate import TaskTable, collect
from ropescale.evals.report.cell_record import load_cells
from ropescale.evals.tasks.report_cells import render_values
from tests.evals.test_suite_cell_record import golden_suite

DATA = Path(__file__).resolve().parents[1] / "data" / "suite_cells"


class JSONUnread(TaskTable):
    """A task table whose cells' JSON cannot be read: a renderer that reads it fails the test."""

    @property
    def table(self):
        raise AssertionError(f"the {self.task} row read its cells' JSON (TaskTable.table), not their typed results")


@pytest.fixture
def golden(tmp_path):
    """The golden suite's cells and the ruler fixture's battery, with the suite that reports them."""
    (tmp_path / "cells").mkdir()
    for path in [*(DATA / "cells").glob("*.json"), DATA / "ruler" / "none__ruler__1024.json"]:
        shutil.copy(path, tmp_path / "cells")
    suite = golden_suite("MODEL", ruler={"lengths": [1024], "tasks": ["niah_single_1", "fwe"], "samples": 1})
    return suite, load_cells(tmp_path)


def test_every_rows_section_value_and_plot_reads_the_typed_results_only(golden, tmp_path, monkeypatch):
    import ropescale.evals.tasks.report_cells as report_cells

    suite, cells = golden
    labels, entries = [m.label for m in suite.methods], {m.label: m for m in suite.methods}
    drawn = []
    monkeypatch.setattr(report_cells, "plot_perplexity_curves", lambda curves, *a, **k: drawn.append(curves))
    monkeypatch.setattr(report_cells, "plot_accuracy_grid", lambda *a: drawn.append(a[2]) or a[3])
    golden_report = (DATA / "report.md").read_text(encoding="utf-8")
    tables = [JSONUnread(**{f.name: getattr(tt, f.name) for f in fields(tt)}) for tt in collect(suite, cells)]
    assert [tt.task for tt in tables] == ["perplexity", "passkey", "needle", "ruler", "longppl"]
    for tt in tables:
        rows = [r for by_length in tt.results.values() for r in by_length.values()]
        assert rows and all(type(r) is tt.kind.result for r in rows), tt.task  # the class the row declares
        section = "\n".join(tt.kind.render(tt, labels, entries))
        assert section.startswith("## ") and "\n".join(render_values(tt.kind, tt, labels, entries))
        tt.kind.plot(tmp_path, tt, labels, context={})
        if tt.task == "ruler":  # not in the golden report: the battery of none at 1,024 (scores 0)
            assert "| none      | 0.00    |" in section and "- none fwe: 0.00" in section
        else:
            assert section in golden_report, tt.task  # the same lines main's report has for the same cells
    assert drawn[0]["none"] == {64: pytest.approx(36122.45), 200: pytest.approx(37303.87)} and len(drawn) == 7


def test_a_table_refuses_a_result_that_is_not_the_rows_type(golden):
    """A raw dict where the row's typed result belongs is refused naming the cell, before any section reads it."""
    suite, cells = golden
    raw = [
        replace(c, result=c.result_json) if (c.task, c.label, c.length) == ("passkey", "yarn", 300) else c
        for c in cells
    ]
    with pytest.raises(
        TypeError, match=r"passkey cell of 'yarn' at 300: the result is a dict, not the task's RetrievalCell"
    ):
        collect(suite, raw)  # the retrieval statistics are the first to read the results
    perplexity = next(tt for tt in collect(suite, cells) if tt.task == "perplexity")
    perplexity.cells["none"][64] = replace(perplexity.cells["none"][64], result=perplexity.table["none"][64])
    entries = {m.label: m for m in suite.methods}
    with pytest.raises(TypeError, match=r"perplexity cell of 'none' at 64: the result is a dict, not the task's Perp"):
        perplexity.kind.render(perplexity, list(entries), entries)
