"""`auto` precision: bf16 where the CPU multiplies bf16 in hardware, fp32 elsewhere (the other tests pin
``ROPESCALE_CPU_BF16=0``; here both answers are asked for), in evaluation and in training recipes."""

from __future__ import annotations

import pytest
import torch

from ropescale.models import runtime as rt
from ropescale.models.runtime import cpu_has_bf16, resolve_runtime
from ropescale.training.config import ConfigError, load_config


@pytest.mark.parametrize(("flag", "dtype"), [("1", "bfloat16"), ("0", "float32")])
def test_auto_dtype_on_the_cpu_follows_the_bf16_hardware(monkeypatch, flag, dtype):
    monkeypatch.setenv("ROPESCALE_CPU_BF16", flag)
    assert cpu_has_bf16() is (flag == "1")
    assert resolve_runtime("cpu", "auto").dtype == dtype
    assert resolve_runtime("cpu", "float32").dtype == "float32"  # fp32 stays one flag away


def test_the_probe_reads_the_hardware_when_not_forced(monkeypatch):
    monkeypatch.delenv("ROPESCALE_CPU_BF16")
    flags = open("/proc/cpuinfo").read().split() if __import__("os").path.exists("/proc/cpuinfo") else []
    if flags:
        assert cpu_has_bf16() is ("amx_bf16" in flags or "avx512_bf16" in flags)


@pytest.mark.parametrize(
    ("amx", "avx512", "kernels"), [(True, True, "amx"), (False, True, "avx512_bf16"), (False, False, "emulated")]
)
def test_bf16_on_the_cpu_records_which_instructions_compute_it(monkeypatch, amx, avx512, kernels):
    """AMX and AVX512-BF16 round differently (greedy answers differ): a result says which it had, from
    the hardware, whatever ROPESCALE_CPU_BF16 says about the dtype."""
    monkeypatch.setenv("ROPESCALE_CPU_BF16", "1")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": amx, "avx512_bf16": avx512})
    assert rt.cpu_bf16_kernels() == kernels
    assert resolve_runtime("cpu", "bfloat16").to_dict() == {
        "device": "cpu",
        "dtype": "bfloat16",
        "attention": "sdpa",
        "kernels": kernels,
    }
    assert "kernels" not in resolve_runtime("cpu", "float32").to_dict()  # fp32: as before
    monkeypatch.delenv("ROPESCALE_CPU_BF16")
    assert cpu_has_bf16() is (kernels != "emulated")


@pytest.mark.parametrize(
    ("cap", "kernels"),
    [
        (None, "amx"),
        ("avx512_core_bf16", "avx512_bf16"),  # AMX off: the dot products an EPYC has
        ("AVX512_CORE", "emulated"),
        ("AVX2", "emulated"),
        ("AVX10_1_512_AMX", "amx"),
        ("AVX512_CORE_AMX", "amx"),
        ("DEFAULT", "amx"),
    ],
)
def test_a_onednn_isa_cap_is_what_computes_not_the_hardware(monkeypatch, cap, kernels):
    """ONEDNN_MAX_CPU_ISA keeps oneDNN below AMX (or below bf16 dot products): a cell measured so says
    the kernels that ran, not the ones the CPU has."""
    monkeypatch.setenv("ROPESCALE_CPU_BF16", "1")
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"amx_bf16": True, "avx512_bf16": True})
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert rt.cpu_bf16_kernels() == kernels
    assert resolve_runtime("cpu", "bfloat16").to_dict()["kernels"] == kernels
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX512_CORE_BF16")  # the older name
    assert rt.cpu_bf16_kernels() == "avx512_bf16"


def test_an_older_torch_without_the_public_probe_falls_back_to_the_private_ones(monkeypatch):
    """torch.cpu.get_capabilities() is recent; pyproject allows torch >= 2.3, which has only the private probes."""
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert rt.cpu_bf16_kernels() == "avx512_bf16"


@pytest.mark.parametrize(
    ("recipe", "flag", "dtype", "mp"),
    [
        ("smollm2-135m/pose_yarn_x4_cpu", "1", "bfloat16", "bf16"),  # LoRA: frozen base in bf16
        ("smollm2-135m/yarn_x4", "1", "float32", "bf16"),  # full: fp32 master weights, bf16 compute
        ("smollm2-135m/pose_yarn_x4_cpu", "0", "float32", "no"),
        ("smollm2-135m/yarn_x4", "0", "float32", "no"),
    ],
)
def test_training_precision_auto_is_resolved_when_the_recipe_loads(monkeypatch, recipe, flag, dtype, mp):
    monkeypatch.setenv("ROPESCALE_CPU_BF16", flag)
    c = load_config(recipe)
    assert (c.model.dtype, c.train.mixed_precision) == (dtype, mp)
    assert "auto" not in (c.to_dict()["model"]["dtype"], c.to_dict()["train"]["mixed_precision"])


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["model.dtype=bfloat16", "train.mixed_precision=no"], "model.dtype=bfloat16 with train.mixed_precision=no"),
        (["lora.enabled=false", "model.dtype=bfloat16", "train.mixed_precision=bf16"], "full fine-tune keeps float32"),
    ],
)
def test_precisions_that_cannot_train_are_refused_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        load_config("smollm2-135m/pose_yarn_x4_cpu", overrides)
    assert fragment in str(info.value) and "\n" not in str(info.value)
