"""Issue 54's CPU fine-tune end to end on a tiny random-init model (L = 256, YaRN ×2 to 512): one command
trains the recipe and its control, measures perplexity and RULER's countable tasks, judges the goal and the
convergence of both held-out curves, and commits its evidence as it goes (cells, training logs with the load
average, report, goal, the evidence file ``recommend`` reads); killed in the control's training it resumes
without retraining the recipe, and a checkout whose run folder lost its cells resumes them from the
committed ones instead of measuring them again.

The CLI runs in-process; lengths and prompt counts are tiny (``make_plan``, ``--samples 1``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest
import yaml
from extension_plan import Plan

from tests.conftest import REPO, load_script, tiny_model
from tests.evals.ruler_fixtures import ruler_tokenizer

L = 256
PROSE = "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition. "


@pytest.fixture(scope="module")
def driver():
    return load_script("benchmarks/cpu_finetune_x2.py", "cpu_finetune_x2")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    tok = ruler_tokenizer()
    model = tmp_path / "model"
    ids = {k: getattr(tok, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    tiny_model(vocab_size=len(tok), max_position_embeddings=L, attn_implementation="sdpa", **ids).save_pretrained(model)
    tok.save_pretrained(model)
    books = tmp_path / "books"
    books.mkdir()
    (books / "Emma.txt").write_text(PROSE * 150)
    (books / "Bible.txt").write_text("In the beginning God created the heaven and the earth. " * 80)
    code = tmp_path / "code" / "pkg"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("def f(x):\n    return x + 1\n" * 80)
    common = {
        "model": {"name": str(model), "attn_implementation": "sdpa"},
        "lora": {"enabled": False},
        "data": {
            "sources": [{"source": str(books), "weight": 0.5}, {"source": f"python:{code.parent}", "weight": 0.5}],
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
    for name, scaling, n in (
        ("tiny_cpu", {"method": "yarn", "factor": 2}, 2 * L),
        ("tiny_cpu_control", {"method": "none", "factor": 1}, L),
    ):
        raw = {**common, "scaling": scaling, "pose": {"enabled": True, "target_length": n, "chunks": 2}}
        raw["eval"] = {"every": 2, "length": n, "max_tokens": 3 * n}  # 3 windows: the paired noise rule
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    plan = Plan(
        model=str(model),
        factor=2.0,
        original_context=L,
        ppl_lengths=(64, L, 2 * L),
        passkey_lengths=(L, 2 * L),
        ppl_max_tokens=2 * 2 * L,
        data=str(books),
    )
    return tmp_path, plan


def test_the_cpu_fine_tune_runs_end_to_end_resumes_and_ships_its_evidence(driver, tiny, monkeypatch, capsys):
    import ruler_run

    from ropescale.cli.main import main
    from ropescale.evals.advice.evidence import load_measured

    tmp, plan = tiny
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    calls, kills = [], {"control": 1}

    def cli(*args, env=None):  # the CLI in-process; killed once at the start of the control's training
        calls.append(args)
        if args[0] == "train" and args[2].endswith("_control.yaml") and kills["control"]:
            kills["control"] -= 1
            raise KeyboardInterrupt
        with mock.patch.dict(os.environ, env or {}):
            assert main(list(args)) == 0

    monkeypatch.setattr(driver, "ropescale", cli)
    monkeypatch.setenv("ROPESCALE_FUSED_LOSS", "1")  # the first trainings take the opt-in path; the retrain is told
    out, ship, evidence = tmp / "out", tmp / "ship", tmp / "evidence.json"
    argv = ["--recipe", str(tmp / "tiny_cpu.yaml"), "--control", str(tmp / "tiny_cpu_control.yaml")]
    argv += ["--output", str(out), "--ship", str(ship), "--evidence", str(evidence), "--samples", "1"]
    argv += ["--base-cells", str(tmp / "none-shipped"), "--base-length", str(L)]
    argv += ["--tasks", "niah_single_1,niah_single_2[austen]"]  # the multi-needle ones do not fit in 256 tokens
    with pytest.raises(KeyboardInterrupt):
        driver.main(argv)
    assert [c[0] for c in calls] == ["train", "export", "train"]
    # the recipe's training log is committed at once, every line with the load average it ran under
    log = [json.loads(x) for x in (ship / "yarn-metrics.jsonl").read_text().splitlines()]
    assert log and all("load_avg" in rec for rec in log) and [r["step"] for r in log if "eval_ppl" in r] == [2, 4]
    assert all(r["head_loss"] == "fused" for r in log if "loss" in r)
    assert all(len(r["eval_window_nll"]) == 3 for r in log if "eval_ppl" in r)
    calls.clear()
    assert driver.main(argv) == 0  # the control trains; the recipe is not trained again
    assert [c[0] for c in calls] == ["train", "export"] and calls[0][2].endswith("tiny_cpu_control.yaml")
    for suite in ("base", "finetuned", "control"):
        cells = sorted((ship / "cells" / suite).glob("*.json"))
        assert cells and all("load_avg" in json.loads(p.read_text()) for p in cells), suite
    ruler = sorted(p.relative_to(ship).as_posix() for p in (ship / "ruler").rglob("*.json"))
    assert (
        len(ruler) == 4 and sum(p.startswith("ruler/yarn/as-saved__") and p.endswith("__512.json") for p in ruler) == 2
    )
    assert all("load_avg" in json.loads((ship / p).read_text())["cell"] for p in ruler)
    goal = json.loads((ship / "goal.json").read_text())
    assert [g["part"] for g in goal] == [
        "PPL(512) ≤ 1.01 × control's PPL(256)",
        "PPL at ≤ 256 keeps ≥ 98.5 % of the unscaled model's",
        "PPL at ≤ 256 keeps ≥ 98.5 % of the control's (adaptation to the text removed)",
        "RULER mean of 2 tasks at 512 ≥ 85 % of the unscaled model's at 256",
        "held-out curves flat at their last point (a fall beyond 0.25 % per 40 steps excluded)",
    ]
    assert goal[3]["status"] == "in progress"  # 1 prompt a cell, not the 30 the goal asks
    assert all(g["status"] != "not measured yet" for g in goal), goal
    report = (ship / "report.md").read_text()
    assert "goal: " in report and "- fine-tuned yarn: 2: " in report and "(load " in report
    ev = load_measured(evidence)
    # the evidence file carries the convergence verdict: recommend says it beside the numbers
    assert (goal[4]["status"] == "not converged") == ev.status.startswith("not converged: the "), ev.status
    if goal[4]["status"] == "met":  # converged, its RULER part on 1 prompt: the evidence says it is in progress
        assert ev.status.startswith("in progress: RULER mean of 2 tasks at 512"), ev.status
    ft = next(r for r in ev.rows if r.label == "fine-tuned yarn")
    assert ev.budget == "fine-tune" and ft.factor == 2.0 and sorted(ft.ppl) == [64, L, 2 * L]
    assert {r.label for r in ev.rows} == {"none", "yarn", "fine-tuned yarn", "control"}
    # recommend --budget fine-tune reads it where the shipped evidence lives, and says it has no passkey cells
    import ropescale.evals.advice.battery_evidence  # noqa: F401 - its BATTERY_DIR bound before the patch below
    import ropescale.evals.advice.evidence as evidence_module

    measured = tmp / "measured"
    measured.mkdir()
    shipped = json.loads(evidence.read_text())  # as the embedded model's: the tiny one has no recommend rules
    (measured / "tiny-finetune-cpu-x2.json").write_text(json.dumps({**shipped, "model": "smollm2-135m"}))
    monkeypatch.setattr(evidence_module, "MEASURED_DIR", measured)
    evidence_module.shipped_evidence.cache_clear()
    capsys.readouterr()
    try:
        code = main(["recommend", "--target-length", "16384", "--budget", "fine-tune", "--verbose"])
    finally:
        evidence_module.shipped_evidence.cache_clear()
    said, err = capsys.readouterr()
    assert code == 0, err
    assert "(evals/measured/tiny-finetune-cpu-x2.json)" in said and "fine-tuned YaRN ×2 PPL" in said, said
    assert "no passkey cells" in said, said

    # a checkout whose run folder lost its cells resumes them from the committed ones: nothing is measured again
    shutil.rmtree(out / "ruler")
    for suite in ("base", "finetuned", "control"):
        shutil.rmtree(out / suite / "cells")
    calls.clear()
    monkeypatch.setattr(ruler_run, "run_ruler_cell", lambda *a, **k: pytest.fail("a committed RULER cell recomputed"))
    import ropescale.evals.suite.runner as suite_module

    ran = []
    real = suite_module.SuiteRunner._run_cell
    monkeypatch.setattr(suite_module.SuiteRunner, "_run_cell", lambda *a, **k: ran.append(a[3:]) or real(*a, **k))
    capsys.readouterr()
    assert driver.main(argv) == 0
    committed = len(list((ship / "cells").rglob("*.json"))) + len(ruler)
    assert calls == [] and ran == [] and f"resumed {committed} committed cells" in capsys.readouterr().out

    # a fresh checkout: runs/ gone whole (checkpoints, exports, logs), only what was committed is left
    report = (ship / "report.md").read_text()
    shutil.rmtree(out)
    assert driver.main([*argv, "--report-only"]) == 0  # curves from the committed logs, rows from the cells
    assert (ship / "report.md").read_text() == report
    assert "Command: `ROPESCALE_FUSED_LOSS=1 python benchmarks/cpu_finetune_x2.py --factor 2 --output " in report
    # the fine-tune's RULER cells not committed: its model is needed again, its control's is not
    monkeypatch.undo()  # the real runners again; the tiny plan and in-process CLI once more
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    monkeypatch.setattr(driver, "ropescale", cli)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    cells = [next((ship / "ruler" / "yarn").glob(f"as-saved__{t}*.json")) for t in ("niah_single_1", "niah_single_2")]
    for cell in cells:
        cell.unlink()
    shutil.rmtree(out)
    calls.clear()
    capsys.readouterr()
    assert driver.main([*argv, "--dry-run"]) == 0 and calls == []  # what it would do, nothing run
    said = capsys.readouterr().out
    # the environment no longer asks for the fused head loss: the retrain takes it from the committed log
    assert "ROPESCALE_FUSED_LOSS" not in os.environ
    retrained = "to retrain with eval.every=4 and ROPESCALE_FUSED_LOSS=1 as its log's steps"
    assert f"fine-tuned yarn: {retrained} ({tmp / 'tiny_cpu.yaml'}, as the recipe says); to " in said, said
    names = ", ".join(c.name for c in cells)
    assert f"to measure: {names}\ncontrol: every cell committed; not trained" in said, said
    # the sitting ends inside the second cell, one prompt journaled: the first cell and the journal are committed
    real_cell = ruler_run.run_ruler_cell

    def cut_in_the_second(*args, **kwargs):
        if args[2].name == "niah_single_1":
            return real_cell(*args, **kwargs)
        assert cells[0].is_file()  # committed when written, before the next cell begins (a kill skips `finally`)
        journal = kwargs["journal"]
        journal.path.write_text(json.dumps({"fingerprint": journal.fingerprint}) + "\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(ruler_run, "run_ruler_cell", cut_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        driver.main(argv)
    kept = ship / "ruler" / "yarn" / "in-progress" / cells[1].name.replace(".json", ".partial.jsonl")
    assert cells[0].is_file() and not cells[1].is_file() and kept.is_file()
    monkeypatch.setattr(ruler_run, "run_ruler_cell", real_cell)
    assert driver.main(argv) == 0
    # only the fine-tune was trained again (the control's cells are all committed), held-out at its last step only
    assert [c[:3] for c in calls] == [("train", "--config", str(tmp / "tiny_cpu.yaml")), ("export",) + calls[1][1:3]]
    assert calls[0][-1] == "eval.every=4" and cells[1].is_file()
    assert not kept.exists() and not kept.parent.exists()  # the cell is written: its journal is gone
    retrain = [json.loads(x) for x in (ship / "yarn-metrics-retrain.jsonl").read_text().splitlines()]
    assert [r["step"] for r in retrain if "eval_ppl" in r] == [4]
    assert all(r["head_loss"] == "fused" for r in retrain if "loss" in r)  # the first run's path, not the default
    assert [r["step"] for r in log if "eval_ppl" in r] == [2, 4]  # the first run's curve is kept as it was
    said = (ship / "report.md").read_text()
    assert "- fine-tuned yarn: retrained in a later sitting" in said and "loss equal at 4 of 4 steps" in said
    assert "the same weights as the committed curve's" in said, said


def test_the_recipes_state_their_cpu_hours_and_the_arithmetic_holds():
    """Every recipe of the embedded model states its CPU hours on 2 cores alone (issue 54), as an estimate
    until measured; where it states its steps, they are the recipe's (max_steps x batch x grad_accum x
    seq_len tokens) and the hours at least their time at 172 tokens/s, or, where measured, the seconds it
    states; the CPU recipes stay within ~3 h."""
    import re

    from ropescale.training.config import CONFIGS_DIR, load_config

    paths = sorted((CONFIGS_DIR / "smollm2-135m").glob("*.yaml"))
    assert {"yarn_x2_cpu.yaml", "yarn_x2_cpu_control.yaml", "yarn_x4_cpu.yaml"} <= {p.name for p in paths}
    pattern = r"CPU hours \(2 cores, alone\): ~([\d.]+) estimated, not yet measured alone: (\d+) steps x ([\d,]+)"
    timed = (
        r"CPU hours \(2 cores, alone\): ~([\d.]+) measured alone on [^:]*: (\d+) steps x ([\d,]+) tokens in ([\d,]+) s"
    )
    for path in paths:
        head = path.read_text().split("\nmodel:")[0]
        assert "# CPU hours (2 cores, alone): ~" in head, path.name
        c = load_config(path)
        flat = re.sub(r"\n#\s*", " ", head)  # a statement wrapped over comment lines, as one line
        if t := re.search(timed, flat):  # a measured time: the hours are its seconds, the steps the recipe's
            steps, tokens = int(t.group(2)), int(t.group(3).replace(",", ""))
            assert steps == c.train.max_steps and tokens == c.train.batch_size * c.train.grad_accum * c.data.seq_len
            assert abs(int(t.group(4).replace(",", "")) / 3600 - float(t.group(1))) <= 0.05, path.name
            continue
        m = re.search(pattern, head)
        if m is None:
            continue
        steps, tokens = int(m.group(2)), int(m.group(3).replace(",", ""))
        assert steps == c.train.max_steps and tokens == c.train.batch_size * c.train.grad_accum * c.data.seq_len
        assert steps * tokens / 172 / 3600 <= float(m.group(1)) + 0.05, path.name
        if "_cpu" in path.name:
            assert float(m.group(1)) <= 3.0, path.name


def test_x4_reuses_the_x2_control_and_trains_only_its_own_recipe(driver, tiny, monkeypatch):
    """--control-from: the control (the same at every factor) is read from the x2 experiment's folder,
    trained there if not yet, never again under the x4 output; the suites and curves use it."""
    import bench_extension as bx
    import ruler_run

    import ropescale.evals.suite.runner as suite_module

    tmp, plan = tiny
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    calls, suites = [], {}
    monkeypatch.setattr(driver, "ropescale", lambda *args, env=None: calls.append(args))
    monkeypatch.setattr(bx, "trained", lambda run, recipe: run.parent.name == "x2")  # x2's control is trained

    def suite_ran(suite, out):
        suites.update({out.name: suite.model})
        calls.append(("suite", out.name))

    monkeypatch.setattr(suite_module, "run_suite", suite_ran)
    monkeypatch.setattr(ruler_run.RulerRun, "run", lambda self: None)
    (tmp / "x2" / "control-export").mkdir(parents=True)
    (tmp / "x2" / "control-export" / "config.json").write_text("{}")
    argv = ["--recipe", str(tmp / "tiny_cpu.yaml"), "--control", str(tmp / "tiny_cpu_control.yaml")]
    argv += ["--output", str(tmp / "x4"), "--control-from", str(tmp / "x2"), "--ship", str(tmp / "ship")]
    argv += ["--evidence", str(tmp / "ev.json"), "--base-cells", str(tmp / "none"), "--tasks", "niah_single_1"]
    assert driver.main(argv) == 0
    assert [c[:3] for c in calls] == [  # the trained control's cells first, then the hours of training
        ("suite", "control"),
        ("train", "--config", str(tmp / "tiny_cpu.yaml")),
        ("export", str(tmp / "x4" / "yarn"), "--output"),
        ("suite", "finetuned"),
        ("suite", "base"),
    ]
    assert suites["control"] == str(tmp / "x2" / "control-export")
    assert suites["finetuned"] == str(tmp / "x4" / "yarn-export")


def test_x4_retrains_the_x2_control_as_the_x2_experiments_log_says(driver, tiny, monkeypatch, capsys):
    """--control-from in a fresh checkout: the control's first log is committed with the x2 experiment's
    evidence (--control-ship), not the x4's. The control is retrained as that log says (the held-out text
    at the last step only, the fused head loss its steps took), its retrain log goes beside that first
    log, and the x4 report reads the control's curve from there. Before, the x4 run looked in its own
    folder, found no log, and trained the control anew (16 held-out evaluations, the caller's head loss)."""
    import bench_extension as bx
    import ruler_run

    import ropescale.evals.suite.runner as suite_module

    tmp, plan = tiny
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    calls = []

    def cli(*args, env=None):
        calls.append((args, env))
        if args[0] == "train":  # a retrain logs its steps and its last held-out point
            run = Path(args[args.index("--output-dir") + 1])
            run.mkdir(parents=True, exist_ok=True)
            (run / "metrics.jsonl").write_text(json.dumps({"step": 4, "loss": 1.0, "head_loss": "fused"}) + "\n")

    monkeypatch.setattr(driver, "ropescale", cli)
    monkeypatch.setattr(bx, "trained", lambda run, recipe: run.parent.name == "x4")  # only x4's own is trained
    monkeypatch.setattr(suite_module, "run_suite", lambda suite, out: None)
    monkeypatch.setattr(ruler_run.RulerRun, "run", lambda self: None)
    theirs = tmp / "x2-ship"
    theirs.mkdir()
    steps = [{"step": i, "loss": 1.0, "head_loss": "fused"} for i in range(1, 5)]
    held = [{"step": i, "eval_length": L, "eval_ppl": 9.0 - i, "eval_window_nll": [2.0, 2.1, 2.2]} for i in (2, 4)]
    (theirs / "control-metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps + held))
    argv = ["--recipe", str(tmp / "tiny_cpu.yaml"), "--control", str(tmp / "tiny_cpu_control.yaml")]
    argv += ["--output", str(tmp / "x4"), "--control-from", str(tmp / "x2"), "--ship", str(tmp / "ship")]
    argv += ["--control-ship", str(theirs), "--evidence", str(tmp / "ev.json"), "--base-cells", str(tmp / "none")]
    argv += ["--tasks", "niah_single_1"]
    assert driver.main([*argv, "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "control: to retrain with eval.every=4 and ROPESCALE_FUSED_LOSS=1 as its log's steps" in said, said
    assert driver.main(argv) == 0
    (args, env), *_ = [c for c in calls if c[0][0] == "train"]
    assert args[2] == str(tmp / "tiny_cpu_control.yaml") and args[-1] == "eval.every=4"
    assert env == {"ROPESCALE_FUSED_LOSS": "1"}
    assert (theirs / "control-metrics-retrain.jsonl").is_file()  # beside the first log, which is kept
    assert not list((tmp / "ship").glob("control-metrics*"))
    report = (tmp / "ship" / "report.md").read_text()
    assert "- control: 2: 7.000" in report  # the curve, from the x2 experiment's committed log


def test_the_controls_log_folder_defaults_to_the_earlier_experiments(driver, tmp_path):
    """Without --control-ship, the control of --control-from runs/<name> keeps its log in the committed
    evals/measured/finetune-<name>, where that folder exists (the x2 pair's, for the x4 run); else with
    this run's own evidence. The fine-tune's always goes with this run's."""
    import argparse

    from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED

    ship = tmp_path / "ship"
    args = argparse.Namespace(control_ship=None, control_from="runs/cpu-x2-640steps")
    logs = driver.log_ships(args, ship)
    assert logs[CONTROL] == driver.ROOT / "evals" / "measured" / "finetune-cpu-x2-640steps" and logs[FINE_TUNED] == ship
    assert (logs[CONTROL] / "control-metrics.jsonl").is_file()  # the committed first log the x4 run retrains from
    args.control_from = str(tmp_path / "nothing-committed")
    assert driver.log_ships(args, ship)[CONTROL] == ship
    args.control_ship = str(tmp_path / "given")
    assert driver.log_ships(args, ship)[CONTROL] == tmp_path / "given"
    assert driver.log_ships(argparse.Namespace(control_ship=None, control_from=None), ship)[CONTROL] == ship


def test_a_task_that_is_not_rulers_stops_before_anything_trains(driver, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(driver, "ropescale", lambda *args, env=None: calls.append(args))
    with pytest.raises(SystemExit) as stop:
        driver.main(["--output", str(tmp_path / "x"), "--ship", str(tmp_path / "s"), "--tasks", "niah_single_9"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("cpu_finetune_x2: --tasks: ") and len(err.strip().splitlines()) == 1
    assert calls == [] and not (tmp_path / "x").exists()


def test_steps_trains_both_recipes_longer_in_folders_of_their_own(driver, tiny, monkeypatch, capsys):
    """--steps N (a run that did not converge, trained again longer): the recipe and its control both train
    with train.max_steps=N (a control trained less would leave the extra adaptation in the comparison), the
    default output is named -<N>steps, and the report's command says --steps."""
    import bench_extension as bx
    import ruler_run

    import ropescale.evals.suite.runner as suite_module

    tmp, plan = tiny
    monkeypatch.chdir(tmp)
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    calls = []
    monkeypatch.setattr(driver, "ropescale", lambda *args, env=None: calls.append(args))
    monkeypatch.setattr(bx, "trained", lambda run, recipe: False)
    monkeypatch.setattr(suite_module, "run_suite", lambda suite, out: None)
    monkeypatch.setattr(ruler_run.RulerRun, "run", lambda self: None)
    argv = ["--recipe", str(tmp / "tiny_cpu.yaml"), "--control", str(tmp / "tiny_cpu_control.yaml"), "--steps", "6"]
    argv += ["--ship", str(tmp / "ship"), "--evidence", str(tmp / "ev.json"), "--base-cells", str(tmp / "none")]
    assert driver.main([*argv, "--tasks", "niah_single_1"]) == 0
    trains = [c for c in calls if c[0] == "train"]
    assert [c[2] for c in trains] == [str(tmp / "tiny_cpu.yaml"), str(tmp / "tiny_cpu_control.yaml")]
    assert all(c[-1] == "train.max_steps=6" for c in trains)
    assert {c[4] for c in trains} == {"runs/cpu-x2-6steps/yarn", "runs/cpu-x2-6steps/control"}
    assert "Command: `python benchmarks/cpu_finetune_x2.py --factor 2 --steps 6 --output runs/cpu-x2-6steps`" in (
        (tmp / "ship" / "report.md").read_text()
    )


def test_steps_refuses_a_control_trained_with_the_recipes_own(driver, tiny, monkeypatch, capsys):
    """--steps N with --control-from a folder whose control trained the recipe's steps: refused in one line
    before anything trains (its cells would stand beside a fine-tune trained longer)."""
    tmp, plan = tiny
    monkeypatch.setattr(driver, "make_plan", lambda factor: plan)
    calls = []
    monkeypatch.setattr(driver, "ropescale", lambda *args, env=None: calls.append(args))
    control = tmp / "x2" / "control"
    control.mkdir(parents=True)
    shutil.copy(tmp / "tiny_cpu_control.yaml", control / "config.yaml")  # trained with max_steps 4
    argv = ["--recipe", str(tmp / "tiny_cpu.yaml"), "--control", str(tmp / "tiny_cpu_control.yaml"), "--steps", "6"]
    argv += ["--output", str(tmp / "long"), "--control-from", str(tmp / "x2"), "--ship", str(tmp / "ship")]
    with pytest.raises(SystemExit) as stop:
        driver.main([*argv, "--evidence", str(tmp / "ev.json"), "--tasks", "niah_single_1"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert str(control / "config.yaml") in err and "max_steps" in err
    assert calls == []


def _shipped_x2() -> dict:
    """The shipped evidence file of the ×2 CPU fine-tune, as JSON."""
    from ropescale.evals.advice.evidence import MEASURED_DIR

    return json.loads((MEASURED_DIR / "smollm2-135m-finetune-cpu-x2.json").read_text())


def _recommend_with(evidence: dict, folder, monkeypatch, capsys) -> str:
    """``ropescale recommend --target-length 16384 --budget fine-tune``'s output with ``evidence`` as the
    only shipped evidence file (in ``folder``, which the test owns)."""
    import ropescale.evals.advice.battery_evidence  # noqa: F401 - its BATTERY_DIR bound before the patch below
    import ropescale.evals.advice.evidence as evidence_module
    from ropescale.cli.main import main

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "smollm2-135m-finetune-cpu-x2.json").write_text(json.dumps(evidence))
    monkeypatch.setattr(evidence_module, "MEASURED_DIR", folder)
    evidence_module.shipped_evidence.cache_clear()
    try:
        code = main(["recommend", "--target-length", "16384", "--budget", "fine-tune"])
    finally:
        evidence_module.shipped_evidence.cache_clear()
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_a_run_that_did_not_converge_is_said_wherever_its_numbers_are_quoted(tmp_path, monkeypatch, capsys):
    """The evidence file's ``status`` (written by the driver from the held-out curves) reaches recommend's
    short answer as its first caveat; a merge takes the newest run's status, and none removes it."""
    from ropescale.evals.advice.evidence import merge_shipped

    shipped = _shipped_x2()
    shipped.pop("status", None)
    status = "not converged: the fine-tuned yarn held-out curve may still fall at step 320 (25.52 at step 280, 25.45)"
    out = _recommend_with({**shipped, "status": status}, tmp_path, monkeypatch, capsys)
    caveats = out[out.index("\ncaveat:") :]
    assert " ".join(caveats.split()).startswith(f"caveat: the measured run: {status}"), out
    assert merge_shipped({**shipped, "status": status}, shipped)[0].get("status") is None
    assert merge_shipped(shipped, {**shipped, "status": status})[0]["status"] == status


def test_the_training_free_cells_beside_it_are_read_in_either_layout(driver, tmp_path):
    """The shipped battery folder holds cells of both layouts: one file per task (an earlier ropescale) and
    the suite runner's (``ropescale eval ruler`` now: every task of a length in one file). Both are listed
    beside the fine-tune, as a score on its prompts (a multi-value task scores a share of its values)."""
    from tests.conftest import REPO

    cell = json.loads((REPO / "tests/data/suite_cells/ruler/none__ruler__1024.json").read_text())
    (tmp_path / "none__ruler__1024.json").write_text(json.dumps(cell))  # unscaled: the base, not listed
    (tmp_path / "yarn-x4__ruler__1024.json").write_text(
        json.dumps({**cell, "method": "yarn", "factor": 4.0, "method_name": "yarn"})
    )
    assert driver.free_lines(tmp_path, 1024, ("niah_single_1", "fwe")) == [
        f"- yarn fwe 1k: 0.0 on 1 ({tmp_path.name})",
        f"- yarn niah_single_1 1k: 0.0 on 1 ({tmp_path.name})",
    ]


def test_its_retrieval_on_ruler_is_quoted_by_recommend(tmp_path, monkeypatch, capsys):
    """The evidence file's ``retrieval`` (written by the driver from the RULER cells: the fine-tune's share of
    the unscaled base with its interval, and its scaling untrained on the same prompts) is recommend's
    ``retrieval:`` line; without it the line says where retrieval was measured. A merge takes the newest."""
    from ropescale.evals.advice.evidence import merge_shipped

    shipped = _shipped_x2()
    shipped.pop("retrieval", None)
    said = "RULER's 4 countable tasks at 16k: 89 % of the unscaled model's score at 4k (goal ≥ 85 %)"
    lines = {}
    for name, data in (("with", {**shipped, "retrieval": said}), ("without", shipped)):
        out = _recommend_with(data, tmp_path / name, monkeypatch, capsys)
        lines[name] = " ".join(out[out.index("\nretrieval:") : out.index("\nbattery:")].split())
    assert lines["with"].startswith(f"retrieval: {said}"), lines
    assert "retrieval measured on RULER's tasks, in its report" in lines["without"]
    assert merge_shipped({**shipped, "retrieval": said}, shipped)[0].get("retrieval") is None
    assert merge_shipped(shipped, {**shipped, "retrieval": said})[0]["retrieval"] == said


def test_the_retrieval_line_gives_the_share_its_interval_and_the_untrained_scaling():
    from tests.conftest import load_script

    goal = load_script("benchmarks/extension_cpu_goal.py")
    tasks = ("a", "b")
    ft = {"a": {16384: (0.9, 10, [1.0] * 9 + [0.0])}, "b": {16384: (0.5, 10, [1.0] * 5 + [0.0] * 5)}}
    base = {"a": {4096: (1.0, 10, [1.0] * 10)}, "b": {4096: (0.6, 10, [1.0] * 6 + [0.0] * 4)}}
    free = {"a": {16384: (0.6, 10)}, "b": {16384: (0.2, 10)}}
    line = goal.retrieval_line(ft, base, free, 16384, "yarn ×2", tasks, 4096)
    assert line.startswith("RULER's 2 countable tasks at 16k: 88 % of the unscaled model's score at 4k (70.0 vs 80.0")
    assert ", 95 % [" in line and line.endswith("; goal ≥ 85 %); yarn ×2 on the same prompts: 50 %")
    assert goal.retrieval_line(ft, base, {}, 16384, "yarn ×2", tasks, 4096).endswith("goal ≥ 85 %)")
    assert goal.retrieval_line({}, base, free, 16384, "yarn ×2", tasks, 4096) == ""  # a cell missing: nothing said


def test_the_evidence_status_says_not_converged_then_in_progress_then_nothing(driver):
    """A converged run whose RULER part is not measured in full says "in progress" (recommend's caveat), a
    curve that may still fall says "not converged" first, and a converged run measured in full says nothing."""
    from extension_goal import GoalPart

    flat = [
        {"step": 40, "eval_ppl": 25.0, "eval_window_nll": [3.2, 3.3, 3.1, 3.25]},
        {"step": 80, "eval_ppl": 25.0, "eval_window_nll": [3.2001, 3.2999, 3.1002, 3.2498]},
    ]
    falling = [flat[0], {**flat[1], "eval_ppl": 24.0, "eval_window_nll": [3.15, 3.26, 3.05, 3.2]}]
    ruler = GoalPart("RULER mean of 4 tasks at 16k", "not measured yet", "a cell missing")
    met = GoalPart("PPL(16k) ≤ 1.01 × control's PPL(8k)", "met", "")
    status = driver.evidence_status({"fine-tuned yarn": flat, "control": flat}, [met, ruler], "ship")
    assert status == "in progress: RULER mean of 4 tasks at 16k: not measured in full yet (ship/report.md)"
    status = driver.evidence_status({"fine-tuned yarn": falling, "control": flat}, [met, ruler], "ship")
    assert status.startswith("not converged: the fine-tuned yarn held-out curve may still fall at step 80")
    assert driver.evidence_status({"fine-tuned yarn": flat, "control": flat}, [met], "ship") == ""


def test_a_retrain_takes_the_code_paths_its_first_run_logged(tmp_path, capsys):
    """fresh_checkout.training_env: the fused head loss is chosen by the environment, not the recipe, and
    a retrain without it trains other weights. The setting comes from the committed log's steps; a log
    whose steps took both paths cannot be retrained to the same weights, and says so (exit 2)."""
    from fresh_checkout import env_prefix, training_env

    log = tmp_path / "yarn-metrics.jsonl"
    assert training_env(log) == {}  # no log: a first run, the caller's environment
    rows = [{"step": 1, "loss": 3.0, "head_loss": "fused"}, {"step": 1, "eval_ppl": 20.0}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "lo')  # cut short by a kill
    assert training_env(log) == {"ROPESCALE_FUSED_LOSS": "1"}
    assert env_prefix(training_env(log)) == "ROPESCALE_FUSED_LOSS=1 "
    log.write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    assert training_env(log) == {"ROPESCALE_FUSED_LOSS": "0"} and env_prefix(training_env(log)) == ""
    log.write_text("".join(json.dumps(r) + "\n" for r in ({"step": 1, "loss": 3.0}, rows[0])))
    with pytest.raises(SystemExit) as stop:
        training_env(log)
    assert stop.value.code == 2
    assert f"{log}: some steps say head_loss=fused and some do not" in capsys.readouterr().err


def test_a_retrain_is_compared_with_the_first_run_step_by_step(tmp_path):
    """fresh_checkout.retrain_lines: equal losses and last held-out windows say "the same weights"; one
    loss or window apart says the retrain is another model, whose cells are not the committed curve's."""
    from fresh_checkout import retrain_lines

    def log(path, losses, nll):
        rows = [{"step": i + 1, "loss": x} for i, x in enumerate(losses)]
        rows.append({"step": len(losses), "eval_ppl": 20.0, "eval_window_nll": nll})
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    ship, runs = tmp_path, {"fine-tuned yarn": tmp_path / "yarn"}
    log(ship / "yarn-metrics.jsonl", [3.0, 2.5, 2.25], [3.0, 3.1])
    assert retrain_lines(ship, runs) == []  # no retrain
    log(ship / "yarn-metrics-retrain.jsonl", [3.0, 2.5, 2.25], [3.0, 3.1])
    [same] = retrain_lines(ship, runs)
    assert "loss equal at 3 of 3 steps (largest difference 0)" in same and same.endswith("committed curve's")
    log(ship / "yarn-metrics-retrain.jsonl", [3.0, 2.5, 2.2500001], [3.0, 3.1])
    [other] = retrain_lines(ship, runs)
    assert "loss equal at 2 of 3 steps" in other and "NOT the first run's weights" in other
    log(ship / "yarn-metrics-retrain.jsonl", [3.0, 2.5, 2.25], [3.0, 3.2])
    assert "its windows NOT equal to the first run's" in retrain_lines(ship, runs)[0]


@pytest.mark.parametrize("factor, scored", [(2, 65_536), (4, 131_072)])
def test_held_out_perplexity_scores_emma_alone_at_every_factor(driver, tmp_path, monkeypatch, factor, scored):
    """The perplexity task reads twice a cell's ``max_tokens`` of the corpus, longest novel first. At ×4 (131,072
    tokens a cell) that runs past Emma (~207k tokens) into Mansfield Park, a book both models train on: with
    ``budget: document`` 55,608 of the first ×4 640-step cells' 186,680 tokens were that book. Each factor's
    suites must score the first document alone, ``max_tokens`` of it (here one character is one token)."""
    from types import SimpleNamespace

    import ropescale.scoring.perplexity as scoring
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.tasks.task_perplexity import Perplexity

    data = tmp_path / "data"
    data.mkdir()
    (data / "a-emma.txt").write_text("e" * 207_000)
    (data / "b-mansfield-park.txt").write_text("m" * 207_000)
    plan = driver.replace(driver.make_plan(factor), data=str(data))
    tokenizer = mock.Mock(side_effect=lambda text, add_special_tokens: {"input_ids": [ord(c) for c in text]})
    scored_docs = []
    result = SimpleNamespace(to_dict=dict)
    monkeypatch.setattr(scoring, "evaluate_perplexity", lambda model, docs, **kw: scored_docs.append(docs) or result)
    for name, raw in driver.ppl_suites(plan, {"fine-tuned yarn": "ft", "control": "control"}).items():
        suite = suite_from_dict(raw)
        task, settings = Perplexity(), suite.settings("perplexity")
        ctx = SimpleNamespace(data=task.prepare(suite, settings, tokenizer), model=None, progress=False)
        ctx.tokenizer = SimpleNamespace(bos_token_id=1)
        scored_docs.clear()
        with mock.patch("ropescale.evals.tasks.task_perplexity.PerplexityCell.from_json"):
            task.run_cell(ctx, settings, max(plan.ppl_lengths))
        (docs,) = scored_docs
        budget = min(settings.max_tokens, sum(len(d) for d in docs))
        assert [set(d) for d in docs] == [{ord("e")}], (name, factor)  # Emma's tokens alone
        assert budget == scored, (name, factor)


def test_a_cell_of_mixed_text_stops_the_driver_before_any_weights_load(driver, tmp_path, monkeypatch, capsys):
    """A perplexity cell that scored more than one document (the first ×4 cells, Emma and Mansfield Park) is not
    held-out perplexity: neither judged nor resumed. The driver names it and stops (exit 2) before it measures."""
    out, ship = tmp_path / "out", tmp_path / "ship"
    # a cell as the suite runner writes it (this run's control at 2k on Emma alone), then made to score two novels
    shipped = REPO / "evals/measured/finetune-cpu-x4-640steps/cells/control/control__perplexity__2048.json"
    cell = json.loads(shipped.read_text())
    cell["result"].update(n_documents=2, tokens_scored=186_680)
    (ship / "cells" / "control").mkdir(parents=True)
    (ship / "cells" / "control" / "control__perplexity__2048.json").write_text(json.dumps(cell))
    monkeypatch.setattr(driver, "measure", mock.Mock(side_effect=AssertionError("measured")))
    code = driver.main(["--factor", "4", "--output", str(out), "--ship", str(ship), "--evidence", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and "control__perplexity__2048.json: scored 2 documents (186680 tokens), not Emma alone" in err
    cell["result"]["n_documents"] = 1  # Emma alone: resumed as before
    (out / "control" / "cells" / "control__perplexity__2048.json").write_text(json.dumps(cell))
    with pytest.raises(AssertionError, match="measured"):
        driver.main(["--factor", "4", "--output", str(out), "--ship", str(ship), "--evidence", str(tmp_path / "e")])
