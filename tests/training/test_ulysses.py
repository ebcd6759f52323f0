"""DeepSpeed Ulysses (the sequence parallelism of ALST, arXiv 2506.13996) on two CPU processes: gloo runs
its all-to-all. A tiny Llama scaled by YaRN x4, whose attention is DeepSpeed's ``UlyssesSPAttentionHF``
over a 128-token window cut in two shards, gives the loss and gradients of one process on the whole window
when each rank's rotary is computed from the shard's *global* position ids; numbering each shard from 0
moves them, and so does dynamic NTK, whose frequencies follow the length the rank sees (its shard's), which
is why ropescale refuses length-dependent methods on a sharded window (``rotary_shard_problem``, the same
refusal ``train.context_parallel`` gives). What only a GPU shows (flash kernels, NCCL, speed and memory
at 512k-1M) is listed in docs/training-at-scale.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ropescale.training.config import ConfigError
from tests.training.conftest import recipe

ROOT = Path(__file__).resolve().parents[2]


def _reference(method: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, the whole window: the loss and gradients the two ranks must reproduce."""
    from tests.training.ulysses_cpu_main import LENGTH, scaled_model, summed_loss, window

    ids, targets = window()
    model = scaled_model(method)
    loss = summed_loss(model, ids, torch.arange(LENGTH)[None], targets, int((targets != -100).sum()))
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}


#: DeepSpeed in a folder of its own (``make ulysses``; make test does it): the ranks put it on their path
ULYSSES = Path(os.environ.get("ROPESCALE_ULYSSES") or ROOT / ".ulysses")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    if not (ULYSSES / "deepspeed").is_dir():
        reason = f"no DeepSpeed in {ULYSSES}: run `make ulysses` (make test does)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("ulysses")
    path = os.pathsep.join([str(ROOT), str(ULYSSES)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(ROOT / "tests" / "training" / "ulysses_cpu_main.py"), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return load_file(str(out / "ulysses.safetensors")), json.loads((out / "refused.json").read_text())


def _gap(got: dict, case: str, method: str) -> tuple[float, float]:
    loss, grads = _reference(method)
    assert grads and all(f"{case}/grad/{n}" in got for n in grads)
    grad_gap = max((got[f"{case}/grad/{n}"] - g).abs().max().item() for n, g in grads.items())
    return abs(got[f"{case}/loss"].item() - loss), grad_gap


def test_two_ranks_give_one_process_loss_and_gradients(two_ranks):
    got, refused = two_ranks
    assert refused["world"] == "2"
    loss_gap, grad_gap = _gap(got, "yarn", "yarn")
    assert loss_gap < 2e-6 and grad_gap < 1e-6, (loss_gap, grad_gap)


def test_shard_local_positions_are_caught(two_ranks):
    """The check can fail: each shard numbered from 0 (the rotary of the shard, not the window)."""
    loss_gap, grad_gap = _gap(two_ranks[0], "yarn-local", "yarn")
    assert loss_gap > 2e-5 and grad_gap > 1e-4, (loss_gap, grad_gap)


def test_dynamic_ntk_on_a_shard_is_wrong_and_refused(two_ranks):
    got, refused = two_ranks
    loss_gap, grad_gap = _gap(got, "dynamic_ntk", "dynamic_ntk")
    assert loss_gap > 2e-5 and grad_gap > 1e-3, (loss_gap, grad_gap)  # rank 0 took its length from its shard
    assert refused["dynamic_ntk"].startswith("ulysses sequence_parallel=2: dynamic_ntk changes its frequencies")


@pytest.mark.parametrize("method", ["dynamic_ntk", "dynamic_yarn"])
def test_context_parallel_refuses_length_dependent_methods(tmp_path, method):
    """Before: accepted, each rank's rotary reading its own shard's length."""
    with pytest.raises(ConfigError, match=rf"^train.context_parallel=2: {method} changes its frequencies with the "):
        recipe(
            tmp_path,
            scaling={"method": method, "factor": 4},
            data={"seq_len": 32, "packing": "stream"},
            train={"context_parallel": 2},
        )
