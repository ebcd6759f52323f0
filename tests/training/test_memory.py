"""Longer windows, same math: activation checkpointing, offloading its inputs, MLP tiles and the chunked
loss give the plain path's loss and gradients (fp32, every combination), in the trainer too."""

from __future__ import annotations

import itertools

import pytest
import torch

from ropescale.training.memory import TILED_ATTR, check_mlp_tiling, decoder_mlps, offloaded_checkpoint, tile_mlps
from ropescale.training.modeling import CausalLMLoss, apply_memory_options, wrap_lora
from ropescale.training.trainer import Trainer
from tests.training.conftest import recipe, repetitive_stream

SEQ = 40  # not a multiple of the tile: the last tile is short


def _loss_and_grads(tmp_path, make_model, checkpointing, offload, tile, chunk):
    config = recipe(
        tmp_path,
        lora={"trainable": ["embed", "norm"], "target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj"]},
        train={
            "gradient_checkpointing": checkpointing,
            "offload_activations": offload,
            "mlp_tile_tokens": tile,
            "loss_chunk": chunk,
        },
    )
    peft_model = wrap_lora(make_model(initializer_range=0.1), config)
    apply_memory_options(peft_model.get_base_model(), config)
    module = CausalLMLoss(peft_model, config.train.loss_chunk).train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 128, (2, SEQ), generator=gen)
    positions = torch.cat([torch.arange(20), torch.arange(20) + 57]).expand(2, -1)  # a PoSE skip
    labels = ids.clone()
    labels[:, 20] = -100
    loss = module(ids, positions, labels)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.requires_grad}
    return loss.detach(), grads


OPTIONS = [
    (ckpt, offload, tile, chunk)
    for ckpt, offload, tile, chunk in itertools.product([False, True], [False, True], [0, 16], [1024, 7])
    if ckpt or not offload  # offloading moves the checkpointed inputs: it needs checkpointing
]


@pytest.mark.parametrize("ckpt, offload, tile, chunk", OPTIONS)
def test_every_combination_gives_the_plain_gradients(tmp_path, make_model, ckpt, offload, tile, chunk):
    want_loss, want = _loss_and_grads(tmp_path / "plain", make_model, False, False, 0, 1024)
    loss, got = _loss_and_grads(tmp_path / "opt", make_model, ckpt, offload, tile, chunk)
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6)
    assert got.keys() == want.keys() and any(".mlp.gate_proj.lora_B" in n for n in got)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any(g.abs().amax() > 0 for g in got.values())


def test_offloaded_checkpoint_moves_the_saved_inputs_through_host_memory(monkeypatch):
    seen = []
    real = torch.autograd.graph.save_on_cpu

    class Spy(real):
        def __init__(self, pin_memory=False, device_type="cuda"):
            super().__init__(pin_memory=pin_memory, device_type=device_type)
            pack = self.pack_hook

            def spy_pack(t):
                seen.append(tuple(t.shape))
                return pack(t)

            self.pack_hook = spy_pack

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Spy)
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(5, 5, requires_grad=True)
    y = offloaded_checkpoint(lambda a: torch.tanh(a @ w) @ w, x)
    y.sum().backward()
    assert seen == [(3, 5)]  # only the checkpoint's input; what the layer saves is recomputed, not stored
    assert x.grad is not None and w.grad is not None


def test_tiles_wrap_every_mlp_once_and_undo(make_model):
    model = make_model()
    assert check_mlp_tiling(model) is None
    assert tile_mlps(model, 8) == 2 and tile_mlps(model, 4) == 2  # re-tiling replaces, never nests
    assert all(getattr(m, TILED_ATTR) == 4 for m in decoder_mlps(model))
    ids = torch.randint(0, 128, (1, 30))
    with torch.no_grad():
        tiled = model(ids).logits
        tile_mlps(model, 0)
        plain = model(ids).logits
    assert not any(hasattr(m, TILED_ATTR) or "forward" in vars(m) for m in decoder_mlps(model))
    torch.testing.assert_close(tiled, plain, rtol=1e-5, atol=1e-5)
    assert {n for n, _ in model.named_parameters()} == {n for n, _ in make_model().named_parameters()}


def test_trainer_with_every_memory_option_reaches_the_plain_weights(tmp_path, make_model):
    stream = repetitive_stream()
    runs = {}
    for label, train in (
        ("plain", {"gradient_checkpointing": False}),
        ("all", {"gradient_checkpointing": True, "offload_activations": True, "mlp_tile_tokens": 8, "loss_chunk": 5}),
    ):
        config = recipe(tmp_path / label, lora={"trainable": ["norm"]}, train={"max_steps": 3, **train})
        trainer = Trainer(config, model=make_model(), train_tokens=stream, progress=False)
        runs[label] = (trainer.train().losses, {n: p.detach() for n, p in trainer.peft_model.named_parameters()})
    assert runs["all"][0] == pytest.approx(runs["plain"][0], rel=1e-5)
    for name, want in runs["plain"][1].items():
        torch.testing.assert_close(runs["all"][1][name], want, rtol=1e-4, atol=1e-6, msg=name)
