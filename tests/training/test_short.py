"""Short windows at the original positions (data.short_share, LongRoPE2's mixed context window training):
a share of micro-batches cut in pieces of at most L tokens and run with the unscaled rotary."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropescale.patching.model import patch, rotary_owner
from ropescale.training.config import ConfigError
from ropescale.training.data import WindowDataset, WindowSpec
from ropescale.training.modeling import CausalLMLoss, FullFinetune
from ropescale.training.short import is_short
from tests.conftest import tiny_model
from tests.training.conftest import recipe, repetitive_stream


def test_short_windows_use_the_unscaled_rotary():
    """A short micro-batch through a YaRN x4 model gives the unpatched model's loss exactly (frequencies
    and attention factor both original); a long one does not; the scaled rotary is back afterwards."""
    base = tiny_model("llama", attn_implementation="sdpa").float()
    scaled = patch(tiny_model("llama", attn_implementation="sdpa").float(), "yarn", 4, replace=True)
    rotary = rotary_owner(scaled).rotary_emb
    before = rotary.inv_freq.clone(), rotary.attention_scaling
    assert before[1] != 1.0
    ids = torch.randint(4, 128, (2, 48), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(48).expand(2, 48)
    with torch.no_grad():
        reference = CausalLMLoss(FullFinetune(base))(ids, positions, ids)
        short = CausalLMLoss(FullFinetune(scaled))(ids, positions, ids, short=torch.ones(2, dtype=torch.bool))
        long = CausalLMLoss(FullFinetune(scaled))(ids, positions, ids)
    assert float(short) == pytest.approx(float(reference), rel=1e-6)
    assert abs(float(long) - float(reference)) > 1e-4
    assert torch.equal(rotary.inv_freq, before[0]) and rotary.attention_scaling == before[1]


def test_short_micro_batches_follow_the_share_and_restart_within_l():
    share, n, length = 0.3, 600, 16
    spec = WindowSpec(32, 1, 128, 2, "skip", short_share=share, short_len=length)
    ds = WindowDataset(repetitive_stream(4000), spec, seed=0)
    shorts = 0
    for k in range(n):
        batch = ds.batch([2 * k, 2 * k + 1])
        pos = batch["position_ids"]
        if "short" in batch:
            shorts += 1
            assert pos.tolist() == [list(range(16)) * 2] * 2  # two pieces of L tokens, contiguous text
            assert batch["seq_ids"].tolist() == [[0] * 16 + [1] * 16] * 2
        else:
            assert "seq_ids" not in batch and int(pos.max()) >= 32  # PoSE windows as before
    p = shorts / n
    assert abs(p - share) <= 4.5 * math.sqrt(share * (1 - share) / n)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"method": "dynamic_ntk", "factor": 4}, r"already changes its frequencies with the length"),
        ({"method": "self_extend", "factor": 4}, r"rotates inside attention"),
    ],
)
def test_short_share_refused_where_it_has_no_meaning(tmp_path, scaling, message):
    with pytest.raises(ConfigError, match=message):
        recipe(tmp_path, scaling=scaling, data={"short_share": 0.4})


def test_trainer_with_short_windows(tmp_path, make_model):
    from ropescale.training.trainer import Trainer

    config = recipe(tmp_path, data={"short_share": 0.5, "seq_len": 32}, pose={"enabled": True, "target_length": 128})
    trainer = Trainer(config, model=make_model(), train_tokens=repetitive_stream(2000), progress=False)
    result = trainer.train()
    assert trainer.dataset.spec.short_len == 32  # min(seq_len, L = 64)
    assert any(is_short(0, step, 0.5) for step in range(4)) and not all(is_short(0, step, 0.5) for step in range(4))
    assert result.step == config.train.max_steps and np.isfinite(result.losses).all()
