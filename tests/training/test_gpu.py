"""One training step on the GPU (skipped without CUDA): bf16 autocast, flash-attn 2 when installed,
every memory option on; the loss is finite and the LoRA weights move."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tests.training.conftest import recipe, repetitive_stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def gpu_accelerator(monkeypatch):
    """An Accelerator on the GPU: the other training tests pin accelerate's shared state to the CPU."""
    from accelerate.state import AcceleratorState

    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize(
    "attention", ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
)
def test_one_training_step_on_the_gpu(tmp_path, make_model, gpu_accelerator, attention):
    from ropescale.training.trainer import Trainer

    config = recipe(
        tmp_path,
        model={"name": "tiny-llama", "attn_implementation": attention},
        lora={"trainable": ["norm"]},
        train={
            "max_steps": 1,
            "mixed_precision": "bf16",
            "gradient_checkpointing": True,
            "offload_activations": True,
            "mlp_tile_tokens": 16,
        },
    )
    model = make_model(attn_implementation=attention).to(torch.bfloat16)
    trainer = Trainer(config, model=model, train_tokens=repetitive_stream(), progress=False)
    trainer.setup()
    before = {n: p.detach().clone() for n, p in trainer.peft_model.named_parameters() if "lora_B" in n}
    result = trainer.train()
    assert trainer.accelerator.device.type == "cuda" and next(trainer.peft_model.parameters()).is_cuda
    assert len(result.losses) == 1 and math.isfinite(result.losses[0])
    moved = [n for n, p in trainer.peft_model.named_parameters() if "lora_B" in n and not torch.equal(p, before[n])]
    assert moved and len(moved) == len(before)
