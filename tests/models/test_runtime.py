"""Device / dtype / attention resolution: ``auto`` per machine, explicit values checked up front.

CUDA and flash-attn are simulated (this machine has neither); what the GPU run itself does is
measured by ``benchmarks/bench_gpu_perplexity.py`` on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from ropescale.errors import RopescaleError
from ropescale.models import runtime as rt
from ropescale.models.runtime import Runtime, resolve_runtime


@pytest.fixture
def gpu(monkeypatch):
    """A machine with a CUDA device (bf16-capable) and flash-attn installed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(rt, "flash_attn_installed", lambda: True)


def test_auto_on_the_cpu_is_fp32_sdpa(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_runtime() == Runtime("cpu", "float32", "sdpa")
    assert resolve_runtime(None, None, None) == Runtime("cpu", "float32", "sdpa")


def test_auto_on_a_gpu_is_bf16_flash_attention(gpu):
    assert resolve_runtime() == Runtime("cuda", "bfloat16", "flash_attention_2")
    assert resolve_runtime(device="cpu") == Runtime("cpu", "float32", "sdpa")  # the CPU asked for explicitly
    assert resolve_runtime(dtype="float32") == Runtime("cuda", "float32", "sdpa")  # flash-attn has no fp32


def test_auto_falls_back_to_sdpa_and_fp16_where_the_gpu_lacks_them(gpu, monkeypatch):
    monkeypatch.setattr(rt, "flash_attn_installed", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_runtime() == Runtime("cuda", "float16", "sdpa")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"device": "cuda"}, "torch sees no CUDA device"),
        ({"device": "cuda:1"}, "torch sees no CUDA device"),
        ({"device": "tpu9"}, "device must be cpu, cuda"),
        ({"dtype": "int8"}, "dtype must be auto or one of"),
        ({"attention": "flash"}, "attention must be auto or one of"),
        ({"attention": "flash_attention_2"}, "CUDA device only"),
    ],
)
def test_bad_settings_fail_in_one_line(kwargs, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RopescaleError, match=message):
        resolve_runtime(**kwargs)


def test_flash_attention_needs_16_bit_and_the_package(gpu, monkeypatch):
    with pytest.raises(RopescaleError, match="bfloat16 or float16"):
        resolve_runtime(dtype="float32", attention="flash_attention_2")
    monkeypatch.setattr(rt, "flash_attn_installed", lambda: False)
    with pytest.raises(RopescaleError, match="pip install flash-attn"):
        resolve_runtime(attention="flash_attention_2")


def test_load_kwargs_and_placement():
    r = Runtime("cpu", "bfloat16", "eager")
    assert r.load_kwargs() == {"dtype": torch.bfloat16, "attn_implementation": "eager"}
    model = torch.nn.Linear(2, 2)
    assert r.place(model) is model
    assert r.to_dict() == {"device": "cpu", "dtype": "bfloat16", "attention": "eager"}


def test_training_picks_flash_attention_the_same_way(gpu):
    from ropescale.training.trainer import resolve_attn_implementation

    assert resolve_attn_implementation("auto", "bfloat16") == "flash_attention_2"
    assert resolve_attn_implementation("auto", "float32") == "sdpa"
    assert resolve_attn_implementation("eager", "bfloat16") == "eager"
