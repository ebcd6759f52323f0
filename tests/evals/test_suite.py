"""Suites: resumable cells, same results after an interruption, report and plots, clean CLI errors."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ropescale.cli.main import main
from ropescale.evals.suite import runner as suite_mod
from ropescale.evals.suite.parse import SuiteError, load_suite, suite_from_dict
from ropescale.evals.suite.runner import run_suite
from tests.conftest import squeezed

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. The quick brown fox jumps over the lazy dog 12345 times. "
) * 60


@pytest.fixture
def suite_dict(model_dir, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    return {
        "name": "tiny",
        "model": str(model_dir),
        "device": "cpu",  # explicit: the recorded runtimes are compared with cpu ones
        "data": str(data),
        "methods": [{"method": "none"}, {"method": "yarn", "factor": 4}, {"method": "linear", "factor": 4}],
        "perplexity": {"lengths": [64, 200], "mode": "nonoverlap", "max_tokens": 400},
        "passkey": {"lengths": [128, 300], "depths": [0.0, 1.0], "trials": 1},
    }


def _cells(out):
    return {p.name: json.loads(p.read_text())["result"] for p in sorted((out / "cells").glob("*.json"))}


def _strip_times(cells):
    """The cells without what differs between runs of the same work: their timing, and what a resumed
    cell's journaled prompts cost (``resumed``)."""
    for result in cells.values():
        result.pop("elapsed_s", None)
        result.pop("tokens_per_second", None)
        result.pop("resumed", None)
    return cells


def test_interrupted_suite_resumes_to_the_same_results(suite_dict, tmp_path, monkeypatch):
    full = run_suite(suite_from_dict(suite_dict), tmp_path / "full", progress=False)
    assert full["cells_finished"] == full["cells_total"] == 12
    expected = _strip_times(_cells(tmp_path / "full"))

    real = suite_mod.SuiteRunner._run_cell
    calls = {"n": 0}

    def crash_on_fifth(self, *args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(suite_mod.SuiteRunner, "_run_cell", crash_on_fifth)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite_from_dict(suite_dict), tmp_path / "resumed", progress=False)
    assert len(_cells(tmp_path / "resumed")) == 4  # only the cell in flight was lost

    ran = []
    monkeypatch.setattr(suite_mod.SuiteRunner, "_run_cell", lambda self, *a: ran.append(a[2:]) or real(self, *a))
    summary = run_suite(suite_from_dict(suite_dict), tmp_path / "resumed", progress=False)
    assert len(ran) == 8 and summary["cells_finished"] == 12  # finished cells were not recomputed
    assert _strip_times(_cells(tmp_path / "resumed")) == expected

    report = squeezed((tmp_path / "resumed" / "report.md").read_text())
    assert "## Perplexity" in report and "## Passkey retrieval" in report and "| yarn ×4 |" in report
    assert "non-overlapping windows" in report
    for plot in summary["plots"]:
        assert (tmp_path / "resumed" / plot.split("/resumed/")[-1]).stat().st_size > 1000
    assert len(summary["plots"]) == 1 + 3  # ppl vs length + one passkey heatmap per method


def test_changed_method_settings_invalidate_cells(suite_dict, tmp_path):
    one = dict(suite_dict, methods=[{"method": "yarn", "factor": 4}], passkey=None)
    run_suite(suite_from_dict(one), tmp_path / "out", progress=False)
    two = dict(one, methods=[{"method": "yarn", "factor": 4, "params": {"attention_factor": 1.0}}])
    runner = suite_mod.SuiteRunner(suite_from_dict(two), tmp_path / "out", progress=False)
    assert len(runner.pending()) == 2


def test_cells_record_their_runtime_and_another_runtime_redoes_them(suite_dict, tmp_path):
    """A GPU run (bf16) resumed on the CPU (fp32) must not mix the two in one table."""
    one = dict(suite_dict, methods=[{"method": "yarn", "factor": 4}], passkey=None, dtype="float32")
    run_suite(suite_from_dict(one), tmp_path / "out", progress=False)
    record = json.loads(next((tmp_path / "out" / "cells").glob("*.json")).read_text())
    assert record["runtime"] == {"device": "cpu", "dtype": "float32", "attention": "sdpa"}
    assert "cpu / float32 / sdpa" in (tmp_path / "out" / "report.md").read_text()
    assert suite_mod.SuiteRunner(suite_from_dict(dict(one, dtype="auto")), tmp_path / "out").pending() == []
    assert len(suite_mod.SuiteRunner(suite_from_dict(dict(one, dtype="bfloat16")), tmp_path / "out").pending()) == 2


def test_bf16_cells_of_another_cpu_kernel_are_redone(suite_dict, tmp_path, monkeypatch):
    """AMX and AVX512-BF16 round bf16 differently: a run resumed on the other CPU starts its cells anew."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True, "avx512_bf16": True})
    one = dict(suite_dict, methods=[{"method": "yarn", "factor": 4}], passkey=None, dtype="bfloat16")
    run_suite(suite_from_dict(one), tmp_path / "out", progress=False)
    record = json.loads(next((tmp_path / "out" / "cells").glob("*.json")).read_text())
    assert record["runtime"]["kernels"] == "amx"
    assert "cpu / bfloat16 (amx) / sdpa" in (tmp_path / "out" / "report.md").read_text()
    assert suite_mod.SuiteRunner(suite_from_dict(one), tmp_path / "out").pending() == []
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": False, "avx512_bf16": True})
    assert len(suite_mod.SuiteRunner(suite_from_dict(one), tmp_path / "out").pending()) == 2
    for path in (tmp_path / "out" / "cells").glob("*.json"):  # written before kernels were recorded: kept
        record = json.loads(path.read_text())
        del record["runtime"]["kernels"]
        path.write_text(json.dumps(record))
    assert suite_mod.SuiteRunner(suite_from_dict(one), tmp_path / "out").pending() == []


@pytest.mark.parametrize(
    "change,message",
    [
        ({"methods": []}, "at least one method"),
        ({"methods": [{"method": "yarm", "factor": 4}]}, "did you mean 'yarn'"),
        ({"methods": [{"method": "yarn", "factor": 0}]}, "factor must be >= 1"),
        ({"perplexity": {"lengths": [0]}}, "perplexity.lengths must be positive"),
        ({"perplexity": None, "passkey": None}, "at least one task"),
        ({"dtype": "int8"}, "dtype must be one of"),
        ({"attn_implementation": "flash"}, "attn_implementation must be one of"),
        ({"bogus": 1}, "unknown suite key 'bogus'"),
        ({"methods": [{"method": "yarn", "factor": 4, "params": {"kv_consistent": True}}]}, "applies to methods whose"),
    ],
)
def test_bad_suites(suite_dict, change, message):
    with pytest.raises((SuiteError, ValueError), match=message):
        suite_from_dict(dict(suite_dict, **change))


def test_only_runs_a_method_at_some_lengths(suite_dict, tmp_path):
    """A hopeless cell can be left out (the demo skips linear's 16k cells): the rest of the matrix
    runs, the report marks the gap as not run rather than missing, and the run counts as complete."""
    methods = [
        {"method": "none", "only": {"passkey": [128]}},
        {"method": "yarn", "factor": 4, "only": {"perplexity": []}},
    ]
    suite = suite_from_dict(dict(suite_dict, methods=methods, note="yarn's perplexity is known."))
    cells = [(m.label, t, n) for m, t, n in suite.cells()]
    assert cells == [
        ("none", "perplexity", 64),
        ("none", "perplexity", 200),
        ("none", "passkey", 128),
        ("yarn", "passkey", 128),
        ("yarn", "passkey", 300),
    ]
    summary = run_suite(suite, tmp_path / "out", progress=False)
    assert (summary["cells_finished"], summary["cells_total"]) == (5, 5)
    report = squeezed((tmp_path / "out" / "report.md").read_text())
    assert "| yarn ×4 | n/r | n/r |" in report and "n/r: not run for that method" in report
    assert "yarn's perplexity is known." in report
    assert load_suite(tmp_path / "out" / "suite.yaml").methods[0].only == {"passkey": [128]}


@pytest.mark.parametrize(
    "only,message",
    [
        ({"needle": [64]}, "names task 'needle', which this suite does not run"),
        ({"perplexity": [65]}, "asks perplexity at 65, not among perplexity.lengths"),
        ({"perplexity": 64}, "must be a non-empty list"),
        ([64], "must map tasks to lengths"),
    ],
)
def test_bad_only(suite_dict, only, message):
    with pytest.raises(SuiteError, match=message):
        suite_from_dict(dict(suite_dict, methods=[{"method": "none", "only": only}]))


def test_kv_consistent_is_a_patch_option_a_suite_can_set(suite_dict):
    entry = {"method": "dynamic_ntk", "factor": 4, "params": {"kv_consistent": False}, "label": "dyn-plain"}
    suite = suite_from_dict(dict(suite_dict, methods=[entry]))
    assert suite.methods[0].params == {"kv_consistent": False}


def test_factor_too_small_and_length_larger_than_text(suite_dict, tmp_path):
    small = dict(suite_dict, methods=[{"method": "yarn", "factor": 2}], passkey=None)  # L=256, 2x → 512
    small["perplexity"] = {"lengths": [600]}
    with pytest.raises(SuiteError, match="too small for perplexity at 600 tokens"):
        run_suite(suite_from_dict(small), tmp_path / "a", progress=False)
    long = dict(suite_dict, methods=[{"method": "none"}], passkey=None)
    long["perplexity"] = {"lengths": [50_000]}
    with pytest.raises(SuiteError, match="larger than the longest document"):
        run_suite(suite_from_dict(long), tmp_path / "b", progress=False)


def test_shipped_suites_parse(model_dir):
    from ropescale.evals.suite.parse import SUITES_DIR

    names = sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))
    assert names
    for name in names:
        relative = "target_length" in (SUITES_DIR / f"{name}.yaml").read_text()  # lengths need a model's L
        assert load_suite(name, model=str(model_dir) if relative else None).cells()


def test_cli_eval_commands(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the no-GPU path: cpu runs, cuda refused
    data = tmp_path / "t.txt"
    data.write_text(TEXT)
    code = main(
        [
            "eval",
            "perplexity",
            "--model",
            str(model_dir),
            "--methods",
            "none,yarn",
            "--factor",
            "2",
            "--lengths",
            "64",
            "--max-tokens",
            "128",
            "--data",
            str(data),
            "--output",
            str(tmp_path / "p"),
            "--no-progress",
        ]
    )
    out = squeezed(capsys.readouterr().out)
    assert code == 0 and "| yarn ×2 |" in out and "report:" in out
    for argv, fragment in [
        (
            ["eval", "perplexity", "--model", str(model_dir), "--lengths", "64", "--data", str(tmp_path / "nope.txt")],
            "not found",
        ),
        (
            ["eval", "perplexity", "--model", str(model_dir), "--methods", "yarn", "--lengths", "64"],
            "--factor is required",
        ),
        (["eval", "passkey", "--model", str(model_dir), "--lengths", "abc"], "--lengths must be"),
        (["eval", "passkey", "--model", str(model_dir), "--lengths", "64", "--depths", "2"], "in [0, 1]"),
        (["eval", "suite", str(tmp_path / "missing.yaml")], "not found"),
        (["eval", "perplexity", "--model", str(model_dir), "--lengths", "64", "--device", "cuda"], "no CUDA device"),
        (
            [
                "eval",
                "passkey",
                "--model",
                str(model_dir),
                "--lengths",
                "64",
                "--attn-implementation",
                "flash_attention_2",
            ],
            "CUDA device only",
        ),
    ]:
        code = main(argv + ["--output", str(tmp_path / "x")] if argv[1] != "suite" else argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and fragment in err[0], err


def test_report_context_uses_each_results_threshold(tmp_path):
    """A length counts towards the context column when it reaches its own result's threshold: 0.85
    passes passkey's 0.8 but not RULER's 0.856."""
    from ropescale.evals.report.aggregate import write_report
    from ropescale.evals.report.cell_keys import cell_id
    from ropescale.evals.report.cell_record import SuiteCell
    from ropescale.evals.suite.spec import MethodEntry

    suite = suite_from_dict(
        {
            "name": "t",
            "model": "unused",
            "methods": ["none"],
            "passkey": {"lengths": [100, 200]},
            "needle": {"lengths": [100, 200]},
        }
    )
    for task, threshold in (("passkey", 0.8), ("needle", 0.856)):
        for length, acc in ((100, 1.0), (200, 0.85)):
            result = {"depths": [0.5], "accuracy": [[acc]], "threshold": threshold}
            record = SuiteCell.of(MethodEntry("none", "none"), task, length, None, result).to_json()
            path = tmp_path / "cells" / f"{cell_id(MethodEntry('none', 'none'), task, length)}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(record))
    report = squeezed(write_report(suite, tmp_path)["markdown"])
    passkey, needle = report.split("## Passkey retrieval")[1].split("## Needle suite")
    # cells without records: 1 depth x 1 trial; a fractional score has no whole success count
    assert "| none | 1.00 · 1/1 [0.21, 1.00] | 0.85 · n=1 [0.15, 0.99] | 200 |" in passkey
    assert "accuracy ≥ 0.8." in passkey
    assert "| none | 1.00 · 1/1 [0.21, 1.00] | 0.85 · n=1 [0.15, 0.99] | 100 |" in needle
    assert "accuracy ≥ 0.856." in needle


def _interrupt_after(n: int, monkeypatch):
    """Make the n+1-th prompt a retrieval cell records raise KeyboardInterrupt (a cut-short run).
    Returns the real ``PromptJournal.record`` and the list of what was recorded."""
    from ropescale.evals.tasks.generation import PromptJournal

    real, recorded = PromptJournal.record, []

    def record(self, *args):
        if len(recorded) == n:
            raise KeyboardInterrupt
        recorded.append(args)
        return real(self, *args)

    monkeypatch.setattr(PromptJournal, "record", record)
    return real, recorded


def test_an_interrupted_passkey_cell_resumes_at_its_first_unfinished_prompt(suite_dict, tmp_path, monkeypatch):
    from ropescale.evals.tasks.generation import PromptJournal

    one = dict(suite_dict, methods=[{"method": "yarn", "factor": 4}], perplexity=None)
    one["passkey"] = {"lengths": [128], "depths": [0.0, 0.5, 1.0], "trials": 2}
    run_suite(suite_from_dict(one), tmp_path / "full", progress=False)
    expected = _strip_times(_cells(tmp_path / "full"))

    real, recorded = _interrupt_after(4, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite_from_dict(one), tmp_path / "resumed", progress=False)
    assert not _cells(tmp_path / "resumed") and len(list((tmp_path / "resumed" / "cells").glob("*.partial.jsonl"))) == 1

    # what the cut-short cell has so far: reported, marked in progress, the journal untouched, no weights
    journal = next((tmp_path / "resumed" / "cells").glob("*.partial.jsonl"))
    before = journal.read_bytes()
    monkeypatch.setattr("ropescale.models.loading.from_pretrained", lambda *a, **k: pytest.fail("loaded weights"))
    path = tmp_path / "one.yaml"
    path.write_text(json.dumps(one))
    assert main(["eval", "suite", str(path), "--output", str(tmp_path / "resumed"), "--report-only"]) == 0
    assert journal.read_bytes() == before
    summary = json.loads((tmp_path / "resumed" / "results.json").read_text())
    cell = summary["tasks"]["passkey"]["yarn"]["128"]
    assert summary["cells_finished"] == 0 and cell["partial"] == {"prompts": 4, "of": 6}
    full = {(r["depth"], r["trial"]): r for r in expected["yarn__passkey__128.json"]["records"]}
    assert cell["depths"] == [0.0, 0.5, 1.0]  # decoded trial by trial: every depth has one after 3
    assert [(r["depth"], r["trial"]) for r in cell["records"]] == [(0.0, 0), (0.0, 1), (0.5, 0), (1.0, 0)]
    assert all(r == full[(r["depth"], r["trial"])] for r in cell["records"])
    report = squeezed((tmp_path / "resumed" / "report.md").read_text())
    assert re.search(r"\| yarn ×4 \| [0-9.]+ · [0-9]/4 \[[0-9., ]+\] \(in progress: 4 of 6 prompts\) \| — \|", report)
    assert (tmp_path / "resumed" / "passkey_yarn.png").stat().st_size > 1000
    monkeypatch.undo()

    recorded.clear()
    monkeypatch.setattr(PromptJournal, "record", lambda self, *a: recorded.append(a) or real(self, *a))
    run_suite(suite_from_dict(one), tmp_path / "resumed", progress=False)
    assert len(recorded) == 2  # the 6-prompt cell decoded only the two the crash left
    resumed = _cells(tmp_path / "resumed")["yarn__passkey__128.json"]["resumed"]
    assert resumed["prompts"] == 4 and resumed["seconds"] >= 0  # the four the journal held, their time counted
    assert _strip_times(_cells(tmp_path / "resumed")) == expected
    assert not list((tmp_path / "resumed" / "cells").glob("*.partial.jsonl"))  # gone once the cell is written


def test_prompts_decoded_under_another_scaling_are_not_resumed(suite_dict, tmp_path, monkeypatch):
    """The journal of a cut-short cell names the scaling that ran (every resolved parameter): a cell
    resumed under other parameters (a saved checkpoint's own, where an older version used the defaults)
    decodes every prompt again instead of mixing two scalings' answers."""
    from ropescale.evals.tasks.generation import PromptJournal

    one = dict(suite_dict, methods=[{"method": "yarn", "factor": 4}], perplexity=None)
    one["passkey"] = {"lengths": [128], "depths": [0.0, 1.0], "trials": 2}
    real, recorded = _interrupt_after(2, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_suite(suite_from_dict(one), tmp_path, progress=False)
    journal = next((tmp_path / "cells").glob("*.partial.jsonl"))
    head, *rest = journal.read_text().splitlines()
    fingerprint = json.loads(head)["fingerprint"]
    assert fingerprint["scaling"]["method"] == "yarn" and fingerprint["scaling"]["params"]["factor"] == 4.0
    fingerprint["scaling"]["params"]["attention_factor"] = 1.5  # decoded under another attention factor
    journal.write_text("\n".join([json.dumps({"fingerprint": fingerprint}), *rest]) + "\n")
    monkeypatch.undo()
    recorded.clear()
    monkeypatch.setattr(PromptJournal, "record", lambda self, *a: recorded.append(a) or real(self, *a))
    run_suite(suite_from_dict(one), tmp_path, progress=False)
    assert len(recorded) == 4  # all four prompts again, none taken from the other scaling's journal


def test_a_heatmap_takes_the_union_of_its_cells_depths(tmp_path):
    """A cell in progress may have sampled some depths only: each cell is read at its own depths."""
    from ropescale.evals.report.aggregate import _plot_grids
    from ropescale.evals.tasks.task_retrieval import RetrievalCell

    full = {"depths": [0.0, 0.5, 1.0], "accuracy": [[1.0, 0.5, 0.0]]}
    partial = {"depths": [0.5], "accuracy": [[1.0]], "cell_trials": [[2]], "partial": {"prompts": 2, "of": 3}}
    seen = {}

    def fake_plot(lengths, depths, grid, path, title, texts):
        seen.update(lengths=lengths, depths=depths, grid=grid, title=title, texts=texts)
        return path

    import ropescale.evals.tasks.report_cells as report  # where the report's sections and plots are drawn

    real, report.plot_accuracy_grid = report.plot_accuracy_grid, fake_plot
    try:
        cells = {100: RetrievalCell.from_json(full), 200: RetrievalCell.from_json(partial)}  # as the report reads them
        _plot_grids(tmp_path, "passkey", {"m": cells}, ["m"], [100, 200])
    finally:
        report.plot_accuracy_grid = real
    assert seen["depths"] == [0.0, 0.5, 1.0] and seen["title"] == "passkey: m (cells in progress)"
    assert seen["grid"][1] == [0.5, 1.0] and seen["grid"][0][0] == 1.0 and seen["grid"][0][1] != seen["grid"][0][1]
    assert seen["texts"] == [[None, None], [None, "2/2"], [None, None]]  # in progress: what it has, not "1.00"
    from ropescale.plots.grids import plot_accuracy_grid

    png = plot_accuracy_grid(
        [100, 200],
        [0.0, 0.5],
        [[1.0, float("nan")], [0.5, 0.0]],
        tmp_path / "g.png",
        "t",
        [[None, None], ["1/2", None]],
    )
    assert png.read_bytes()[:4] == b"\x89PNG"  # a cell not measured is drawn blank, not as a crash
