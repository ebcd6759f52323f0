"""``ropescale recommend`` reads the RULER battery (issue 40, point 6): a ``battery:`` line for the recommended
method and its alternative past L, the method that holds across tasks, the tasks beyond the model, a missing
cell said, a fine-tune's cells labelled by its checkpoint and only under ``--budget fine-tune``, a cell file of
another schema skipped with its reason. Cells are written here in the format ``ropescale eval ruler`` writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli.test_patch_cli import assert_one_line_error, run

MODEL = "smollm2-135m"


def write_cell(folder: Path, task: str, length: int, hits: int, method: str | None = "none", factor=None,
               params=None, model: str = MODEL, samples: int = 30, schema: str | None = None,
               prompt: str = "plain") -> Path:  # fmt: skip
    """One cell file as the earlier layout's runner (benchmarks/ruler_run.py) writes it, from a RulerCell whose first
    ``hits`` of ``samples`` prompts found their needle (``prompt``: its prompt format, as ``--prompt``)."""
    from ropescale.evals.tasks.ruler.cell import RulerCell, RulerRecord
    from ropescale.evals.tasks.ruler.earlier import cell_name, row_label
    from ropescale.evals.tasks.ruler.record import SCHEMA
    from ropescale.scaling import Scaling

    cell = RulerCell(task, length, samples, 0, 128, task, "repeat", prompt=prompt)
    cell.records = [
        RulerRecord(i, length - 200, ["1234567"], " 1234567." if i < hits else " 7.", float(i < hits))
        for i in range(samples)
    ]
    scaling = Scaling(method, factor, dict(params or {}))
    fingerprint = {"model": model, "scaling_requested": scaling.request(), "task": task, "length": length,
                   "samples": samples, "seed": 0, "runtime": {"device": "cpu", "dtype": "bfloat16"}}  # fmt: skip
    if prompt != "plain":
        fingerprint["prompt"] = prompt
    record = {
        "schema": schema or SCHEMA,
        "fingerprint": fingerprint,
        "label": row_label(scaling, prompt),
        "unscaled": scaling.unscaled,
        "scaling": {"method": method},
        "rope_parameters": None,
        "lm_eval_version": "0.4.13",
        "runtime": {"device": "cpu", "dtype": "bfloat16", "attention": "sdpa"},
        "original_context": 8192,
        "cell": cell.to_dict(),
    }
    path = folder / "cells" / f"{cell_name(scaling, task, length, prompt)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def _recommend(folder: Path, target: int = 32768, budget: str = "training-free"):
    """The rule's recommendation (no perplexity/passkey evidence: yarn ×target/L) with ``folder`` as its battery."""
    from ropescale.evals.advice.battery_evidence import read_folder
    from ropescale.evals.advice.recommend import recommend

    return recommend(MODEL, 8192, target, budget, evidence=[], battery=[read_folder(folder, MODEL)])


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_task_beyond_the_model_is_listed_as_such_not_counted(tmp_path):
    write_cell(tmp_path, "niah_single_1", 4096, 30)
    write_cell(tmp_path, "vt", 4096, 2)  # base 6.7 %: the model cannot do it at any length
    write_cell(tmp_path, "niah_single_1", 16384, 27, "yarn", 4)
    write_cell(tmp_path, "vt", 16384, 1, "yarn", 4)
    rec = _recommend(tmp_path)
    assert (rec.method, rec.factor) == ("yarn", 4)
    assert rec.battery.startswith("yarn ×4 niah_single_1 16k 27/30 (90 % of base), nothing at 32k")
    assert "beyond the model (< 30 % at 4k): vt" in rec.battery
    assert "vt 16k" not in rec.battery  # reported as beyond, not quoted as the method's loss
    assert rec.battery_record["folders"][0]["beyond_the_model"] == ["vt"]


def test_no_method_holds_when_each_loses_a_task(tmp_path):
    """The highest worst task is no method that holds when it is below 85 % of the base: two methods that
    both lose a task (self_extend 15 % on one, yarn 28 % on another) are said to hold neither, in the short
    answer and in --verbose (the shipped ×4 cells at 16k are such a case)."""
    for task in ("niah_single_1", "cwe"):
        write_cell(tmp_path, task, 4096, 20)
    se = {"group_size": 8, "window": 1024}
    write_cell(tmp_path, "niah_single_1", 16384, 20, "self_extend", 4, se)
    write_cell(tmp_path, "cwe", 16384, 3, "self_extend", 4, se)  # 15 % of base
    write_cell(tmp_path, "niah_single_1", 16384, 6, "yarn", 4)  # 30 % of base: the higher worst
    write_cell(tmp_path, "cwe", 16384, 20, "yarn", 4)
    rec = _recommend(tmp_path)
    assert rec.battery_record["holds"][0]["holds"] == []
    assert rec.battery_record["holds"][0]["worst"] == pytest.approx({"self_extend ×4": 15.0, "yarn ×4": 30.0})
    from ropescale.evals.advice.recommend_text import format_recommendation

    assert "holds across tasks at 16k (cwe, niah_single_1): none (85 % of base on each task)" in (
        format_recommendation(rec)
    )
    assert "holds across tasks at 16k: yarn" not in rec.battery


def test_the_short_answer_says_none_holds_when_a_third_method_fails_too(tmp_path):
    """With a method the line does not show (ntk beside yarn and its alternative), the short answer's battery
    line carries the comparison itself: none holds, each method's worst, the tasks compared."""
    for task in ("niah_single_1", "cwe"):
        write_cell(tmp_path, task, 4096, 20)
    se = {"group_size": 8, "window": 1024}
    write_cell(tmp_path, "niah_single_1", 16384, 20, "self_extend", 4, se)
    write_cell(tmp_path, "cwe", 16384, 3, "self_extend", 4, se)  # 15 % of base
    write_cell(tmp_path, "niah_single_1", 16384, 6, "yarn", 4)  # 30 %
    write_cell(tmp_path, "cwe", 16384, 20, "yarn", 4)
    write_cell(tmp_path, "niah_single_1", 16384, 10, "ntk", 4)  # 50 %: the highest worst, still a loss
    write_cell(tmp_path, "cwe", 16384, 20, "ntk", 4)
    rec = _recommend(tmp_path)
    assert (
        "none holds across tasks at 16k (85 % of base on each; worst ntk ×4 50 %, self_extend ×4 15 %, yarn ×4 30 %;"
        " over cwe, niah_single_1)" in _flat(rec.battery)
    )
    assert "holds across tasks at 16k: ntk" not in rec.battery


def test_a_variant_measured_on_one_task_does_not_shrink_the_comparison(tmp_path):
    """A Self-Extend variant tried on one task beside two methods measured on three: the comparison stays over
    the three tasks, the variant is compared on its one ('1 of 3 tasks') and cannot hold, and the method that
    keeps 85 % of base on all three still holds (before, every method was compared on the variant's one task)."""
    for task in ("niah_single_1", "niah_single_2", "cwe"):
        write_cell(tmp_path, task, 4096, 20)
    se = {"group_size": 8, "window": 1024}
    for task, se_hits, yarn_hits in (("niah_single_1", 20, 20), ("niah_single_2", 19, 8), ("cwe", 18, 20)):
        write_cell(tmp_path, task, 16384, se_hits, "self_extend", 4, se)
        write_cell(tmp_path, task, 16384, yarn_hits, "yarn", 4)
    write_cell(tmp_path, "cwe", 16384, 20, "self_extend", 4, {"group_size": 8, "window": 4096})  # 100 % on its one
    rec = _recommend(tmp_path)
    (c,) = rec.battery_record["holds"]
    assert c["tasks"] == ["cwe", "niah_single_1", "niah_single_2"]
    assert c["holds"] == ["self_extend ×4 (group_size=8, window=1024)"]
    assert c["incomplete"] == {"self_extend ×4 (group_size=8, window=4096)": 1}
    from ropescale.evals.advice.recommend_text import format_recommendation, format_short

    assert "self_extend ×4 (group_size=8, window=4096) 100 % (1 of 3 tasks)" in _flat(format_recommendation(rec))
    assert "window=4096" not in format_short(rec)  # the short answer compares whole rows; --verbose has the variant


@pytest.mark.parametrize("pad", range(12))
def test_the_short_answer_never_cuts_a_number_from_its_unit(pad):
    """Wherever the width falls, "(< 30 % at 4k)" and "22 % of base" stay whole on a line (the shipped short
    answer printed "(< 30" and "% at 4k)" on two lines), and the text is otherwise unchanged."""
    from ropescale.evals.advice.recommend_text import wrap_field

    text = "x" * pad + " worst 2/30 (22 % of base); beyond the model (< 30 % at 4k): cwe, fwe, vt"
    for width in range(40, 60):
        lines = wrap_field("battery:", text, width)
        assert " ".join(line[11:] for line in lines) == text
        assert not any(line.rstrip().endswith(("<", "(<", "22", "30")) for line in lines)
        assert not any(line[11:].startswith("%") for line in lines)


def test_a_task_whose_base_is_exactly_the_floor_is_counted(tmp_path):
    """A base of exactly 30 % (the mean of 20/30, 1/30 and 6/30 at 2k, 4k and 8k, which floating point sums to
    29.999999999999996) is countable: recommend quotes the method's loss on it instead of calling the task
    beyond the model (the shipped UUID task's base, 13/30 at 4k and 5/30 at 8k, is 30 % too)."""
    for length, hits in ((2048, 20), (4096, 1), (8192, 6)):
        write_cell(tmp_path, "niah_single_3", length, hits)
    write_cell(tmp_path, "niah_single_3", 16384, 2, "yarn", 4)
    rec = _recommend(tmp_path)
    assert rec.battery_record["folders"][0]["beyond_the_model"] == []
    assert "niah_single_3 16k 2/30 (22 % of base)" in rec.battery


def test_the_method_that_holds_across_tasks_is_named_and_the_choice_stays(tmp_path):
    for task, hits in (("niah_single_1", 30), ("cwe", 20)):
        write_cell(tmp_path, task, 4096, hits)
    se = {"group_size": 8, "window": 1024}
    write_cell(tmp_path, "niah_single_1", 16384, 30, "self_extend", 4, se)
    write_cell(tmp_path, "cwe", 16384, 18, "self_extend", 4, se)  # 90 % of base: its worst
    write_cell(tmp_path, "niah_single_1", 16384, 24, "yarn", 4)  # 80 % of base: its worst
    write_cell(tmp_path, "cwe", 16384, 20, "yarn", 4)
    rec = _recommend(tmp_path)
    assert rec.method == "yarn"  # the battery informs, the rule still chooses
    assert "holds across tasks at 16k: self_extend ×4 (worst 90 % of base; yarn ×4 80 %; over cwe, niah_single_1)" in (
        rec.battery
    )
    assert rec.battery_record["holds"][0]["holds"] == ["self_extend ×4"]
    from ropescale.evals.advice.recommend_text import format_recommendation, format_short

    assert any(
        line.startswith("battery:   yarn ×4 cwe 16k 20/30 (100 % of base)") for line in format_short(rec).splitlines()
    )
    verbose = format_recommendation(rec)
    assert (
        "holds across tasks at 16k (cwe, niah_single_1): self_extend ×4 (worst: self_extend ×4 90 %, yarn ×4 80 %)"
        in (verbose)
    )


def test_a_missing_cell_is_said_not_hidden(tmp_path):
    write_cell(tmp_path, "niah_single_1", 4096, 30)
    write_cell(tmp_path, "cwe", 4096, 30)
    write_cell(tmp_path, "niah_single_1", 16384, 30, "self_extend", 4, {"group_size": 8})
    rec = _recommend(tmp_path)
    assert rec.battery.startswith(
        "not measured for yarn ×4 at 32k (cells: self_extend ×4 niah_single_1 16k 30/30 (100 % of base), "
        "cwe not at 16k, nothing at 32k)"
    )
    write_cell(tmp_path, "niah_single_1", 16384, 30, "yarn", 4)  # the method, one of the two tasks
    rec = _recommend(tmp_path)
    assert rec.battery.startswith("yarn ×4 niah_single_1 16k 30/30 (100 % of base), cwe not at 16k, nothing at 32k")


def test_more_than_two_tasks_at_a_length_give_their_number_and_the_worst(tmp_path):
    for task in ("niah_single_1", "niah_multikey_3", "cwe", "fwe"):
        write_cell(tmp_path, task, 8192, 30)
    for task, hits in (("niah_single_1", 30), ("niah_multikey_3", 21), ("cwe", 27)):
        write_cell(tmp_path, task, 16384, hits, "yarn", 4)
    rec = _recommend(tmp_path)
    assert rec.battery.startswith("yarn ×4 16k 3 tasks, worst niah_multikey_3 21/30 (70 % of base), fwe not at 16k")


def test_a_checkpoints_cells_are_labelled_and_quoted_only_for_a_fine_tune(tmp_path):
    write_cell(tmp_path, "niah_single_1", 4096, 30)
    write_cell(tmp_path, "niah_single_1", 8192, 0, model="runs/ext/control")  # the control: never the base
    write_cell(tmp_path, "niah_single_1", 16384, 30, "yarn", 4)
    write_cell(tmp_path, "niah_single_1", 16384, 29, None, model="runs/ext/finetuned")  # the export as saved
    free = _recommend(tmp_path).battery.removesuffix(f" ({tmp_path})")  # the folder's name is the test's
    assert "checkpoint" not in free and "finetuned" not in free
    assert "holds" not in free  # a checkpoint is no candidate: one method, nothing to compare
    tuned = _recommend(tmp_path, budget="fine-tune")
    assert tuned.battery.startswith("before the fine-tune (training-free): yarn ×4 niah_single_1 16k 30/30")
    assert "checkpoint finetuned niah_single_1 16k 29/30 (97 % of base)" in tuned.battery
    titles = {r["title"]: r["kind"] for r in tuned.battery_record["folders"][0]["rows"]}
    assert titles["checkpoint control unscaled"] == "checkpoint" and titles["unscaled"] == "unscaled"


def test_a_ruler_folder_in_results_is_read_and_a_newer_cell_skipped_with_its_reason(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "battery"
    write_cell(folder, "niah_single_1", 4096, 30)
    write_cell(folder, "niah_single_1", 16384, 25, "self_extend", 4, {"group_size": 8, "logn": True, "window": 1024})
    newer = write_cell(folder, "vt", 16384, 30, "yarn", 4, schema="ropescale.ruler.cell/2")
    code, out, err = run(capsys, "recommend", "--target-length", "32k", "--results", str(folder), "--verbose")
    assert code == 0, err
    text = _flat(out)
    assert (
        "battery: self_extend ×4 niah_single_1 16k 25/30 (83 % of base), nothing at 32k; alternative yarn ×4 " in text
    )
    # the alternative's cells are the shipped folder's, against its own base: named as such
    alternative = text[text.index("; alternative yarn ×4 ") :]
    assert "32k (evals/measured/ruler/smollm2-135m-x4-cpu) (" in alternative.split(";")[1]
    assert f"({folder}; 1 files skipped, --verbose)" in text
    assert f"skipped: {newer}: schema 'ropescale.ruler.cell/2', this ropescale reads ropescale.ruler.cell/1" in text
    assert "vt" not in text.split("skipped:")[0]
    other = tmp_path / "other"
    write_cell(other, "niah_single_1", 4096, 30, model="some/other-model")
    code, out, err = run(capsys, "recommend", "--target-length", "32k", "--results", str(other))
    assert_one_line_error(
        code, err, f"RULER folder '{other}' holds no cell of model 'smollm2-135m'", "some/other-model"
    )


def test_the_shipped_cells_give_the_battery_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ here: the shipped measurements only
    code, out, err = run(capsys, "recommend", "--model", MODEL, "--target-length", "16k")
    assert code == 0, err
    battery = _flat(out[out.index("\nbattery:") : out.index("\ncaveat:") if "\ncaveat:" in out else None])
    # the short answer counts the other scalings' cells (cut at its first entry, the list read as the only cell)
    assert re.match(
        r"battery: not measured for self_extend ×2 or dynamic_ntk ×2 at 16k \(cells of \d+ other scalings: "
        r"--verbose\) \(evals/measured/ruler/smollm2-135m-x4-cpu\)$",
        battery.strip(),
    ), battery
    code, out, err = run(capsys, "recommend", "--model", MODEL, "--target-length", "16k", "--json")
    line = json.loads(out)["battery"]["line"]
    # the whole list: the shipped self_extend ×4 cells past L, whichever task is the worst as cells are added
    assert re.search(r"\(cells: .*self_extend ×4 [^;]*16k [^;]*\d+/30 \(\d+ % of base\)", line), line
    code, out, err = run(capsys, "recommend", "--model", MODEL, "--target-length", "32k", "--json")
    record = json.loads(out)
    assert record["method"] == "self_extend" and record["battery"]["line"].startswith("self_extend ×4 ")
    assert re.match(r"self_extend ×4 [^;]*16k [^;]*\d+/30 \(\d+ % of base\)", record["battery"]["line"])
    sources = [f["source"] for f in record["battery"]["folders"]]
    assert "evals/measured/ruler/smollm2-135m-x4-cpu" in sources


def test_the_frontier_report_gains_the_battery(capsys, tmp_path):
    """``eval frontier --battery DIR``: per method at N / L, its worst RULER retention at ≤ L and its relative
    effective length over the tasks the model can do; a task beyond the model named, not counted."""
    from tests.conftest import squeezed

    run_dir, battery = tmp_path / "run", tmp_path / "battery"
    run_dir.mkdir()
    passkey = {"accuracy": [[1.0, 1.0]], "depths": [0.2, 0.8], "trials": 1}
    tasks = {
        "perplexity": {"none": {"2048": {"ppl": 28.0}, "8192": {"ppl": 30.0}}, "yarn": {"16384": {"ppl": 31.0}}},
        "passkey": {"none": {"8192": passkey}, "yarn": {"16384": passkey}},
    }
    (run_dir / "results.json").write_text(json.dumps({"model": MODEL, "tasks": tasks}))
    (run_dir / "suite.yaml").write_text("methods:\n- {method: none}\n- {method: yarn, factor: 4, label: yarn}\n")
    for task, hits in (("niah_single_1", 30), ("cwe", 20), ("vt", 3)):
        write_cell(battery, task, 4096, hits)
    write_cell(battery, "niah_single_1", 4096, 27, "yarn", 4)  # 90 % of the unscaled model's 30/30
    write_cell(battery, "cwe", 4096, 20, "yarn", 4)
    write_cell(battery, "niah_single_1", 16384, 24, "yarn", 4)  # 80 % of base: not ≥ 85 %
    write_cell(battery, "cwe", 16384, 20, "yarn", 4)
    write_cell(battery, "vt", 16384, 0, "yarn", 4)  # beyond the model: not counted
    argv = ["eval", "frontier", "--results", str(run_dir), "--target-length", "32768", "--battery", str(battery)]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    report = squeezed((run_dir / "frontier.md").read_text())
    assert "## RULER battery" in report
    assert "| yarn ×4 | 90.0 % | 4k (niah_single_1) | cwe, niah_single_1 |" in report
    assert "Beyond the model at any length (unscaled base < 30 %, not counted): vt." in report


def test_the_short_battery_line_counts_the_other_scalings_cells(tmp_path):
    """The short answer is built from the cells, not cut from the long line: where the recommended method
    has no cell, the other scalings' rows are counted (the first alone would read as the only cell there
    is, and a cut inside its list left a bracket open); where it has one, its row and the folder."""
    from ropescale.evals.advice.recommend_text import format_short

    write_cell(tmp_path, "niah_single_1", 4096, 30)
    write_cell(tmp_path, "niah_single_3", 4096, 20)
    write_cell(tmp_path, "niah_single_3", 16384, 1, "self_extend", 4, {"group_size": 8, "window": 4096})
    write_cell(tmp_path, "niah_single_1", 16384, 30, "yarn", 4)
    rec = _recommend(tmp_path, target=16384)
    names = f"{rec.method} ×2 or {rec.alternative[0]} ×2"  # the rule's choice at ×2 and its alternative
    assert rec.battery.startswith(f"not measured for {names} at 16k (cells: self_extend ×4 ")  # the whole list
    assert "(5 % of base), niah_single_1 not at 16k; yarn ×4 niah_single_1 16k 30/30" in rec.battery
    short = rec.battery_record["short"]
    assert short == f"not measured for {names} at 16k (cells of 2 other scalings: --verbose) ({tmp_path})"
    assert _flat(format_short(rec)).count("battery: " + _flat(short)) == 1
    write_cell(tmp_path, "niah_single_1", 16384, 24, rec.method, 2)
    rec = _recommend(tmp_path, target=16384)
    assert rec.battery_record["short"] == (
        f"{rec.method} ×2 niah_single_1 16k 24/30 (80 % of base), niah_single_3 not at 16k ({tmp_path})"
    )
