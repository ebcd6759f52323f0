"""A suite records the attention kernel each cell ran on: SDPA for a KV-consistent method even when
the suite asks for another kernel, and the asked kernel again for the static method patched after it."""

from __future__ import annotations

import json

from ropescale.evals.suite import runner as suite_mod
from ropescale.evals.suite.parse import suite_from_dict
from ropescale.models.runtime import Runtime
from tests.attention.test_kernel_restore import CALLS, register_kernel


def test_cells_record_the_kernel_that_ran(model_dir, tmp_path, monkeypatch):
    kernel = register_kernel()  # stands for flash_attention_2 (not installed here)
    data = tmp_path / "text.txt"
    data.write_text("Some words of a text that goes on. " * 300)
    suite = suite_from_dict(
        {
            "model": str(model_dir),
            "data": str(data),
            "methods": [{"method": "dynamic_ntk", "factor": 4}, {"method": "yarn", "factor": 4}],
            "perplexity": {"lengths": [64], "mode": "nonoverlap", "max_tokens": 64},
        }
    )
    runner = suite_mod.SuiteRunner(suite, tmp_path / "out", progress=False)
    runner._runtime = Runtime("cpu", "float32", kernel)
    calls = {}
    real = suite_mod.SuiteRunner._run_cell

    def counting(self, model, tokenizer, entry, task, length):
        before = CALLS["n"]
        result = real(self, model, tokenizer, entry, task, length)
        calls[entry.label] = CALLS["n"] - before
        return result

    monkeypatch.setattr(suite_mod.SuiteRunner, "_run_cell", counting)
    runner.run()
    records = {r["method"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "out" / "cells").glob("*.json"))}
    assert records["dynamic_ntk"]["runtime"]["attention"] == "sdpa" and calls["dynamic_ntk"] == 0
    assert records["yarn"]["runtime"]["attention"] == kernel and calls["yarn"] > 0  # not left on SDPA
    assert runner.pending() == []  # what was recorded is what this runtime runs: nothing to redo
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"cpu / float32 / {kernel}" in report and "cpu / float32 / sdpa" in report
