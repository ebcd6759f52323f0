"""The table of evaluation tasks (evals/tasks/task_table.py): a new task is one row, each task's result
reads back from its JSON, result files carry a schema version and a newer one is refused, and the
passkey's defaults moved (spread needles) without changing what shipped suites and old cells mean."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from ropescale.cli.main import build_parser, main
from ropescale.errors import RopescaleError
from ropescale.evals.report.cell_keys import measured
from ropescale.evals.suite.parse import SUITES_DIR, load_suite, suite_from_dict
from ropescale.evals.suite.runner import run_suite
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.task_base import Task, positive_int, setting
from tests.conftest import squeezed


# -- a new task is one row ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConstantSettings:
    value: float = setting(2.5, "the number every cell reports", type=float)
    repeats: int = setting(1, "how many times it is added up", check=positive_int, type=int)


@dataclass
class ConstantResult:
    value: float

    def to_json(self) -> dict:
        return {"value": self.value}

    @classmethod
    def from_json(cls, data: dict) -> ConstantResult:
        return cls(float(data["value"]))


class Constant(Task):
    """A toy task: reports ``value × repeats`` for every method and length (no model call)."""

    name = "constant"
    settings = ConstantSettings
    result = ConstantResult
    metric = "value"
    higher_is_better = False
    seeded = False
    help = "a constant, for the test of the task table"

    def run_cell(self, ctx, settings: ConstantSettings, length: int) -> ConstantResult:
        assert ctx.model is not None and ctx.tokenizer is not None  # the suite loaded and patched the model
        return ConstantResult(settings.value * settings.repeats)


@pytest.fixture
def constant():
    row = task_table.register(Constant())
    yield row
    task_table.unregister(row.name)


def test_a_new_task_is_one_row_suite_report_and_command(constant, model_dir, tmp_path, capsys):
    raw = {
        "name": "toy",
        "model": str(model_dir),
        "device": "cpu",
        "methods": [{"method": "none"}, {"method": "yarn", "factor": 2}],
        "constant": {"lengths": [32, 64], "repeats": 2},
    }
    summary = run_suite(suite_from_dict(raw), tmp_path / "out", progress=False)
    assert summary["schema"] == "ropescale.results/2"
    assert summary["tasks"]["constant"]["yarn"]["64"] == {"value": 5.0}
    assert (tmp_path / "out" / "cells" / "yarn__constant__64.json").is_file()
    report = squeezed((tmp_path / "out" / "report.md").read_text())
    assert "## constant" in report and "value (lower is better)" in report and "| yarn ×2 | 5.00 | 5.00 |" in report
    assert summary["cells_finished"] == summary["cells_total"] == 4
    # its settings are checked as a suite's keys...
    with pytest.raises(RopescaleError, match="constant.repeats must be a positive integer, got 0"):
        suite_from_dict({**raw, "constant": {"lengths": [32], "repeats": 0}})
    with pytest.raises(RopescaleError, match="unknown constant key 'repeat'; known: lengths, value, repeats"):
        suite_from_dict({**raw, "constant": {"lengths": [32], "repeat": 2}})
    # ...and are the flags of `ropescale eval constant`, which runs it through the same runner
    argv = ["eval", "constant", "--model", str(model_dir), "--lengths", "32", "--value", "1.5", "--device", "cpu"]
    assert main([*argv, "--output", str(tmp_path / "cli"), "--no-progress"]) == 0
    cell = json.loads((tmp_path / "cli" / "cells" / "none__constant__32.json").read_text())
    assert cell["result"] == {"value": 1.5} and cell["measured"]["protocol"] == {
        "task": "constant",
        "value": 1.5,
        "repeats": 1,
    }


def test_the_built_in_rows_and_their_commands():
    assert task_table.names()[:4] == ("perplexity", "passkey", "needle", "ruler")
    from ropescale.evals.tasks.task_perplexity import MODES
    from ropescale.scoring.perplexity import MODES as SCORING_MODES

    assert MODES == SCORING_MODES
    args = build_parser().parse_args(["eval", "needle", "--model", "m", "--lengths", "4k", "--task", "niah_multikey"])
    assert task_table.settings_from_args(task_table.get("needle"), args) == {
        "lengths": [4096],
        "task": "niah_multikey",
        "depths": [0.25, 0.5, 0.75],
        "trials": 3,
        "jitter": 0.125,
    }
    with pytest.raises(RopescaleError, match="unknown task 'bogus'; known: perplexity, passkey, needle, ruler"):
        task_table.get("bogus")


# -- typed results: each task's JSON round trip -----------------------------------------------------------
def test_perplexity_and_retrieval_results_round_trip():
    from ropescale.evals.tasks.task_perplexity import PerplexityCell
    from ropescale.evals.tasks.task_retrieval import RetrievalCell

    ppl = {"mode": "nonoverlap", "window": 64, "stride": 64, "bos_token_id": 1, "n_documents": 1, "tokens_scored": 128}
    ppl |= {"total_nll": 300.0, "ppl": 10.5, "mean_window_ppl": 10.4, "window_nll": [150.0, 150.0], "elapsed_s": 1.0}
    cell = PerplexityCell.from_json(ppl)
    assert (cell.ppl, cell.tokens_scored, cell.mode, cell.extra["total_nll"]) == (10.5, 128, "nonoverlap", 300.0)
    assert cell.to_json() == ppl and PerplexityCell.from_json(cell.to_json()) == cell

    grid = {"lengths": [64], "depths": [0.25, 0.75], "trials": 2, "seed": 0, "threshold": 0.8}
    grid |= {"accuracy": [[1.0, 0.5]], "length_accuracy": {"64": 0.75}, "length_trials": {"64": 4}}
    grid |= {"records": [{"length": 64, "depth": 0.25, "correct": True}], "passkey_context": 64}
    cell = RetrievalCell.from_json(grid)
    assert (cell.trials, cell.accuracy, cell.threshold, cell.extra["passkey_context"]) == (2, [[1.0, 0.5]], 0.8, 64)
    assert cell.to_json() == grid and RetrievalCell.from_json(cell.to_json()) == cell
    old = {k: v for k, v in grid.items() if k != "threshold"}  # a cell from before thresholds were recorded
    assert RetrievalCell.from_json(old).to_json() == old
    with pytest.raises(ValueError, match="a perplexity result needs 'ppl'"):
        PerplexityCell.from_json({"mode": "yarn"})


def test_ruler_battery_round_trips():
    from ropescale.evals.tasks.ruler.cell import RulerCell, RulerRecord
    from ropescale.evals.tasks.task_ruler import RulerBattery

    cell = RulerCell("vt", 1024, 2, 0, 30, "ruler_vt", "-", [RulerRecord(0, 900, ["a"], "a", 1.0)], 1.5)
    cell.records.append(RulerRecord(1, 910, ["b", "c"], "b", 0.5))
    battery = RulerBattery({"vt": cell})
    data = json.loads(json.dumps(battery.to_json()))
    assert data["score"] == 0.75 and data["tasks"]["vt"]["score"] == 0.75
    back = RulerBattery.from_json(data)
    assert back.cells["vt"].records == cell.records and back.to_json() == battery.to_json()


def test_a_ruler_block_is_a_suite_task(model_dir):
    raw = {"name": "r", "model": str(model_dir), "methods": ["none"], "ruler": {"lengths": ["1k"], "tasks": ["vt"]}}
    suite = suite_from_dict(raw)
    assert suite.tasks() == ["ruler"] and suite.block("ruler")["lengths"] == [1024]
    settings = suite.settings("ruler")
    assert (settings.tasks, settings.samples, settings.seed, settings.haystack) == (("vt",), 30, None, "austen:Emma")
    with pytest.raises(RopescaleError, match=r"ruler.tasks: .*niah_single_2\[austen\]"):
        suite_from_dict({**raw, "ruler": {"lengths": [1024], "tasks": ["niah_single_2"]}})
    with pytest.raises(RopescaleError, match="ruler.samples must be a positive integer, got 0"):
        suite_from_dict({**raw, "ruler": {"lengths": [1024], "samples": 0}})


# -- one versioned schema ------------------------------------------------------------------------------------
@pytest.mark.parametrize("schema", ["ropescale.results/9", "someone.else/1", 2])
def test_a_newer_or_unknown_schema_is_refused_in_one_line(tmp_path, capsys, schema):
    from ropescale.evals.advice.evidence import load_measured, read_results

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"schema": schema, "suite": "s", "model": "m", "tasks": {}}))
    with pytest.raises(RopescaleError) as info:
        read_results(results)
    line = str(info.value)
    assert f"results file '{results}' has schema {schema!r}; this ropescale reads ropescale.results/1 to /2" in line
    assert "\n" not in line
    measured_file = tmp_path / "m.json"
    measured_file.write_text(json.dumps({"schema": schema, "model": "m", "rows": []}))
    with pytest.raises(RopescaleError, match=f"measurements '{measured_file}' has schema"):
        load_measured(measured_file)
    capsys.readouterr()
    assert main(["recommend", "--model", "smollm2-135m", "--target-length", "8192", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ropescale: error: results file") and repr(schema) in err[0]


def test_version_1_and_2_files_load(tmp_path):
    from ropescale.evals.advice.evidence import read_results, shipped_evidence

    assert shipped_evidence()  # the shipped evidence names no schema: version 1
    row = {"none": {"64": {"ppl": 10.0}}}
    for stamp in ({}, {"schema": "ropescale.results/1"}, {"schema": "ropescale.results/2"}):
        path = tmp_path / f"{len(stamp)}{stamp.get('schema', '')[-1:]}.json"
        path.write_text(json.dumps({**stamp, "suite": "s", "model": "m", "tasks": {"perplexity": row}}))
        assert read_results(path).rows[0].ppl == {64: 10.0}


# -- defaults in one place -----------------------------------------------------------------------------------
def test_new_passkey_measurements_spread_needles_and_old_cells_keep_their_key():
    identity = {"model": {"name": "m", "fingerprint": "x"}, "data": {"name": None}}
    base = {"name": "s", "model": "m", "methods": [{"method": "none"}]}
    new = suite_from_dict({**base, "passkey": {"lengths": [64]}})
    settings = new.settings("passkey")
    assert (settings.depths, settings.trials, settings.jitter) == ((0.0, 0.25, 0.5, 0.75, 1.0), 5, 0.125)
    key = measured(new, identity, "passkey")["protocol"]
    assert key == {"task": "passkey", "depths": [0.0, 0.25, 0.5, 0.75, 1.0], "trials": 5, "jitter": 0.125, "seed": 0}
    # a cell measured before the defaults moved (depth 0.5, one trial, fixed) recorded none of them
    old_cell = {"model": identity["model"], "data": None, "protocol": {"task": "passkey", "seed": 0}}
    explicit = suite_from_dict({**base, "passkey": {"lengths": [64], "depths": [0.5], "trials": 1, "jitter": 0}})
    ours = measured(explicit, identity, "passkey")
    assert "jitter" not in ours["protocol"]  # as cells of the fixed placement always were keyed
    assert task_table.same_measured(old_cell, ours, "passkey")
    assert not task_table.same_measured(old_cell, measured(new, identity, "passkey"), "passkey")
    args = build_parser().parse_args(["eval", "passkey", "--model", "m", "--lengths", "64"])
    assert task_table.settings_from_args(task_table.get("passkey"), args)["jitter"] == 0.125


def test_new_needle_measurements_spread_needles_and_old_cells_keep_their_key():
    identity = {"model": {"name": "m", "fingerprint": "x"}, "data": {"name": None}}
    base = {"name": "s", "model": "m", "methods": [{"method": "none"}]}
    new = suite_from_dict({**base, "needle": {"lengths": [64]}})
    assert new.settings("needle").jitter == 0.125  # passkey's default and meaning
    key = measured(new, identity, "needle")["protocol"]
    assert key == {"task": "needle", "depths": [0.25, 0.5, 0.75], "trials": 3, "jitter": 0.125, "seed": 0}
    # a needle cell measured before needles were spread recorded no jitter: jitter 0 keys it as it was
    old_cell = {"model": identity["model"], "data": None, "protocol": {"task": "needle", "trials": 2, "seed": 0}}
    fixed = suite_from_dict({**base, "needle": {"lengths": [64], "depths": [0.5], "trials": 2, "jitter": 0}})
    assert measured(fixed, identity, "needle")["protocol"] == {
        "task": "needle",
        "depths": [0.5],
        "trials": 2,
        "seed": 0,
    }
    assert task_table.same_measured(old_cell, measured(fixed, identity, "needle"), "needle")
    spread = suite_from_dict({**base, "needle": {"lengths": [64], "depths": [0.5], "trials": 2}})
    assert not task_table.same_measured(old_cell, measured(spread, identity, "needle"), "needle")
    with pytest.raises(RopescaleError, match=r"needle.jitter must be a number in \[0, 0.5\]"):
        suite_from_dict({**base, "needle": {"lengths": [64], "jitter": 0.7}})


def test_shipped_suites_keep_the_placement_they_were_measured_with():
    for path in sorted(SUITES_DIR.glob("*.yaml")):
        suite = load_suite(path)
        if suite.passkey is not None:
            expected = 0.125 if "jitter" in path.stem else 0
            assert suite.passkey["jitter"] == expected == suite.settings("passkey").jitter, path.name


# -- each row is declared Task[Settings, Result] (issue 53 point 3) -----------------------------------------
def _declared(cls: type) -> tuple | None:
    """The ``(S, R)`` a row's class declares, through a generic base of its own (``Passkey``:
    ``Retrieval[PasskeySettings]``, ``Retrieval``: ``Task[S, RetrievalCell]``); None when undeclared."""
    import typing

    for base in getattr(cls, "__orig_bases__", ()):
        origin = typing.get_origin(base)
        if origin is Task:
            return typing.get_args(base)
        if isinstance(origin, type) and issubclass(origin, Task):
            inner = _declared(origin)
            if inner is not None:
                given = dict(zip(origin.__parameters__, typing.get_args(base)))
                return tuple(given.get(a, a) for a in inner)
    return None


def test_every_row_is_declared_with_its_settings_and_result_types():
    """A type checker reads a row's settings and result from ``Task[S, R]``, the runner from the class
    attributes: the two say the same for every built-in row, and the table is typed by ``Task``."""
    for name, row in task_table.TABLE.items():
        assert _declared(type(row)) == (row.settings, row.result), name
    assert typing_args(task_table.TABLE) == (str, task_table.AnyTask)


def typing_args(table: dict) -> tuple:
    import typing

    hints = typing.get_type_hints(task_table)
    return typing.get_args(hints["TABLE"]) if "TABLE" in hints else ()
