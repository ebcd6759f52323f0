"""The extension benchmark's plumbing for a variant of the fine-tune (no training here: the commands it
would run are recorded): the overrides reach the recipes, and only the chosen suites' models are trained."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import load_script, squeezed


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_extension.py")


def test_a_variant_trains_only_its_suites_models_with_its_overrides(bench, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    monkeypatch.setattr(bench, "trained", lambda run, recipe: False)
    overrides = ["pose.enabled=false", "data.seq_len=4096"]
    exports = bench.train_and_export(tmp_path, {"finetuned"}, overrides)
    assert exports == {"fine-tuned yarn": tmp_path / "yarn-export", "control": tmp_path / "control-export"}
    (train, export) = ran  # the control is not trained: its suite was not asked for
    assert train[:3] == ("train", "--config", "smollm2-135m/yarn_x4") and train[-2:] == tuple(overrides)
    assert export == ("export", str(tmp_path / "yarn"), "--output", str(tmp_path / "yarn-export"))
    ran.clear()
    bench.train_and_export(tmp_path, {"base", "finetuned", "control"}, [])
    assert [a[2] for a in ran if a[0] == "train"] == ["smollm2-135m/yarn_x4", "smollm2-135m/yarn_x4_control"]
    args = bench.parse_args(["--output", "runs/v", "--suites", "finetuned", "--overrides", *overrides])
    assert args.suites == "finetuned" and args.overrides == overrides


def test_scaling_overrides_reach_only_the_scaled_fine_tune(bench, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    monkeypatch.setattr(bench, "trained", lambda run, recipe: False)
    overrides = ["scaling.params={attention_factor: 1.07}", "data.recall_facts=4"]
    bench.check_recipes(tmp_path, {"finetuned", "control"}, overrides)  # the control alone would refuse the factor
    bench.train_and_export(tmp_path, {"finetuned", "control"}, overrides)
    trains = {a[2]: a[7:] for a in ran if a[0] == "train"}
    assert trains == {
        "smollm2-135m/yarn_x4": tuple(overrides),
        "smollm2-135m/yarn_x4_control": ("data.recall_facts=4",),
    }


def test_an_override_a_recipe_refuses_stops_before_anything_trains(bench, tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--output", str(tmp_path / "v"), "--suites", "control", "--overrides", "data.recall_facts=-1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and ran == [] and "smollm2-135m/yarn_x4_control" in err and "recall_facts" in err
    assert len(err.strip().splitlines()) == 1


def test_a_folder_trained_with_another_recipe_is_refused_before_its_cells_are_reported_as_this_ones(
    bench, tmp_path, monkeypatch, capsys
):
    from ropescale.training.config import load_config

    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    run = tmp_path / "yarn"
    run.mkdir()

    def trained(recipe: str, overrides: list[str], **precision: str) -> None:  # as another machine resolved it
        d = load_config(recipe, overrides).to_dict()
        d["train"]["mixed_precision"] = precision.get("mixed_precision", d["train"]["mixed_precision"])
        d["model"]["dtype"] = precision.get("dtype", d["model"]["dtype"])
        (run / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))

    def refused(overrides: list[str]) -> str:
        with pytest.raises(SystemExit) as exc:
            bench.check_recipes(tmp_path, {"finetuned"}, overrides)
        assert exc.value.code == 2
        return capsys.readouterr().err

    trained("smollm2-135m/yarn_x4", ["train.max_steps=400"])
    bench.check_recipes(tmp_path, {"finetuned"}, ["train.max_steps=400"])  # the same recipe: goes on
    assert "train.max_steps: 400 -> 600" in refused(["train.max_steps=600"])  # another model than the cells'
    assert "train.max_steps: 400 -> 60" in refused([])
    # a precision left `auto` is what each machine resolves: a LoRA run on a bf16 machine, checked here
    trained("smollm2-135m/yarn_x4", ["lora.enabled=true"], mixed_precision="bf16", dtype="bfloat16")
    bench.check_recipes(tmp_path, {"finetuned"}, ["lora.enabled=true"])
    trained("smollm2-135m/yarn_x4", [], mixed_precision="bf16")  # one set by hand is compared
    assert "train.mixed_precision: 'bf16' -> 'no'" in refused(["train.mixed_precision=no"])
    with pytest.raises(SystemExit) as exc:
        bench.main(["--output", str(tmp_path), "--suites", "finetuned", "--overrides", "data.recall_facts=4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and ran == [] and "data.recall_facts: 0 -> 4" in err and str(run / "config.yaml") in err
    (run / "config.yaml").write_text("model: [")  # unreadable: one line, not a traceback
    assert "yarn_x4" in refused([]) and len(refused([]).strip().splitlines()) <= 1


def _cells(root, suite: str, runtime: dict) -> None:
    (root / suite / "cells").mkdir(parents=True)
    (root / suite / "cells" / "x__passkey__4096.json").write_text(json.dumps({"runtime": runtime}))


def test_the_evidence_note_names_the_device_the_cells_were_measured_on(bench, tmp_path, monkeypatch, capsys):
    import torch

    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    _cells(gpu, "base", {"device": "cuda", "dtype": "bfloat16", "attention": "sdpa"})
    _cells(cpu, "base", {"device": "cpu", "dtype": "bfloat16", "attention": "sdpa", "kernels": "amx"})
    assert bench.measured_on(gpu, "one NVIDIA H200") == (
        "one NVIDIA H200 (bfloat16)",
        {"device": "cuda", "dtype": "bfloat16", "attention": "sdpa"},
    )
    assert bench.measured_on(cpu, None)[0].endswith("CPU cores, auto precision (bfloat16 on amx)")  # as recorded
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:  # GPU cells reported where there is no GPU: say which
        bench.measured_on(gpu, None)
    assert stop.value.code == 2 and "--machine" in capsys.readouterr().err
    _cells(gpu, "control", {"device": "cpu", "dtype": "float32", "attention": "sdpa"})
    with pytest.raises(SystemExit):  # one experiment, one device
        bench.measured_on(gpu, "one NVIDIA H200")
    assert "cuda / bfloat16 / sdpa and on cpu / float32 / sdpa: one file, one machine kind" in capsys.readouterr().err


def test_the_cli_runs_with_a_safe_path(bench, monkeypatch):
    seen = {}
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, check, env: seen.update(cmd=cmd, env=env))
    bench.ropescale("doctor")
    assert seen["cmd"][1:3] == ["-m", "ropescale.cli.main"] and seen["env"]["PYTHONSAFEPATH"] == "1"


def test_x8_trains_its_own_recipe_measures_to_64k_and_never_reads_a_x4_run(bench, tmp_path, monkeypatch, capsys):
    from extension_plan import Plan, suite_dicts

    from ropescale.training.config import load_config

    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    monkeypatch.setattr(bench, "trained", lambda run, recipe: False)
    bench.train_and_export(tmp_path, {"finetuned", "control"}, [], factor=8)
    assert [a[2] for a in ran if a[0] == "train"] == ["smollm2-135m/yarn_x8", "smollm2-135m/yarn_x4_control"]
    recipe = load_config("smollm2-135m/yarn_x8")
    assert (recipe.scaling.factor, recipe.pose.target_length) == (8, 65536)
    plan = Plan.at(8, jitter=0.125)
    assert plan.passkey_lengths == (4096, 8192, 16384, 32768, 65536) and plan.ppl_lengths[-1] == 65536
    assert Plan.at(4) == Plan()  # the shipped x4 protocol, unchanged
    raws = suite_dicts(plan, "ft", "control")
    assert raws["finetuned"]["methods"][0]["factor"] == 8 and raws["control"]["methods"][0]["only"]["passkey"] == [
        4096,
        8192,
    ]
    # an output folder whose fine-tune was trained at x4: its cells are not reported as x8's
    run = tmp_path / "x4" / "yarn"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text((bench.Path("configs/train/smollm2-135m/yarn_x4.yaml")).read_text())
    with pytest.raises(SystemExit) as stop:
        bench.main(["--factor", "8", "--output", str(tmp_path / "x4"), "--report-only"])
    assert stop.value.code == 2
    assert "scaling.factor 4 was trained there, --factor 8 asked" in capsys.readouterr().err


def test_the_curve_can_follow_retrieval_and_a_bad_task_stops_before_training(bench, tmp_path, monkeypatch, capsys):
    from extension_plan import Plan

    from ropescale.evals.advice.evidence import Measured

    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--output", str(tmp_path / "x"), "--curve-tasks", "perplexity,needle"])
    assert stop.value.code == 2 and ran == [] and "--curve-tasks 'perplexity,needle'" in capsys.readouterr().err
    points = [
        {"role": "fine-tuned yarn", "step": 20, "tokens": 81920, "length": 32768, "ppl": 26.5},
        {"role": "fine-tuned yarn", "step": 20, "tokens": 81920, "length": 4096, "passkey": 0.6, "passkey_trials": 30},
    ]
    assert [bench.curve_text(p) for p in points] == ["PPL(32k) 26.500", "passkey 4k 18/30"]
    rows = [Measured("yarn", "yarn", 4, ppl={32768: 33.2}, passkey={4096: 0.9}, passkey_trials={4096: 30})]
    files = bench.plot(tmp_path, rows, points, Plan())
    assert [bench.Path(f).name for f in files] == ["perplexity.png", "curve.png"]
    import matplotlib.image

    assert matplotlib.image.imread(files[1]).shape[1] > 1.5 * matplotlib.image.imread(files[0]).shape[1]  # two panels


def test_a_variant_takes_its_baselines_from_a_shipped_experiment_of_the_same_prompts_and_runtime(
    bench, tmp_path, monkeypatch, capsys
):
    from extension_plan import Plan, evidence_dict

    from ropescale.evals.advice.evidence import Measured

    gpu = {"device": "cuda", "dtype": "bfloat16", "attention": "sdpa"}

    def shipped(name, jitter=0.125, factor=4, runtime=gpu):
        rows = [
            Measured("none", "default", passkey={8192: 0.77}, passkey_trials={8192: 30}, commands=("bench a",)),
            Measured("yarn", "yarn", factor, ppl={32768: 33.2}, commands=("bench a",)),
            Measured("control", "default", ppl={8192: 23.0}, commands=("bench a",)),  # never taken
        ]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(evidence_dict(rows, Plan.at(factor, jitter=jitter), "n", runtime)))
        return str(path)

    out = tmp_path / "variant"
    _cells(out, "finetuned", gpu)
    mine = [Measured("fine-tuned yarn", "yarn", 4, ppl={32768: 24.0}), Measured("control", "default", ppl={8192: 24.1})]
    rows, taken = bench.with_baselines(out, mine, shipped("base"), Plan(jitter=0.125))
    assert [r.label for r in rows] == ["none", "yarn", "fine-tuned yarn", "control"] and taken == ["none", "yarn"]
    assert rows[0].commands == ("bench a",) and rows[3].ppl == {8192: 24.1}  # their command; its own control
    assert bench.with_baselines(out, rows, shipped("base"), Plan(jitter=0.125))[1] == []  # measured here: kept
    for path, said in (
        (shipped("fixed", jitter=0.0), "passkey_jitter 0.0, this experiment's 0.125"),
        (shipped("x8", factor=8), "yarn at factor 8.0, this experiment's 4"),
        (shipped("cpu", runtime={"device": "cpu", "dtype": "bfloat16"}), "runtime cpu / bfloat16, this experiment's"),
        (str(tmp_path / "missing.json"), "missing.json"),
    ):
        with pytest.raises(SystemExit) as stop:
            bench.with_baselines(out, mine, path, Plan(jitter=0.125))
        err = capsys.readouterr().err
        assert stop.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    with pytest.raises(SystemExit) as stop:  # a file that cannot stand for the base suite: before anything trains
        bench.main(["--output", str(tmp_path / "v"), "--jitter", "0.125", "--baselines", shipped("fixed", jitter=0.0)])
    assert stop.value.code == 2 and ran == [] and "fixed.json" in capsys.readouterr().err


def test_a_report_with_baselines_shows_and_ships_their_rows_and_names_the_file(bench, tmp_path, capsys):
    from extension_plan import Plan, evidence_dict

    from ropescale.evals.advice.evidence import Measured, load_measured

    base = tmp_path / "base.json"
    rows = [
        Measured("none", "default", ppl={2048: 28.8}, passkey={8192: 0.77}, passkey_trials={8192: 30}, commands=("a",)),
        Measured("yarn", "yarn", 4, ppl={32768: 33.2}, commands=("a",)),
    ]
    base.write_text(json.dumps(evidence_dict(rows, Plan(jitter=0.125), "n", {"device": "cuda", "dtype": "bfloat16"})))
    out = tmp_path / "variant"
    for suite, label, ppl in (
        ("finetuned", "fine-tuned yarn", {"8192": {"ppl": 24.0}}),
        ("control", "control", {"8192": {"ppl": 23.0}}),
    ):
        (out / suite).mkdir(parents=True)
        methods = {label: {"method": "yarn" if suite == "finetuned" else "default"}}  # as the suite runner records them
        (out / suite / "results.json").write_text(json.dumps({"model": "smollm2-135m", "methods": methods, "tasks": {"perplexity": {label: ppl}}}))  # fmt: skip
    shipped = tmp_path / "shipped.json"
    argv = ["--output", str(out), "--jitter", "0.125", "--report-only", "--baselines", str(base)]
    assert bench.main([*argv, "--evidence", str(shipped), "--machine", "one GPU"]) == 0
    table = squeezed(capsys.readouterr().out)
    assert [line.split(" |")[0] for line in table.splitlines() if line.startswith("| ") and "model" not in line] == [
        "| none",
        "| yarn",
        "| fine-tuned yarn",
        "| control",
    ]
    ev = load_measured(shipped)
    assert [r.label for r in ev.rows] == ["none", "yarn", "fine-tuned yarn", "control"]
    assert ev.rows[0].commands == ("a",) and "none and yarn: the rows of base.json" in ev.note


def test_baselines_of_another_runtime_stop_a_run_before_anything_trains(bench, tmp_path, monkeypatch, capsys):
    from extension_plan import Plan, evidence_dict

    from ropescale.evals.advice.evidence import Measured

    gpu = tmp_path / "gpu.json"  # measured on a GPU; this machine trains and measures on its CPU
    rows = [Measured("none", "default", passkey={8192: 0.77}, passkey_trials={8192: 30}, commands=("a",))]
    gpu.write_text(json.dumps(evidence_dict(rows, Plan(jitter=0.125), "n", {"device": "cuda", "dtype": "bfloat16"})))
    import ropescale.models.runtime as runtime

    monkeypatch.setattr(runtime, "resolve_runtime", lambda: runtime.Runtime("cpu", "float32", "sdpa"))  # any CI machine
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--output", str(tmp_path / "v"), "--jitter", "0.125", "--baselines", str(gpu)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and ran == [] and "runtime cuda / bfloat16" in err and "gpu.json" in err
