"""The GPU battery's plan of calls (benchmarks/gpu_battery.py), checked without running a model: the
unscaled model only at and below its trained context, every method on the same tasks and samples, RULER
cells of every method in one folder, perplexity in a folder per method (one writer each), and a run cut
by ``--minutes`` says what it did not start."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/gpu_battery.py")


def test_the_unscaled_model_is_measured_only_up_to_its_trained_context(bench):
    calls = bench.commands(bench.parse_args(["--output", "o"]))
    ruler = [c for c in calls if c[2] == "ruler"]
    assert len(ruler) == len(bench.METHODS)
    lengths = {c[c.index("--method") + 1]: c[c.index("--lengths") + 1] for c in ruler}
    assert lengths["none"] == "2048,4096,8192"
    assert lengths["yarn"] == "2048,4096,8192,16384,32768"
    assert {c[c.index("--output") + 1] for c in ruler} == {"o/ruler"}
    assert {c[c.index("--samples") + 1] for c in ruler} == {"30"}
    ppl = [c[c.index("--output") + 1] for c in calls if c[2] == "perplexity"]
    assert len(set(ppl)) == len(ppl) == len(bench.METHODS)


def test_an_unknown_method_label_stops_before_anything_runs(bench):
    with pytest.raises(SystemExit, match="unknown method label 'yarnn'"):
        bench.commands(bench.parse_args(["--methods", "none,yarnn"]))


def test_a_spent_budget_lists_what_is_left(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench.subprocess, "call", lambda cmd: pytest.fail("nothing may start"))
    assert bench.main(["--minutes", "-1", "--methods", "none,yarn", "--skip-ppl"]) == 3
    out = capsys.readouterr().out
    assert "not started (2)" in out and "--method yarn" in out


def test_chat_prompts_reach_every_ruler_call_and_plain_ones_add_no_flag(bench):
    chat = bench.commands(bench.parse_args(["--prompt", "chat", "--skip-ppl"]))
    assert chat and all(c[c.index("--prompt") + 1] == "chat" for c in chat)
    assert all("--prompt" not in c for c in bench.commands(bench.parse_args(["--skip-ppl"])))
