"""Passkey trials that share a position are not independent: the agreement statistics, the jittered
placement in a suite (its own cells, never mixed with fixed ones) and the script that sets the two
side by side, reading real suite cells."""

from __future__ import annotations

import json
import shutil

import pytest

from ropescale.evals.suite.parse import SuiteError, suite_from_dict
from ropescale.evals.suite.runner import SuiteRunner, run_suite
from ropescale.evals.tasks.proportions import group_agreement, paired_exact_p
from tests.conftest import load_script, squeezed


def test_paired_exact_p():
    assert paired_exact_p(0, 0) == 1.0 and paired_exact_p(5, 5) == 1.0
    assert paired_exact_p(8, 0) == paired_exact_p(0, 8) == pytest.approx(2 / 2**8)  # 8 discordant, all one way
    assert paired_exact_p(3, 1) == pytest.approx(2 * (1 + 4) / 16)


def test_groups_that_answer_alike_count_as_one_trial_each():
    alike = group_agreement([[1.0] * 6, [0.0] * 6, [0.0] * 6, [1.0] * 6, [1.0] * 6])
    assert alike["icc"] == pytest.approx(1.0) and alike["design_effect"] == pytest.approx(6.0)
    assert alike["effective_n"] == pytest.approx(5.0) and alike["unanimous"] == 5
    low, high = alike["effective_interval"]
    assert low < alike["interval"][0] and high > alike["interval"][1]  # wider: 5 measurements, not 30
    mixed = group_agreement([[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]] * 5)  # no group is more alike than the rest
    assert mixed["icc"] == 0.0 and mixed["effective_n"] == 30 and mixed["effective_interval"] == mixed["interval"]
    assert group_agreement([[1.0, 1.0], [1.0, 1.0]])["icc"] is None  # all right: nothing to say
    with pytest.raises(ValueError, match="two or more groups of one size"):
        group_agreement([[1.0, 0.0], [1.0]])


def test_jitter_is_part_of_the_protocol_and_the_script_reads_both_placements(model_dir, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    raw = {
        "name": "tiny",
        "model": str(model_dir),
        "device": "cpu",
        "data": str(text),
        "methods": [{"method": "none"}, {"method": "linear", "factor": 2}],
        "passkey": {"lengths": [160], "depths": [0.0, 1.0], "trials": 3, "jitter": 0},  # fixed (default: spread)
    }
    run_suite(suite_from_dict(raw), tmp_path / "fixed", progress=False)
    jittered = dict(raw, passkey={**raw["passkey"], "jitter": 0.25})
    # a folder of fixed-placement cells holds nothing for the jittered protocol
    assert len(SuiteRunner(suite_from_dict(jittered), tmp_path / "fixed").pending()) == 2
    run_suite(suite_from_dict(jittered), tmp_path / "jitter", progress=False)
    cell = tmp_path / "jitter" / "cells" / "none__passkey__160.json"
    record = json.loads(cell.read_text())
    assert record["measured"]["protocol"]["jitter"] == 0.25
    assert len({r["needle_start"] for r in record["result"]["records"]}) > 2
    fixed_report = (tmp_path / "fixed" / "report.md").read_text()
    assert "Placement: fixed" in fixed_report and " of 4 depth groups answered alike throughout" in fixed_report
    assert "each trial's depth drawn from depth ± 0.25" in (tmp_path / "jitter" / "report.md").read_text()

    bench = load_script("benchmarks/bench_passkey_clustering.py")
    folders = [str(tmp_path / "fixed"), str(tmp_path / "jitter")]
    assert bench.main([*folders, "--json", str(tmp_path / "rows.json"), "--plot", str(tmp_path / "t.png")]) == 0
    assert (tmp_path / "t.png").read_bytes().startswith(b"\x89PNG")
    out = squeezed(capsys.readouterr().out)
    assert "| none | 160 | fixed | " in out and "| none | 160 | jitter 0.25 | " in out
    # the two models on the same prompts are compared prompt by prompt, within each placement only
    pairs = [line for line in out.splitlines() if ") vs " in line]
    assert len(pairs) == 2 and all(("none (fixed)" in p) == ("linear (fixed)" in p) for p in pairs)
    assert any("| 160 | jitter 0.25 |" in p and "none (jitter)" in p and "linear (jitter)" in p for p in pairs)
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted(r["jitter"] for r in rows) == [0.0, 0.0, 0.25, 0.25]
    assert all(r["n"] == 6 and r["groups"] == 2 for r in rows)
    assert bench.main([str(tmp_path)]) == 2  # not a suite's output
    for run in ("a", "b"):  # two runs' folders of one name: each named by the part that differs
        shutil.copytree(tmp_path / "jitter", tmp_path / run / "finetuned")
    assert bench.main([str(tmp_path / "a" / "finetuned"), str(tmp_path / "b" / "finetuned")]) == 0
    pairs = [line for line in squeezed(capsys.readouterr().out).splitlines() if ") vs " in line]
    assert any("| linear (a/finetuned) vs none (a/finetuned) |" in p for p in pairs)
    assert any("| none (a/finetuned) vs none (b/finetuned) |" in p for p in pairs)


@pytest.mark.parametrize("jitter", [0.7, "wide"])
def test_a_suite_names_a_bad_jitter(model_dir, jitter):
    raw = {"name": "t", "model": str(model_dir), "methods": ["none"], "passkey": {"lengths": [160], "jitter": jitter}}
    with pytest.raises(SuiteError, match=r"passkey\.jitter must be a number in \[0, 0.5\]"):
        suite_from_dict(raw)


def test_eval_passkey_takes_jitter_and_records_it(model_dir, tmp_path, capsys):
    from ropescale.cli.main import main

    args = ["eval", "passkey", "--model", str(model_dir), "--method", "none", "--lengths", "160"]
    args += ["--depths", "0,1", "--trials", "2", "--no-progress", "--device", "cpu"]
    assert main([*args, "--jitter", "0.25", "--output", str(tmp_path / "j")]) == 0
    assert main([*args, "--jitter", "0", "--output", str(tmp_path / "f")]) == 0  # fixed (the default spreads)
    protocols = [
        json.loads(next((tmp_path / d / "cells").glob("*.json")).read_text())["measured"]["protocol"] for d in "jf"
    ]
    assert protocols[0]["jitter"] == 0.25 and "jitter" not in protocols[1]  # fixed cells keep their old key
    assert main([*args, "--jitter", "0.9", "--output", str(tmp_path / "bad")]) == 2
    assert "jitter must be a number in [0, 0.5]" in capsys.readouterr().err
