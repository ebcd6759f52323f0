"""Data parallel on CPU: two gloo processes (torchrun) reach the weights of one process with the same
global batch, write one RNG file per rank, and resume exactly.

Opt-in (``ROPESCALE_DDP_TEST=1``): it starts five Python processes (about 1.5 min on a busy 2-core machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.skipif(
    not os.environ.get("ROPESCALE_DDP_TEST"), reason="set ROPESCALE_DDP_TEST=1 (starts torchrun)"
)


def _run(args, env_extra=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_ddp_matches_single_process_and_resumes(tmp_path, model_dir):
    from safetensors.torch import load_file

    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat and looked at the rain. " * 200)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
                "scaling": {"method": "yarn", "factor": 4},
                "lora": {"r": 4, "alpha": 8, "trainable": ["norm"]},
                "data": {"source": str(text), "seq_len": 32},
                "optim": {"lr": 1e-2, "warmup_steps": 1},
                "train": {"max_steps": 4, "save_every": 2, "gradient_checkpointing": True},
            }
        )
    )
    cli = ["-m", "ropescale.cli.main", "train", "--config", str(recipe), "--no-progress"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cpu = {"ACCELERATE_USE_CPU": "true"}
    _run([*torchrun, *cli, "--output-dir", str(tmp_path / "ddp")], cpu)  # 2 ranks x 1 window
    _run([sys.executable, *cli, "--output-dir", str(tmp_path / "one"), "train.batch_size=2"], cpu)  # 1 rank x 2 windows
    weights = lambda run: load_file(Path(run) / "checkpoints" / "step-00000004" / "trainable.safetensors")  # noqa: E731
    ddp, one = weights(tmp_path / "ddp"), weights(tmp_path / "one")
    for name in one:
        torch.testing.assert_close(ddp[name], one[name], rtol=0, atol=1e-5)
    assert (tmp_path / "ddp" / "checkpoints" / "step-00000004" / "rng-1.safetensors").is_file()

    shutil.rmtree(tmp_path / "ddp" / "checkpoints" / "step-00000004")  # as if killed after step 3
    _run([*torchrun, *cli, "--output-dir", str(tmp_path / "ddp"), "--resume"], cpu)
    resumed = weights(tmp_path / "ddp")
    for name in ddp:
        torch.testing.assert_close(resumed[name], ddp[name], rtol=0, atol=0)


def test_a_preflight_refusal_stops_every_rank(tmp_path, model_dir):
    """The preflight reads the data on the main process only; the other ranks learn its refusal from a
    collective and stop too, before the weights load, instead of waiting at the next barrier."""
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat and looked at the rain. " * 200)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
                "scaling": {"method": "yarn", "factor": 4},
                "data": {"source": str(text), "seq_len": 32},
                "train": {"max_steps": 2, "output_dir": str(tmp_path / "run")},
                "eval": {"every": 1},  # no held-out text
            }
        )
    )
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "ropescale.cli.main"]
    args += ["train", "--config", str(recipe), "--no-progress", "optim.warmup_steps=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ACCELERATE_USE_CPU": "true"}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "evaluation needs held-out text: set data.holdout" in proc.stderr
    assert not (tmp_path / "run").exists()
