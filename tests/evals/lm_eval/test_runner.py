"""run_harness end to end on the tiny model: results, metadata, the JSON file, the table."""

from __future__ import annotations

import json

from ropescale.evals.lm_eval import format_results, run_harness
from ropescale.evals.lm_eval.runner import results_path


def test_run_harness_end_to_end(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = run_harness(
        str(tiny_dir),
        "passkey_2k",
        method="yarn",
        factor=4,
        limit=2,
        output_path=out,
        device="cpu",
        log_samples=True,
        metadata={"passkey_samples": 3},
    )
    acc = results["results"]["passkey_2k"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and results["n-samples"]["passkey_2k"] == {"original": 3, "effective": 2}
    assert results["ropescale"]["method"] == "yarn" and results["ropescale"]["max_length"] == 2048
    assert results["ropescale"]["metadata"]["tokenizer"] == str(tiny_dir)
    assert results["ropescale"]["metadata"]["max_seq_lengths"] == [2048]  # RULER's lengths follow max_length
    assert results["configs"]["passkey_2k"]["metadata"]["max_seq_lengths"] == [2048]
    assert len(results["samples"]["passkey_2k"]) == 2
    assert results_path(out) == out / "results.json" and results_path(tmp_path / "r.json") == tmp_path / "r.json"
    assert json.loads((out / "results.json").read_text())["results"]["passkey_2k"]["acc,none"] == acc
    assert "passkey_2k" in format_results(results)
