"""One training run per run folder: a second ``ropescale train`` into a folder being written stops
naming the holder, and a launch that announces several processes while accelerate runs one is refused
before anything is written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ropescale.cli.main import main

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.getcwd()}
HOLD = "import sys, time; from ropescale._lock import acquire; acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_file(tmp_path, model_dir):
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat and looked at the rain. " * 40)
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
                "scaling": {"method": "yarn", "factor": 4},
                "lora": {"r": 4, "alpha": 8},
                "data": {"source": str(text), "seq_len": 32},
                "optim": {"lr": 1e-2, "warmup_steps": 1},
                "train": {"max_steps": 2, "save_every": 1, "gradient_checkpointing": False},
                "eval": {"every": 0, "at_end": False},
            }
        )
    )
    return path


def test_second_training_into_the_same_folder_stops(tmp_path, recipe_file, capsys):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        capsys.readouterr()
        code = main(["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert f"run folder '{run}' is being written by another ropescale (pid {proc.pid} on " in err[0]
        assert not run.exists()
    finally:
        proc.kill()
        proc.wait()
    code = main(["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_world_size_without_processes_is_refused(tmp_path, recipe_file, monkeypatch):
    """accelerate launch --num_processes 2 with an FSDP config on a machine without GPUs: accelerate
    runs each process alone (WORLD_SIZE=2, num_processes=1); both would train into one folder."""
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    env = {k: v for k, v in ENV.items() if k != "ACCELERATE_USE_CPU"}
    run = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    argv = [*launch, str(ROOT / "configs/accelerate/fsdp.yaml"), "--num_processes", "2", "-m", "ropescale.cli.main"]
    argv += ["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ropescale: error:")]
    # the launcher stops the other process once one has failed: one or two lines, both the same
    assert proc.returncode != 0 and 1 <= len(lines) <= 2, proc.stderr[-2000:]
    assert all("the launch says WORLD_SIZE=2 but accelerate runs a single process here" in ln for ln in lines)
    assert "trained" not in proc.stdout
    assert not run.exists() or not any(run.iterdir())


def test_refused_run_creates_nothing(tmp_path, recipe_file, capsys):
    run = tmp_path / "run"
    code = main(["train", "--config", str(recipe_file), "--output-dir", str(run), "data.source=/no/such/text"])
    assert code == 2 and "data '/no/such/text' not found" in capsys.readouterr().err
    assert not run.exists() and not list(tmp_path.glob(".run*"))


def test_refused_resume_leaves_the_folder_as_found(tmp_path, recipe_file, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]) == 0
    shutil.rmtree(run / "data")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    code = main(["train", "--config", str(recipe_file), "--output-dir", str(run), "--resume", "lora.r=8"])
    assert code == 2 and "different recipe (lora.r: 4 -> 8)" in capsys.readouterr().err
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # no data/ left behind


def test_staging_of_a_stopped_run_is_removed(tmp_path, recipe_file, capsys):
    run = tmp_path / "run"
    staging = run / "checkpoints" / ".step-00000007.partial"
    staging.mkdir(parents=True)
    (staging / "optimizer.pt").write_bytes(b"x" * 1000)
    capsys.readouterr()
    assert main(["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]) == 0
    assert f"ropescale: removing {staging}, left by a training run that was stopped" in capsys.readouterr().err
    assert not staging.exists()


def test_resume_after_the_data_or_model_changed_in_place_stops(tmp_path, recipe_file, model_dir, capsys):
    run = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]
    assert main(argv) == 0
    text = tmp_path / "text.txt"
    original = text.read_text()
    text.write_text("Another text entirely, about dogs in the park. " * 40)
    capsys.readouterr()
    assert main([*argv, "--resume", "train.max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert f"was trained on other data content: '{text}' changed since" in err, err
    text.write_text(original)
    weights = model_dir / "model.safetensors"
    from tests.conftest import tiny_model

    tiny_model(seed=5, attn_implementation="sdpa").save_pretrained(model_dir)  # re-trained in place
    assert main([*argv, "--resume", "train.max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert f"was trained on other model content: '{model_dir}' changed since" in err and weights.is_file(), err


def test_data_edited_in_place_is_tokenized_again(tmp_path, recipe_file):
    run = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]
    assert main(argv) == 0
    first = (run / "data" / "train_tokens.json").read_text()
    (tmp_path / "text.txt").write_text("Another text entirely, about dogs in the park. " * 40)
    assert main([*argv, "--overwrite"]) == 0
    assert (run / "data" / "train_tokens.json").read_text() != first


def test_run_folder_that_is_a_file_is_refused(tmp_path, recipe_file, capsys):
    out = tmp_path / "file"
    out.write_text("keep me")
    assert main(["train", "--config", str(recipe_file), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ropescale: error: run folder '{out}' exists and is a file, not a folder; choose another"]
