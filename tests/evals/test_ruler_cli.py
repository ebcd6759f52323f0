"""``ropescale eval ruler`` end to end on a tiny random model (2 samples at 1k tokens), and the
retention / effective-length measures its report uses."""

from __future__ import annotations

import json

import pytest

from ropescale.cli.eval_ruler import parse_lengths
from ropescale.cli.main import main
from ropescale.evals.tasks.ruler.measures import (
    base_score,
    effective_length_absolute,
    effective_length_relative,
    retention,
    worst_retention,
)
from tests.conftest import squeezed
from tests.evals.ruler_fixtures import ruler_tokenizer, save_ruler_model


@pytest.fixture(scope="module")
def ruler_model_dir(tmp_path_factory):
    return save_ruler_model(tmp_path_factory.mktemp("ruler-model"), ruler_tokenizer())


def _run(model_dir, out, *extra):
    argv = ["eval", "ruler", "--model", model_dir, "--tasks", "niah_single_1,fwe", "--lengths", "1k"]
    return main([*argv, "--samples", "2", "--device", "cpu", "--output", str(out), "--no-progress", *extra])


def test_eval_ruler_end_to_end(ruler_model_dir, tmp_path, capsys):
    out = tmp_path / "ruler"
    assert _run(ruler_model_dir, out, "--method", "none") == 0
    cells = sorted((out / "cells").glob("*.json"))
    assert [c.name for c in cells] == ["none__ruler__1024.json"]  # a suite's cell: every task at the length
    record = json.loads(cells[0].read_text())
    cell = record["result"]["tasks"]["niah_single_1"]
    assert (cell["task"], cell["length"], cell["samples"], cell["seed"]) == ("niah_single_1", 1024, 2, 0)
    assert len(cell["records"]) == 2 and cell["max_new_tokens"] == 128 and cell["metric"] == "string_match_all"
    assert all(r["prompt_tokens"] <= 1024 for r in cell["records"]) and record["method_name"] == "none"
    assert record["scaling"]["method"] == "default" and record["scaling"]["params"] == {"factor": 1.0}
    assert not list(out.glob("cells/*.partial.jsonl"))  # journals go once the cell is written

    mtimes = {c: c.stat().st_mtime_ns for c in cells}
    assert _run(ruler_model_dir, out, "--method", "none") == 0  # a re-run skips finished cells
    assert {c: c.stat().st_mtime_ns for c in cells} == mtimes

    assert _run(ruler_model_dir, out, "--method", "yarn", "--factor", "2") == 0
    yarn = json.loads((out / "cells" / "yarn-x2__ruler__1024.json").read_text())
    assert yarn["scaling"]["method"] == "yarn" and yarn["scaling"]["params"]["factor"] == 2.0  # what the model ran
    results = json.loads((out / "results.json").read_text())
    assert results["has_unscaled"] and results["original_context"] == 1024
    assert "retention" in results["measures"]["yarn-x2"]["fwe"]
    report = squeezed((out / "report.md").read_text())
    assert "| yarn-x2 | niah_single_1 |" in report and "worst retention" in report
    assert "report:" in capsys.readouterr().out
    from ropescale.evals.advice.battery_evidence import read_folder

    folder = read_folder(out, ruler_model_dir)  # recommend and the frontier read the suite's cells as RULER's
    assert folder is not None and not folder.skipped and folder.summary["has_unscaled"]
    assert {label: (r.kind, r.method, r.factor) for label, r in folder.rows.items()} == {
        "none": ("unscaled", None, None),
        "yarn-x2": ("method", "yarn", 2.0),
    }


def test_cells_of_the_earlier_layout_are_read_as_done_or_refused_naming_one(
    ruler_model_dir, tmp_path, capsys, monkeypatch
):
    """A folder ``eval ruler`` wrote before it ran through the suite runner (one ``ropescale.ruler.cell/1``
    file per task): its finished cells are read as done and reported as before, never run again beside
    them; a run that asks a task they lack at their length is refused naming one of them (issue 53)."""
    from dataclasses import replace

    import ropescale.models.loading as loading
    from ropescale._io import atomic_write_json
    from ropescale.evals.report.cell_record import SuiteCell
    from ropescale.evals.report.ruler_folder import task_records

    out = tmp_path / "ruler"
    assert _run(ruler_model_dir, out, "--method", "none") == 0
    report = (out / "report.md").read_text()
    cell = out / "cells" / "none__ruler__1024.json"
    for record in task_records(SuiteCell.read(cell)):  # the same cells, as eval ruler wrote them before
        earlier = replace(record, lm_eval_version="0.4.9", original_context=1024).to_json()
        atomic_write_json(out / "cells" / f"none__{record.task}__1024.json", earlier)
    cell.unlink()
    capsys.readouterr()
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    assert _run(ruler_model_dir, out, "--method", "none") == 0
    assert not cell.exists() and (out / "report.md").read_text() == report  # read as done, reported as before
    assert "| none | fwe |" in squeezed(capsys.readouterr().out)
    assert _run(ruler_model_dir, out, "--method", "none", "--tasks", "fwe,niah_multikey_2") == 2
    err = capsys.readouterr().err
    assert f"results folder '{out}' holds none__fwe__1024.json, a RULER cell of the layout before" in err
    assert "without a finished niah_multikey_2 at 1024 beside it: ask --tasks fwe to read it as done" in err
    assert not cell.exists()


def test_a_suite_runs_rulers_battery_through_the_task_table(ruler_model_dir, tmp_path):
    """``ruler:`` in a suite: one cell per method and length holding every task, resumable, reported."""
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import run_suite
    from ropescale.evals.tasks.task_ruler import RulerBattery

    raw = {
        "name": "battery",
        "model": ruler_model_dir,
        "device": "cpu",
        "methods": [{"method": "none"}],
        "ruler": {"lengths": ["1k"], "tasks": ["niah_single_1", "fwe"], "samples": 1},
    }
    out = tmp_path / "suite"
    summary = run_suite(suite_from_dict(raw), out, progress=False)
    cell = out / "cells" / "none__ruler__1024.json"
    record = json.loads(cell.read_text())
    battery = RulerBattery.from_json(record["result"])
    assert sorted(battery.cells) == ["fwe", "niah_single_1"] and battery.cells["fwe"].samples == 1
    assert record["measured"]["protocol"] == {
        "task": "ruler",
        "tasks": ["niah_single_1", "fwe"],
        "samples": 1,
        "seed": 0,
    }
    assert not list(out.glob("cells/*.partial.jsonl"))  # each task's journal goes once the cell is written
    assert summary["tasks"]["ruler"]["none"]["1024"]["score"] == battery.score
    assert "## RULER" in (out / "report.md").read_text()
    mtime = cell.stat().st_mtime_ns
    run_suite(suite_from_dict(raw), out, progress=False)  # finished: not run again
    assert cell.stat().st_mtime_ns == mtime


def test_too_short_length_is_refused_before_weights_load(ruler_model_dir, tmp_path, capsys, monkeypatch):
    import ropescale.models.loading as loading

    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    argv = ["eval", "ruler", "--model", ruler_model_dir, "--method", "none", "--tasks", "cwe", "--lengths", "1k"]
    assert main([*argv, "--device", "cpu", "--output", str(tmp_path / "out")]) == 2
    assert "cwe at 1024 tokens: its smallest prompt takes about" in capsys.readouterr().err
    assert not (tmp_path / "out" / "cells").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "yarn"], "--method yarn needs --factor"),
        (["--method", "none", "--tasks", "niah_single_2"], "downloads; run 'niah_single_2[austen]'"),
        (["--method", "none", "--lengths", "4q"], "positive token counts such as 4096 or 4k"),
    ],
)
def test_eval_ruler_refusals(argv, message, capsys, tmp_path):
    full = ["eval", "ruler", "--model", "nowhere", "--lengths", "1k", "--output", str(tmp_path), *argv]
    assert main(full) == 2
    assert message in capsys.readouterr().err


def test_parse_lengths():
    assert parse_lengths("4k, 16k,32768") == [4096, 16384, 32768]
    for bad in ("0", "4k,4096", "", "k"):
        with pytest.raises(ValueError):
            parse_lengths(bad)


def test_retention():
    kept = retention({1024: 50.0, 2048: 45.0, 8192: 10.0}, {1024: 50.0, 2048: 50.0, 8192: 40.0}, 2048)
    assert kept == {1024: 100.0, 2048: 90.0} and worst_retention(kept) == 90.0  # lengths > L left out
    assert retention({1024: 12.0}, {1024: 10.0}, 2048, higher_is_better=False) == {1024: pytest.approx(100 / 1.2)}
    assert retention({1024: 5.0}, {1024: 0.0}, 2048) == {1024: None} and worst_retention({1024: None}) is None


def test_effective_length_absolute():
    assert effective_length_absolute({4096: 90.0, 8192: 80.0, 16384: 86.0}) == 16384  # shorter need not pass
    assert effective_length_absolute({4096: 85.5}) is None and effective_length_absolute({4096: 85.6}) == 4096


def test_effective_length_relative():
    own = {1024: 60.0, 2048: 40.0, 8192: 44.0, 16384: 43.0}
    assert base_score(own, 2048) == 50.0
    assert effective_length_relative(own, 2048) == (16384, "")  # 43 ≥ 0.85 × 50 = 42.5
    scaled = {2048: 45.0, 8192: 44.0, 16384: 30.0}
    assert effective_length_relative(scaled, 2048, base=own) == (8192, "")  # base: the unscaled model's 50
    length, why = effective_length_relative({2048: 20.0, 8192: 19.0}, 2048, floor=30.0)
    assert length is None and "beyond the model" in why
    assert effective_length_relative({8192: 50.0}, 2048)[1].startswith("no score at a length")
    assert effective_length_relative({2048: 50.0, 8192: 10.0}, 2048, floor=None) == (2048, "")


def test_a_base_exactly_at_the_floor_is_counted():
    """The mean of 25/30, 1/30 and 1/30 is 30 %, computed 29.999999999999996: the task is at the floor
    (the goal counts a base >= 0.3), not beyond the model; a score of exactly 85 % of it passes."""
    base = {1024: 100 * 25 / 30, 2048: 100 * 1 / 30, 4096: 100 * 1 / 30}
    assert base_score(base, 4096) < 30.0  # the rounding this guards against
    length, why = effective_length_relative({**base, 16384: 25.5}, 4096, floor=30.0)
    assert (length, why) == (16384, "")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_multikey_3"])
def test_a_needle_length_below_the_smallest_prompt_is_refused_before_weights(
    task, ruler_model_dir, tmp_path, capsys, monkeypatch
):
    """Before: lm-eval's "Raise `max_seq_lengths` for this task", exit 1, after the weights had loaded
    (the [austen] tasks, which need the installed corpus, are checked in test_ruler_tasks)."""
    import ropescale.models.loading as loading

    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    out = tmp_path / "out"
    argv = ["eval", "ruler", "--model", ruler_model_dir, "--method", "none", "--tasks", task, "--lengths", "200"]
    capsys.readouterr()
    assert main([*argv, "--samples", "1", "--output", str(out), "--no-progress"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ropescale: error:")]
    assert len(err) == 1 and err[0].startswith(f"ropescale: error: RULER task {task} at 200 tokens: its smallest"), err
    assert "max_seq_lengths" not in err[0] and not (out / "cells").exists()


def test_ruler_composes_on_a_shipped_scaling_only_when_asked_and_keeps_the_cells_apart(
    ruler_model_dir, tmp_path, capsys
):
    """Issue 51 point 5's needle cells: on a checkpoint that ships a scaling, ``--param compose=true`` runs the
    method on top of it, and its cell is its own; without it the method replaces the shipped one, as before.
    Before, ``compose`` was refused as "a field of the scaling" and the run forced a replace, and the two
    would have shared one label."""
    shipped = str(tmp_path / "shipped")  # a YaRN x2 switch saved without training, as Qwen ships it
    assert main(["patch", "--model", ruler_model_dir, "--method", "yarn", "--factor", "2", "--output", shipped]) == 0
    out = tmp_path / "ruler"
    argv = ["eval", "ruler", "--model", shipped, "--tasks", "fwe", "--lengths", "2k", "--samples", "1"]
    argv += ["--device", "cpu", "--output", str(out), "--no-progress", "--method", "yarn", "--factor", "2"]
    assert main(argv) == 0 and main([*argv, "--param", "compose=true"]) == 0
    capsys.readouterr()
    records = {p.name: json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))}
    assert len(records) == 2, sorted(records)
    replaced = records["yarn-x2__ruler__2048.json"]
    (composed,) = (r for name, r in records.items() if name != "yarn-x2__ruler__2048.json")
    assert composed["params"] == {"compose": True}
    assert replaced["params"] == {}
    assert replaced["scaling"] != composed["scaling"]  # what the model ran, read back from it
    assert main([*argv, "--param", "compose=true"]) == 0  # done: the composed cell is found again, not rerun
    assert len(list((out / "cells").glob("*.json"))) == 2


def test_the_report_of_a_scaled_checkpoint_measures_against_the_model_as_shipped(ruler_model_dir, tmp_path, capsys):
    """Issue 51 point 1: "native" in every retention figure is the model as shipped, up to the context it
    serves. On a checkpoint saved with a YaRN x2 (1,024 → 2,048), RULER's base is its own cells (no
    ``--method``) and L its shipped 2,048; before, L was the trained 1,024 and the as-shipped row no base, so
    no retention was reported at all. ``--shipped-context`` moves L; a plain checkpoint keeps the unscaled base."""
    shipped = str(tmp_path / "shipped")
    assert main(["patch", "--model", ruler_model_dir, "--method", "yarn", "--factor", "2", "--output", shipped]) == 0
    out = tmp_path / "ruler"
    argv = ["eval", "ruler", "--model", shipped, "--tasks", "fwe", "--lengths", "1k,2k", "--samples", "1"]
    argv += ["--device", "cpu", "--output", str(out), "--no-progress"]
    assert main(argv) == 0 and main([*argv, "--method", "yarn", "--factor", "2", "--param", "compose=true"]) == 0
    capsys.readouterr()
    results = json.loads((out / "results.json").read_text())
    assert results["original_context"] == 2048 and results["as_shipped"] == "ropescale provenance", results
    assert sorted(results["measures"]) == ["as-saved", "yarn-x2-da236bdb"], sorted(results["measures"])
    composed = results["measures"]["yarn-x2-da236bdb"]["fwe"]
    assert composed["base"] == "as shipped" and set(composed["retention"]) == {"1024", "2048"}, composed
    report = (out / "report.md").read_text()
    assert "## Effective length and short-context retention (shipped context L = 2048)" in report
    from importlib.metadata import version  # each cell names the lm-eval whose generators wrote its prompts

    cell = json.loads((out / "cells" / "as-saved__ruler__1024.json").read_text())
    assert cell["result"]["lm_eval_version"] == version("lm_eval")
    assert main([*argv, "--shipped-context", "4k"]) == 0  # the user's word on what it serves
    capsys.readouterr()
    told = json.loads((out / "results.json").read_text())
    assert (told["original_context"], told["as_shipped"]) == (4096, "--shipped-context")
    plain = tmp_path / "plain"
    assert _run(ruler_model_dir, plain, "--method", "none") == 0 and _run(ruler_model_dir, plain) == 0
    capsys.readouterr()
    assert "as_shipped" not in json.loads((plain / "results.json").read_text())
