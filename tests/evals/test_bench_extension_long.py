"""The issue-41 experiment end to end on a tiny random-init model (L = 256, YaRN ×2 to 512): one command
trains the fine-tune and its control on the same mix (a folder of books with Emma held out, a Python
tree, 40 % short windows, recall sentences), reads both held-out curves, runs the suites and RULER on
the unscaled model, the fine-tune and the control, and judges the goal; killed in the control's
training and again in a RULER cell, the same command resumes without redoing what was finished.

The CLI runs in-process (the same ``ropescale.cli.main``), and the protocol's lengths and prompt counts
are tiny (``make_plan``); everything else is the benchmark as a GPU runs it."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from extension_plan import Plan

from tests.conftest import load_script, tiny_model
from tests.evals.ruler_fixtures import ruler_tokenizer

L = 256
PROSE = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition. "


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_extension.py", "bench_extension_long")


def _recipes(tmp_path, model, books, code) -> str:
    common = {
        "model": {"name": str(model), "attn_implementation": "sdpa"},
        "lora": {"enabled": False},
        "data": {
            "sources": [{"source": str(books), "weight": 0.5}, {"source": f"python:{code}", "weight": 0.5}],
            "holdout": ["Emma"],
            "seq_len": 192,
            "packing": "stream",
            "short_share": 0.4,
            "recall_facts": 1,
            "recall_forms": ["words", "names"],
        },
        "optim": {"lr": 1e-3, "warmup_steps": 1, "schedule": "constant"},
        "train": {"max_steps": 4, "save_every": 2, "keep_checkpoints": 2, "gradient_checkpointing": False},
    }
    tiny = {
        "tiny_long": {"scaling": {"method": "yarn", "factor": 2}, "target": 2 * L},
        "tiny_long_control": {"scaling": {"method": "none", "factor": 1}, "target": L},
    }
    for name, spec in tiny.items():
        n = spec["target"]
        raw = {**common, "scaling": spec["scaling"], "pose": {"enabled": True, "target_length": n, "chunks": 2}}
        raw["eval"] = {"every": 2, "length": n, "max_tokens": n}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "tiny_long.yaml")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    tok = ruler_tokenizer()
    model = tmp_path / "model"
    ids = {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    tiny_model(vocab_size=len(tok), max_position_embeddings=L, attn_implementation="sdpa", **ids).save_pretrained(model)
    tok.save_pretrained(model)
    books = tmp_path / "books"
    books.mkdir()
    (books / "Emma.txt").write_text(PROSE * 60)
    (books / "Bible.txt").write_text("In the beginning God created the heaven and the earth. " * 80)
    code = tmp_path / "code" / "pkg"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("def f(x):\n    return x + 1\n" * 80)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    plan = Plan(
        model=str(model),
        factor=2.0,
        original_context=L,
        ppl_lengths=(64, L, 2 * L),
        passkey_lengths=(L, 2 * L),
        depths=(0.5,),
        trials=1,
        ppl_max_tokens=2 * L,
        data=str(books),
    )
    return _recipes(tmp_path, model, books, code.parent), plan


def test_the_long_experiment_runs_end_to_end_and_resumes(bench, tiny, tmp_path, monkeypatch, capsys):
    import ruler_run

    from ropescale.cli.main import main

    recipe, plan = tiny
    monkeypatch.setattr(bench, "make_plan", lambda factor, jitter: plan)
    calls, kills = [], {"train control": 1, "ruler": 1}

    def ropescale(*args):  # the CLI in-process; killed once at the start of the control's training
        calls.append(args)
        if args[0] == "train" and args[2].endswith("_control.yaml") and kills["train control"]:
            kills["train control"] -= 1
            raise KeyboardInterrupt
        assert main(list(args)) == 0

    cell = ruler_run.run_ruler_cell

    def killed_cell(*args, **kwargs):  # killed once, in the second RULER cell
        done = list((tmp_path / "out" / "ruler").rglob("cells/*.json"))
        if done and kills["ruler"]:
            kills["ruler"] -= 1
            raise KeyboardInterrupt
        return cell(*args, **kwargs)

    monkeypatch.setattr(bench, "ropescale", ropescale)
    monkeypatch.setattr(ruler_run, "run_ruler_cell", killed_cell)
    argv = ["--recipe", recipe, "--output", str(tmp_path / "out"), "--skip-curve"]
    argv += ["--ruler-tasks", "niah_single_1", "--ruler-samples", "1"]
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    assert [c[:3] for c in calls] == [
        ("train", "--config", recipe),
        ("export", str(tmp_path / "out" / "yarn"), "--output"),
        ("train", "--config", recipe.replace("tiny_long", "tiny_long_control")),  # killed here
    ]
    calls.clear()
    with pytest.raises(KeyboardInterrupt):  # the control trains; the fine-tune is not trained again
        bench.main(argv)
    assert [c[0] for c in calls] == ["train", "export"] and calls[0][2].endswith("tiny_long_control.yaml")
    first = {p: p.read_bytes() for p in (tmp_path / "out" / "ruler").rglob("cells/*.json")}
    assert len(first) == 1
    calls.clear()
    assert bench.main(argv) == 0  # finishes: nothing trained again, the finished RULER cell kept
    assert calls == [] and all(p.read_bytes() == b for p, b in first.items())
    out = tmp_path / "out"
    cells = sorted(p.relative_to(out).as_posix() for p in (out / "ruler").rglob("cells/*.json"))
    assert cells == [
        "ruler/control/cells/none__niah_single_1__256.json",
        "ruler/none/cells/none__niah_single_1__256.json",
        "ruler/yarn/cells/as-saved__niah_single_1__256.json",
        "ruler/yarn/cells/as-saved__niah_single_1__512.json",
    ]
    report = (out / "report.md").read_text()
    # both held-out curves, at the fine-tune's target and the control's L, every eval.every steps
    assert "- fine-tuned yarn: 2: " in report and "- control: 2: " in report and ", 4: " in report
    goal = json.loads((out / "goal.json").read_text())
    assert [g["part"] for g in goal][:3] == [
        "PPL at 512 ≤ 1.01 × control's PPL(256)",
        "PPL(64) ≤ 1.01 × control's",
        "RULER mean at 512 ≥ the unscaled model's at 256",
    ]
    assert all(g["status"] != "not measured yet" for g in goal), goal  # every part measured, met or not
    capsys.readouterr()
    assert bench.main([*argv, "--report-only"]) == 0 and "Goal of issue 41" in capsys.readouterr().out


def test_a_recipe_and_factor_that_disagree_or_a_bad_ruler_task_stop_before_training(
    bench, tmp_path, monkeypatch, capsys
):
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    for argv, said in (
        (["--recipe", "smollm2-135m/yarn_x4_long", "--factor", "8"], "scaling.factor 4, --factor 8 asked"),
        (["--recipe", "smollm2-135m/yarn_x4_long", "--ruler-tasks", "niah_single_2"], "--ruler-tasks: RULER task"),
    ):
        with pytest.raises(SystemExit) as stop:
            bench.main([*argv, "--output", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert ran == []
    assert bench.recipes_for(8, "smollm2-135m/yarn_x8_long") == {
        "fine-tuned yarn": "smollm2-135m/yarn_x8_long",
        "control": "smollm2-135m/yarn_x4_long_control",
    }
    assert bench.recipes_for(4, "/r/tiny.yaml")["control"] == "/r/tiny_control.yaml"


def test_the_gpu_script_estimates_its_time_and_names_a_missing_source_before_running(tmp_path, monkeypatch, capsys):
    gpu = load_script("benchmarks/gpu_extension_long.py")
    assert gpu.ruler_prompts(4) == 6 * 30 * (3 + 2) and gpu.ruler_prompts(8) == 6 * 30 * (4 + 2)
    assert gpu.main(["--estimate", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "x4: expected ~22 min" in out and "x8: expected ~26 min" in out and "total: ~48 min" in out
    import ropescale.data.sources as sources

    monkeypatch.setattr(sources, "describe_source", lambda spec: {"bytes": None, "note": "not installed: X"})
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--factors", "4", "--output", str(tmp_path)])
    assert "smollm2-135m/yarn_x4_long: source python:stdlib: not installed: X" in str(stop.value.code)
    assert not list(tmp_path.iterdir())  # nothing ran


def test_the_shipped_pairs_commands_run_no_ruler_unless_asked(bench, tmp_path, monkeypatch):
    """The evidence files' commands (no --recipe) resume as they ran; --ruler-tasks or --recipe adds RULER."""
    import extension_ruler

    import ropescale.evals.suite.runner as suite

    monkeypatch.setattr(bench, "check_recipes", lambda *a, **k: None)
    monkeypatch.setattr(bench, "train_and_export", lambda out, *a, **k: bench.export_dirs(out))
    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: None)
    asked = []
    monkeypatch.setattr(extension_ruler, "ruler_runs", lambda *a, **k: asked.append(a[4]) or {})
    assert bench.main(["--output", str(tmp_path / "a"), "--skip-curve"]) == 0 and asked == []
    assert bench.main(["--output", str(tmp_path / "b"), "--skip-curve", "--ruler-tasks", "vt"]) == 0
    assert bench.main(["--output", str(tmp_path / "c"), "--skip-curve", "--recipe", "smollm2-135m/yarn_x4_long"]) == 0
    assert (
        bench.main(
            ["--output", str(tmp_path / "d"), "--recipe", "smollm2-135m/yarn_x4", "--skip-ruler", "--skip-curve"]
        )
        == 0
    )
    assert asked == [["vt"], list(extension_ruler.BATTERY)]


def _base_cell(folder, task: str, length: int, correct: int, samples: int = 30) -> None:
    """An unscaled model's RULER cell file as ``ropescale eval ruler`` writes it, in a shipped folder's
    layout (evals/measured/ruler/*/: the files without the run's ``cells/``)."""
    from ropescale.evals.tasks.ruler.cell import RulerCell, RulerRecord
    from ropescale.evals.tasks.ruler.record import CellFingerprint, CellRecord, Scaling

    cell = RulerCell(task, length, samples, 0, 128, task, "-")
    cell.records = [
        RulerRecord(i, length, ["1"], "1" if i < correct else "", float(i < correct)) for i in range(samples)
    ]
    scaling = Scaling("none")
    fingerprint = CellFingerprint("smollm2-135m", scaling, task, length, samples, 0, {"device": "cpu"})
    record = CellRecord(fingerprint, "none", True, {}, None, "0.4.13", {"device": "cpu"}, 8192, cell)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"none__{task}__{length}.json").write_text(json.dumps(record.to_json()))


def test_the_gpu_script_leaves_out_the_tasks_the_unscaled_model_cannot_do(tmp_path, monkeypatch, capsys):
    gpu = load_script("benchmarks/gpu_extension_long.py")
    cells = tmp_path / "base"
    _base_cell(cells, "niah_single_1", 4096, 30)
    _base_cell(cells, "niah_multikey_2", 4096, 2)  # 2/30 at 4k and 4/30 at 8k: mean 0.1 < 0.3
    _base_cell(cells, "niah_multikey_2", 8192, 4)
    _base_cell(cells, "vt", 4096, 9)  # exactly 0.3: kept
    _base_cell(cells, "fwe", 16384, 0)  # beyond L only: says nothing about <= L, kept
    _base_cell(cells, "niah_single_2[austen]", 4096, 29)  # a task beyond the six, measured: a candidate
    _base_cell(cells, "niah_single_3[austen]", 4096, 2)  # ... and one beyond the model
    tasks, beyond = gpu.countable_tasks(cells)
    assert tasks == ["niah_single_1", "niah_multikey_3", "vt", "cwe", "fwe", "niah_single_2[austen]"]
    assert sorted(beyond) == ["niah_multikey_2", "niah_single_3[austen]"]
    assert beyond["niah_multikey_2"] == pytest.approx(0.1)
    monkeypatch.setattr(gpu, "BASE_CELLS", cells)
    assert gpu.main(["--estimate", "--factors", "4"]) == 0
    out = capsys.readouterr().out
    assert "RULER niah_multikey_2: not run (the unscaled model scores 10% at <= L" in out
    assert f"({6 * 30 * 5} RULER prompts)" in out
    assert gpu.main(["--estimate", "--factors", "4", "--ruler-tasks", "all"]) == 0
    assert f"({6 * 30 * 5} RULER prompts)" in capsys.readouterr().out
    ran = []
    monkeypatch.setattr(gpu, "preflight", lambda factors: None)
    monkeypatch.setitem(sys.modules, "bench_extension", type(sys)("bench_extension"))
    sys.modules["bench_extension"].main = lambda argv: ran.append(argv) or 0
    assert gpu.main(["--factors", "4", "--output", str(tmp_path / "out")]) == 0
    assert ran[0][ran[0].index("--ruler-tasks") + 1] == "niah_single_1,niah_multikey_3,vt,cwe,fwe,niah_single_2[austen]"
