"""Resuming to train longer, overrides anywhere on the command line, and the context-parallel pieces that
need no GPU: the recipe and accelerate-config checks of --dry-run, the data-parallel rank of a CP group,
and the sharded loss (shifted labels, window-wide normalizer) that equals the unsharded one."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import yaml

from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.training.config import CONFIGS_DIR, ConfigError, load_config, load_run_config
from ropescale.training.modeling import chunked_causal_lm_loss, summed_shifted_nll
from ropescale.training.optim import lr_lambda
from ropescale.training.parallel import (
    check_accelerate_config,
    data_parallel_rank,
    parallelism_config,
    shift_labels,
)
from ropescale.training.trainer import Trainer
from tests.training.conftest import recipe, repetitive_stream

ACCELERATE = CONFIGS_DIR.parent / "accelerate"


def _lrs(run: Path) -> dict[int, float]:
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return {m["step"]: m["lr"] for m in lines if "lr" in m}


def test_resume_with_more_steps_trains_on_with_the_recomputed_schedule(tmp_path, make_model):
    sections = dict(optim={"schedule": "linear", "warmup_steps": 2}, train={"max_steps": 4, "save_every": 2})
    stream = repetitive_stream()
    Trainer(recipe(tmp_path, **sections), model=make_model(), train_tokens=stream, progress=False).train()
    longer = recipe(tmp_path, optim=sections["optim"], train={"max_steps": 7, "save_every": 2})
    result = Trainer(longer, model=make_model(), train_tokens=stream, progress=False).train(resume=True)
    assert len(result.losses) == 3 and result.step == 7
    lrs, f4, f7 = _lrs(longer.output_dir), lr_lambda(recipe(tmp_path, **sections)), lr_lambda(longer)
    assert [lrs[s] for s in (1, 2, 3, 4)] == pytest.approx([1e-2 * f4(k) for k in range(4)])  # the first session
    assert [lrs[s] for s in (5, 6, 7)] == pytest.approx([1e-2 * f7(k) for k in (4, 5, 6)])  # recomputed decay
    assert lrs[4] == 0.0 and lrs[5] > 0  # the old schedule had decayed to 0 at its end
    assert load_run_config(longer.output_dir).train.max_steps == 7  # the run folder records the recipe in force

    shorter = recipe(tmp_path, optim=sections["optim"], train={"max_steps": 5})
    with pytest.raises(RopescaleError, match="past train.max_steps=5"):
        Trainer(shorter, model=make_model(), train_tokens=stream, progress=False).train(resume=True)
    other = recipe(tmp_path, optim=sections["optim"], train={"max_steps": 9, "grad_accum": 2})
    with pytest.raises(RopescaleError, match=r"different recipe \(train.grad_accum: 1 -> 2\)"):
        Trainer(other, model=make_model(), train_tokens=stream, progress=False).train(resume=True)


def test_overrides_after_flags_are_overrides(capsys, tmp_path):
    argv = ["train", "lora.r=4", "--config", "smollm2-135m/pose_yarn_x4_cpu", "--resume", "train.max_steps=600"]
    code = main([*argv, "--dry-run", "optim.lr=1e-3", "--output-dir", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 0, err
    dumped = yaml.safe_load(out.split("---\n", 1)[1])
    assert (dumped["lora"]["r"], dumped["train"]["max_steps"], dumped["optim"]["lr"]) == (4, 600, 1e-3)
    code = main(["train", "--config", "smollm2-135m/pose_yarn_x4_cpu", "--dry-run", "--bogus"])
    err = capsys.readouterr().err
    assert code == 2 and "unrecognized arguments: --bogus" in err and len(err.strip().splitlines()) == 1


def test_dry_run_checks_the_context_parallel_launch(capsys):
    base = ["train", "--config", "llama2-7b/yarn_x16_cp", "--dry-run", "--accelerate-config"]
    assert main([*base, str(ACCELERATE / "fsdp2_cp.yaml")]) == 0
    out = capsys.readouterr().out
    assert "4 data-parallel x 2 context-parallel ranks" in out and "32768 of 65536 tokens" in out
    for config_file, fragment in [
        ("ddp.yaml", "needs FSDP2"),
        ("nope.yaml", "not found"),
    ]:
        assert main([*base, str(ACCELERATE / config_file)]) == 2
        assert fragment in capsys.readouterr().err
    assert main([*base, str(ACCELERATE / "fsdp2_cp.yaml"), "train.context_parallel=4"]) == 2
    assert "parallelism_config_cp_size 2 differs from train.context_parallel=4" in capsys.readouterr().err


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("data.seq_len=65534", "must be divisible by 2 x 2 = 4"),
        ("model.attn_implementation=flash_attention_2", "needs model.attn_implementation sdpa"),
        ("s2attn.enabled=true", "cannot be combined with s2attn"),
        ("model.sliding_window=4096", "needs full attention"),
        ("train.context_parallel=0", "must be a positive integer"),
        ("train.gradient_checkpointing=false", "offload_activations needs train.gradient_checkpointing"),
        ("train.mlp_tile_tokens=-1", "train.mlp_tile_tokens must be non-negative"),
    ],
)
def test_bad_parallel_and_memory_settings_fail_with_one_line(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")) as info:
        load_config("llama2-7b/yarn_x16_cp", [override])
    assert "\n" not in str(info.value)


def test_cp_ranks_of_a_group_read_the_same_windows(monkeypatch):
    acc = types.SimpleNamespace(parallelism_config=None, process_index=3, num_processes=4)
    assert data_parallel_rank(acc) == (3, 4)
    acc.parallelism_config = types.SimpleNamespace(cp_size=2, cp_enabled=True)
    assert [data_parallel_rank(types.SimpleNamespace(**{**vars(acc), "process_index": r})) for r in range(4)] == [
        (0, 2),
        (0, 2),
        (1, 2),
        (1, 2),
    ]
    monkeypatch.setenv("WORLD_SIZE", "4")
    pc = parallelism_config(2)
    assert (pc.dp_shard_size, pc.cp_size) == (2, 2) and parallelism_config(1) is None
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(RopescaleError, match="multiple of 2 processes"):
        parallelism_config(2)


@pytest.mark.parametrize("cp", [2, 4])
def test_sharded_loss_equals_the_window_loss(cp):
    """What each CP rank computes on its load-balanced shard (pieces r and 2cp-1-r) averages to the
    window's mean NLL, and so do the gradients FSDP averages over the ranks."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(2, 16, 8, requires_grad=True)
    labels = torch.randint(0, 11, (2, 16))
    labels[0, 5] = labels[1, 9] = -100
    want = chunked_causal_lm_loss(hidden, head, labels, chunk=5)
    (g_want,) = torch.autograd.grad(want, hidden)
    targets = shift_labels(labels)
    assert targets[0, 4] == -100 and (targets[:, -1] == -100).all()
    normalizer = (targets != -100).sum().float() / cp
    pieces = torch.arange(16).chunk(2 * cp)
    losses = []
    for r in range(cp):
        idx = torch.cat([pieces[r], pieces[2 * cp - 1 - r]])
        losses.append(summed_shifted_nll(hidden[:, idx], head, targets[:, idx], chunk=3) / normalizer)
    got = torch.stack(losses).mean()
    (g_got,) = torch.autograd.grad(got, hidden)
    torch.testing.assert_close(got.float(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g_got, g_want, rtol=1e-5, atol=1e-7)


def test_shipped_accelerate_configs_fit_their_recipes():
    fsdp = check_accelerate_config(ACCELERATE / "fsdp.yaml", load_config("llama2-7b/yarn_x16"))
    assert "FSDP2" in fsdp[0] and len(fsdp) == 1
    cp = check_accelerate_config(ACCELERATE / "fsdp2_cp.yaml", load_config("llama2-7b/yarn_x16_cp"))
    assert len(cp) == 2
