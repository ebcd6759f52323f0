"""Suites a user can size (issue 52): ``eval suite --lengths/--samples/--dry-run``, a line per finished
cell without a terminal, the factor in every row, plain plot file names."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from ropescale.cli.main import main
from ropescale.evals.suite.parse import SuiteError, load_suite
from ropescale.evals.suite.runner import SuiteRunner
from ropescale.evals.suite.spec import MethodEntry
from ropescale.evals.tasks import task_table
from tests.conftest import squeezed, tiny_model

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. The quick brown fox jumps over the lazy dog 12345 times. "
) * 60

SUITE = """name: sized
model: MODEL
device: cpu
data: DATA
methods:
  - none
  - {method: yarn, factor: 2}
  - {method: yarn, factor: 2, params: {attention_factor: 1.0}, label: Yarn AF (1.0), only: {passkey: [200]}}
perplexity: {lengths: [128, 200], mode: nonoverlap, max_tokens: 200}
passkey: {lengths: [128, 200], depths: [0.25, 0.75], trials: 3}
"""


@pytest.fixture
def suite_file(model_dir, tmp_path):
    data = tmp_path / "t.txt"
    data.write_text(TEXT)
    path = tmp_path / "sized.yaml"
    path.write_text(SUITE.replace("MODEL", str(model_dir)).replace("DATA", str(data)))
    return path


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, bytelevel_tokenizer):
    """A Qwen2.5-shaped folder: a Qwen2 model trained at 32k (tiny, random)."""
    path = tmp_path_factory.mktemp("qwen")
    model = tiny_model("qwen2", vocab_size=len(bytelevel_tokenizer), max_position_embeddings=32768)
    model.save_pretrained(path)
    bytelevel_tokenizer.save_pretrained(path)
    return path


# -- --lengths ---------------------------------------------------------------------------------
def test_lengths_replace_every_tasks_lengths_and_narrow_only(suite_file):
    full = load_suite(suite_file)
    assert len(full.cells()) == 2 * 4 + 3  # the labelled yarn: perplexity at both, passkey at 200 only
    small = load_suite(suite_file, lengths=["128"])
    assert small.perplexity["lengths"] == [128] and small.passkey["lengths"] == [128]
    assert [(m.label, t, n) for m, t, n in small.cells()] == [
        ("none", "perplexity", 128),
        ("none", "passkey", 128),
        ("yarn", "perplexity", 128),
        ("yarn", "passkey", 128),
        ("Yarn AF (1.0)", "perplexity", 128),  # its `only` asked passkey at 200, not asked now
    ]
    assert "Sized with `--lengths 128`" in small.sized and "lengths 128" in small.sized


def test_relative_lengths_size_a_shipped_suite_on_a_qwen_shaped_folder(qwen_dir):
    """extend-check on a model trained at 32k asks 64k and 128k cells; --lengths L/4,L keeps it within 32k."""
    full = load_suite("extend-check", model=str(qwen_dir))
    assert max(full.perplexity["lengths"]) == 131072 and 65536 in full.passkey["lengths"]
    small = load_suite("extend-check", model=str(qwen_dir), lengths=["L/4", "L"])
    assert small.perplexity["lengths"] == [8192, 32768] and small.passkey["lengths"] == [8192, 32768]
    assert {m.factor for m in small.methods if m.factor} == {4.0}  # the target, and the factors, stay


def test_a_target_within_the_trained_context_says_how_to_size_the_suite(qwen_dir, capsys):
    with pytest.raises(SuiteError, match="within the model's trained context 32768; .*give --lengths"):
        load_suite("extend-check", model=str(qwen_dir), target_length=16384)


@pytest.mark.parametrize("value", ["abc", "4q", "0", ","])
def test_a_bad_lengths_value_is_refused_in_one_line(suite_file, tmp_path, capsys, value):
    code = main(["eval", "suite", str(suite_file), "--lengths", value, "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--lengths" in err[0], err
    assert not (tmp_path / "o").exists()


# -- --samples ---------------------------------------------------------------------------------
def test_samples_cap_retrieval_prompts_and_key_the_cells_apart(suite_file, tmp_path):
    full, small = load_suite(suite_file), load_suite(suite_file, samples=2)
    assert full.settings("passkey").trials == 3 and small.settings("passkey").trials == 1  # 2 depths x 1
    assert small.settings("perplexity") == full.settings("perplexity")
    assert "passkey: 2 depths × 1 trial (the suite's: × 3)" in small.sized
    # the protocol a cell is keyed by differs: a sized-down cell is never resumed as the full one
    proto = lambda s: task_table.protocol(task_table.get("passkey"), s.block("passkey"), s.seed)  # noqa: E731
    assert proto(full) != proto(small)
    runner, full_runner = SuiteRunner(small, tmp_path / "o"), SuiteRunner(full, tmp_path / "o")
    assert runner.measured("passkey") != full_runner.measured("passkey")
    # a cap at or above the suite's prompts changes nothing, so its cells stay the full suite's
    same = load_suite(suite_file, samples=6)
    assert same.block("passkey") == full.block("passkey") and "no cell had more than 6 prompts" in same.sized


def test_samples_cap_ruler(tmp_path, model_dir):
    path = tmp_path / "r.yaml"
    path.write_text(f"model: {model_dir}\nmethods: [none]\nruler: {{tasks: [vt], samples: 30, lengths: [128]}}\n")
    small = load_suite(path, samples=4)
    assert small.settings("ruler").samples == 4 and "ruler: 4 samples (the suite's: 30)" in small.sized


def test_a_sized_run_goes_to_its_own_folder_and_says_so_in_its_report(suite_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "suite", str(suite_file), "--lengths", "128", "--samples", "2", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sized: 5 of 5 cells to run" in printed and printed.count("\ncell ") == 5  # --no-progress: a line per cell
    out = tmp_path / "runs" / "sized-samples2"
    report = (out / "report.md").read_text()
    assert (
        "**Sized with `--lengths 128 --samples 2`, not the suite file's matrix: lengths 128; passkey: 2 depths"
        in report
    )
    assert "Sized with" in json.loads((out / "results.json").read_text())["sized"]
    written = yaml.safe_load((out / "suite.yaml").read_text())
    assert written["passkey"]["trials"] == 1 and written["sized"].startswith("Sized with")
    assert load_suite(out / "suite.yaml").sized == written["sized"]  # the written suite reads back
    # the full suite pointed at the sized folder: its passkey cells are not the full suite's, refused before loading
    assert main(["eval", "suite", str(suite_file), "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "measured with a different protocol.trials" in err[0], err
    # --report-only of the full suite would show the sized cells as its own: refused; with the sizing, reported
    assert main(["eval", "suite", str(suite_file), "--output", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "protocol.trials: 1 -> 3" in err[0] and "'sized'" in err[0], err
    assert main([*argv[:-1], "--output", str(out), "--report-only"]) == 0
    assert "finished 5/5 cells (nothing run)" in capsys.readouterr().out


# -- --dry-run ---------------------------------------------------------------------------------
def test_dry_run_lists_the_cells_and_loads_no_weights(qwen_dir, tmp_path, capsys, monkeypatch):
    import ropescale.models.loading as loading

    def no_weights(*a, **k):
        raise AssertionError("a dry run loaded weights")

    monkeypatch.setattr(loading, "from_pretrained", no_weights)
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "suite", "extend-check", "--model", str(qwen_dir), "--dry-run"]
    assert main(argv) == 0
    out = squeezed(capsys.readouterr().out)
    assert "| yarn ×4 | passkey | 131,072 | 6 |" in out and "| none | perplexity | 65,536 | 4 |" in out
    assert "estimate:" in out and "size it: --lengths" in out
    assert main([*argv, "--lengths", "2k,4k", "--samples", "3", "--gpu", "a100-80gb"]) == 0
    out = squeezed(capsys.readouterr().out)
    assert "65,536" not in out and "| ntk ×4 | passkey | 4,096 | 3 |" in out and "A100" in out
    assert "16 cells into runs/extend-check-" in out and "-samples3" in out
    assert not (tmp_path / "runs").exists()


def test_gpu_without_dry_run_is_refused(suite_file, capsys):
    assert main(["eval", "suite", str(suite_file), "--gpu", "a100-80gb"]) == 2
    assert "add --dry-run" in capsys.readouterr().err


# -- a line per finished cell, factors in every row, plain plot names --------------------------
def test_without_a_terminal_each_finished_cell_prints_a_line(suite_file, tmp_path, capsys):
    out = tmp_path / "o"
    # pytest's capture is no terminal: no bar, a line per cell (as under --no-progress)
    assert main(["eval", "suite", str(suite_file), "--lengths", "128,200", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("cell ")]
    assert len(lines) == 11 and "suite cells" not in captured.err
    assert re.fullmatch(r"cell 1/11: perplexity none at 128: ppl [0-9.,e+]+ \(\d+ s\)", lines[0]), lines[0]
    assert any(re.fullmatch(r"cell \d+/11: passkey yarn ×2 at 200: accuracy \d\.\d\d \(\d+ s\)", x) for x in lines)
    assert "sized: 11 of 11 cells to run" in captured.out

    report = squeezed((out / "report.md").read_text())
    assert "| yarn ×2 |" in report and "| Yarn AF (1.0) ×2 |" in report and "| yarn |" not in report
    assert "methods: none, yarn ×2, Yarn AF (1.0) ×2 (yarn ×2, {'attention_factor': 1.0})" in report
    plots = sorted(p.name for p in out.glob("*.png"))
    assert plots == [
        "passkey_none.png",
        "passkey_yarn-af-1.0.png",
        "passkey_yarn.png",
        "perplexity_vs_length.png",
    ]


def test_rows_keep_a_factor_the_label_already_says():
    assert MethodEntry("yarn", "yarn", 4.0).title == "yarn ×4"
    assert MethodEntry("yarn-x4", "yarn", 4.0).title == "yarn-x4"
    assert MethodEntry("yarn x2 (saved)", "saved").title == "yarn x2 (saved)"
    assert MethodEntry("yarn-x48", "yarn", 4.0).title == "yarn-x48 ×4"
    assert MethodEntry("none", "none").title == "none"


def test_plot_names_are_plain_whatever_the_label():
    from ropescale.evals.tasks.report_cells import plot_name

    assert plot_name("passkey", "yarn x2 (saved)") == "passkey_yarn-x2-saved.png"
    assert plot_name("needle", "none (scaling removed)") == "needle_none-scaling-removed.png"
    assert re.fullmatch(r"[a-z0-9_.-]+", plot_name("passkey", "Ünïcode / ×4"))


def test_a_bar_on_the_terminal_and_the_lines_in_a_redirected_stdout(suite_file, tmp_path, capsys, monkeypatch):
    """``ropescale eval suite ... > log``: stderr is a terminal (the bar), stdout a file (a line per cell)."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["eval", "suite", str(suite_file), "--lengths", "128", "--output", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "suite cells" in captured.err and captured.out.count("\ncell ") == 5
