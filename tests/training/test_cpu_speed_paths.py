"""The two CPU speed changes of issue 54 compute what the plain paths compute.

- The fused head loss (:class:`ropescale.scoring.nll._FusedHeadLoss`) against the recomputing path:
  the same loss and the same gradients for the hidden states and a tied head weight, fp32 and under
  bf16 autocast.
- ``keep_freed_memory``: freed memory stays mapped (the resident size does not fall after a large
  tensor is freed), and ``ROPESCALE_MALLOC=system`` leaves glibc as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ropescale.scoring import nll


def _loss_and_grads(fused: bool, autocast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    vocab, width, tokens = 97, 16, 45
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(2, tokens, width, requires_grad=True)
    labels = torch.randint(0, vocab, (2, tokens))
    labels[0, :7] = nll.IGNORE_INDEX
    original = nll._fusable
    nll._fusable = (lambda *a: True) if fused else (lambda *a: False)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            total, n = nll.summed_nll(hidden * 1.0, head, labels, chunk_size=16)
        total.backward()
    finally:
        nll._fusable = original
    assert n == int((labels[:, 1:] != nll.IGNORE_INDEX).sum())
    return total.detach(), hidden.grad, head.weight.grad


def test_the_fused_head_loss_gives_the_recomputed_loss_and_gradients_in_fp32():
    plain, fused = _loss_and_grads(False, False), _loss_and_grads(True, False)
    for a, b in zip(plain, fused):
        torch.testing.assert_close(b.double(), a.double(), rtol=1e-5, atol=1e-6)


def test_under_bf16_autocast_the_fused_head_loss_is_as_close_to_fp32_as_the_recomputed_one():
    """bf16 rounds both paths differently (the recomputing one rounds the weight gradient to bf16, the
    fused one accumulates it in fp32), so each is compared with the fp32 result."""
    exact = _loss_and_grads(False, False)
    plain, fused = _loss_and_grads(False, True), _loss_and_grads(True, True)
    for e, a, b in zip(exact, plain, fused):
        err_plain = (a.double() - e.double()).abs().max()
        err_fused = (b.double() - e.double()).abs().max()
        assert err_fused <= 1.5 * err_plain + 1e-6, (err_fused, err_plain)


def test_the_fused_path_is_taken_for_a_plain_cpu_head_only(monkeypatch):
    monkeypatch.setenv("ROPESCALE_FUSED_LOSS", "1")
    hidden = torch.zeros(1, 3, 4)
    assert nll._fusable(torch.nn.Linear(4, 5, bias=False), hidden, None)
    assert not nll._fusable(torch.nn.Linear(4, 5, bias=True), hidden, None)
    assert not nll._fusable(torch.nn.Linear(4, 5, bias=False), hidden, 30.0)  # softcapping: recompute path
    assert not nll._fusable(torch.nn.Sequential(torch.nn.Linear(4, 5, bias=False)), hidden, None)
    monkeypatch.setenv("ROPESCALE_FUSED_LOSS", "0")  # opt-in: off unless asked
    assert not nll._fusable(torch.nn.Linear(4, 5, bias=False), hidden, None)


_RESIDENT = """
import sys
from ropescale.models.runtime import keep_freed_memory
print(keep_freed_memory())
import numpy as np
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) // 1024
a = np.ones(300 * 2**20 // 8); before = rss(); del a
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("setting", ["", "system"])
def test_freed_memory_stays_mapped_unless_told_otherwise(setting):
    env = {**os.environ, "ROPESCALE_MALLOC": setting}
    out = subprocess.run([sys.executable, "-c", _RESIDENT], env=env, capture_output=True, text=True, check=True)
    applied, released_mb = out.stdout.split()
    assert applied == str(setting != "system")
    if setting == "system":
        assert int(released_mb) > 250  # glibc unmaps a 300 MB block when it is freed
    else:
        assert int(released_mb) < 50  # kept for the next step


def test_a_step_the_fused_head_loss_computed_says_so_in_its_log(tmp_path, make_model, monkeypatch):
    """Its rounding is not the recomputing path's, so each step it computed records ``head_loss: fused``
    in metrics.jsonl (results know what produced them); a step of the default path records nothing."""
    import json

    from ropescale.training.trainer import Trainer
    from tests.training.conftest import recipe, repetitive_stream

    records = {}
    for fused in (False, True):
        monkeypatch.setenv("ROPESCALE_FUSED_LOSS", "1" if fused else "0")
        train = {"max_steps": 2, "mixed_precision": "no"}
        config = recipe(tmp_path / str(fused), model={"dtype": "float32"}, lora={"enabled": False}, train=train)
        Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()
        lines = (config.output_dir / "metrics.jsonl").read_text().splitlines()
        records[fused] = [json.loads(line) for line in lines]
    assert [r.get("head_loss") for r in records[True]] == ["fused", "fused"]
    assert all("head_loss" not in r for r in records[False])


@pytest.mark.parametrize(
    "key,env,fused",
    [("fused", None, True), ("recompute", None, False), ("fused", "0", False), ("recompute", "1", True)],
    ids=["recipe-fused", "recipe-recompute", "env-0-wins", "env-1-wins"],
)
def test_the_recipe_key_chooses_the_head_loss_and_the_environment_variable_where_set_overrides_it(
    tmp_path, make_model, monkeypatch, key, env, fused
):
    """``train.head_loss`` picks the path; ``ROPESCALE_FUSED_LOSS``, where set, decides instead (the
    benchmarks time both paths with it, and the CPU driver retrains a log's steps on the path they took)."""
    import json

    from ropescale.training.trainer import Trainer
    from tests.training.conftest import recipe, repetitive_stream

    if env is None:
        monkeypatch.delenv("ROPESCALE_FUSED_LOSS", raising=False)
    else:
        monkeypatch.setenv("ROPESCALE_FUSED_LOSS", env)
    train = {"max_steps": 1, "mixed_precision": "no", "head_loss": key}
    config = recipe(tmp_path, model={"dtype": "float32"}, lora={"enabled": False}, train=train)
    Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()
    (step,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert step.get("head_loss") == ("fused" if fused else None), step
    assert not nll.fused_wanted() or env == "1"  # the recipe's choice ends with the trainer's steps


def test_a_head_loss_the_trainer_does_not_know_is_refused_naming_the_key(tmp_path):
    from ropescale.training.sections import ConfigError
    from tests.training.conftest import recipe

    with pytest.raises(ConfigError, match=r"train.head_loss must be one of recompute, fused, got 'fast'"):
        recipe(tmp_path, train={"head_loss": "fast"})


def test_the_cpu_recipes_take_the_fused_head_loss():
    """Their headers' CPU hours were measured on it."""
    from ropescale.training.config import load_config

    for name in ("yarn_x2_cpu", "yarn_x2_cpu_control", "yarn_x4_cpu"):
        assert load_config(f"smollm2-135m/{name}").train.head_loss == "fused", name


def test_where_the_fused_head_loss_cannot_run_the_reason_is_named():
    plain = torch.nn.Linear(4, 5, bias=False)
    assert nll.head_problem(plain, "cpu") is None
    assert nll.head_problem(plain, "cuda") == "it runs on the CPU only, and this run computes on cuda"
    assert nll.head_problem(plain, "cpu", 30.0) == "the model soft-caps its logits"
    assert nll.head_problem(torch.nn.Linear(4, 5), "cpu").endswith("this one is a Linear with a bias")
    assert nll.head_problem(torch.nn.Sequential(plain), "cpu").endswith("this one is a Sequential")


def test_a_recipe_asking_for_the_fused_head_loss_where_it_cannot_run_is_told_so(
    tmp_path, make_model, capsys, monkeypatch
):
    """A LoRA-wrapped head is not the whole matrix: the run says why its loss takes the recomputing path,
    and no step claims the fused one."""
    import json

    from ropescale.training.trainer import Trainer
    from tests.training.conftest import recipe, repetitive_stream

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "lm_head"]}
    train = {"max_steps": 1, "mixed_precision": "no", "head_loss": "fused"}
    config = recipe(tmp_path, model={"dtype": "float32"}, lora=lora, train=train)
    monkeypatch.delenv("ROPESCALE_FUSED_LOSS", raising=False)
    Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()
    said = capsys.readouterr().err
    assert "ropescale: train.head_loss=fused: it takes a plain bias-free nn.Linear head, and this one is a " in said
    assert "; its loss takes the recomputing path" in said
    (step,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert "head_loss" not in step
