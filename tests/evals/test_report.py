"""Suite reports: trials and 95% Wilson intervals per retrieval cell, and the short-context
regression flags (retrieval at the shortest length, perplexity within the trained context)."""

from __future__ import annotations

import json

import pytest

from ropescale.evals.report.aggregate import write_report
from ropescale.evals.report.cell_keys import cell_id
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.suite.parse import suite_from_dict
from tests.conftest import squeezed


def passkey_result(length: int, hits: list[bool]) -> dict:
    records = [{"length": length, "depth": 0.5, "trial": t, "correct": ok} for t, ok in enumerate(hits)]
    return {"depths": [0.5], "trials": len(hits), "accuracy": [[sum(hits) / len(hits)]], "records": records}


def write_cells(out, suite, results) -> None:
    entries = {m.label: m for m in suite.methods}
    (out / "cells").mkdir(parents=True, exist_ok=True)
    for (label, task, length), result in results.items():
        record = SuiteCell.of(entries[label], task, length, None, result).to_json()
        (out / "cells" / f"{cell_id(entries[label], task, length)}.json").write_text(json.dumps(record))


@pytest.fixture
def suite(model_dir):  # the tiny model's trained context: 256
    return suite_from_dict(
        {
            "name": "t",
            "model": str(model_dir),
            "methods": ["none", {"method": "yarn", "factor": 4}, {"method": "dca", "factor": 4}],
            "perplexity": {"lengths": [128, 512]},
            "passkey": {"lengths": [100, 400]},
        }
    )


def test_cells_show_trials_and_wilson_intervals_and_regressions_are_flagged(suite, tmp_path):
    write_cells(
        tmp_path,
        suite,
        {
            ("none", "passkey", 100): passkey_result(100, [True] * 6),
            ("yarn", "passkey", 100): passkey_result(100, [True] * 5 + [False]),  # one miss: within noise
            ("dca", "passkey", 100): passkey_result(100, [True] * 2 + [False] * 4),  # beyond it
            ("dca", "passkey", 400): passkey_result(400, [True] * 6),
            ("none", "perplexity", 128): {"ppl": 10.0},
            ("yarn", "perplexity", 128): {"ppl": 10.1},  # +1%: within the margin
            ("dca", "perplexity", 128): {"ppl": 10.5},  # +5%
            ("none", "perplexity", 512): {"ppl": 80.0},
            ("yarn", "perplexity", 512): {"ppl": 90.0},  # beyond the trained context: not a short-context loss
        },
    )
    summary = write_report(suite, tmp_path)
    report = squeezed(summary["markdown"])  # columns padded to their widest cell
    assert "| none | 1.00 · 6/6 [0.61, 1.00] | — | 100 |" in report
    assert "| dca ×4 | 0.33 · 2/6 [0.10, 0.70] | 1.00 · 6/6 [0.61, 1.00] | 400 |" in report
    stats = summary["statistics"]["passkey"]["yarn"]["100"]
    assert (
        stats["trials"] == 6
        and stats["successes"] == 5
        and stats["wilson95"] == pytest.approx([0.4365, 0.9699], abs=1e-4)
    )
    flags = {(f["method"], f["task"], f["length"]) for f in summary["regressions"]}
    assert flags == {("dca", "passkey", 100), ("dca", "perplexity", 128)}
    assert "⚠ **dca ×4**: passkey at 100 is 0.33 (difference +0.67, 95% [0.13, 0.90]); unscaled 1.00" in report
    assert "⚠ **dca ×4**: perplexity at 128 is 10.50 (+5.0%); unscaled 10.00" in report
    assert "trained context 256" in report and json.loads((tmp_path / "results.json").read_text())["regressions"]


def test_nothing_flagged_and_no_baseline(suite, tmp_path, model_dir):
    write_cells(tmp_path, suite, {("none", "passkey", 100): passkey_result(100, [True, False])})
    assert "- none flagged" in write_report(suite, tmp_path)["markdown"]
    alone = suite_from_dict({"name": "t", "model": str(model_dir), "methods": ["yarn"], "passkey": {"lengths": [100]}})
    assert "No unscaled method (`none`)" in write_report(alone, tmp_path / "other")["markdown"]


def test_results_read_back_without_their_suite_file(suite, tmp_path):
    """A results folder merged from several runs (cells copied, report written again) has no suite.yaml
    of the labels it reports: results.json itself says what each label ran and where the needles sat."""
    from ropescale.evals.advice.evidence import load_results

    labelled = suite_from_dict(
        {
            "name": "t",
            "model": suite.model,
            "methods": [{"method": "self_extend", "factor": 4, "params": {"group_size": 8}, "label": "se-g8"}],
            "passkey": {"lengths": [100], "jitter": 0.125},
        }
    )
    write_cells(tmp_path, labelled, {("se-g8", "passkey", 100): passkey_result(100, [True] * 6)})
    write_report(labelled, tmp_path)
    assert not (tmp_path / "suite.yaml").exists()
    ev = load_results(tmp_path / "results.json")
    assert [(r.label, r.method, r.factor, r.params) for r in ev.rows] == [
        ("se-g8", "self_extend", 4.0, {"group_size": 8})
    ]
    assert ev.passkey_jitter == 0.125
    # written before results recorded it: a label no method has is left out, never taken for a method name
    summary = json.loads((tmp_path / "results.json").read_text())
    del summary["methods"], summary["passkey_jitter"]
    (tmp_path / "results.json").write_text(json.dumps(summary))
    assert load_results(tmp_path / "results.json").rows == ()


def test_the_perplexity_plot_names_the_model_the_factor_and_the_trained_context(suite, tmp_path, monkeypatch):
    """The suite's plot gets what the reader needs beside the curves (make demo's docs/img/demo.png had none)."""
    import ropescale.evals.tasks.report_cells as report_cells

    seen = {}

    def plot(curves, lengths, path, **named):
        seen.update(named, curves=curves)

    monkeypatch.setattr(report_cells, "plot_perplexity_curves", plot)
    write_cells(
        tmp_path, suite, {("none", "perplexity", 128): {"ppl": 10.0}, ("yarn", "perplexity", 128): {"ppl": 10.1}}
    )
    write_report(suite, tmp_path)
    assert seen["model"] == suite.model and seen["factor"] == 4.0 and seen["trained_context"] == 256
    assert seen["curves"]["yarn ×4"] == {128: 10.1}  # the legend names each curve's factor
