"""benchmarks/bench_prefill_attention.py (issue 54): the alternative it times against SDPA's CPU kernel
computes the same causal attention (else the ratio compares different work), and a quick run writes
every figure with the machine and the load average. No figure of the quick run means anything."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_prefill_attention.py")


@pytest.mark.parametrize("length,block", [(300, 128), (256, 256), (97, 1024)])
def test_the_block_alternative_is_causal_attention(bench, length, block):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 3, length, 16, generator=gen) for _ in range(3))
    expected = bench.sdpa(q, k, v, torch)
    got = bench.blocks(q, k, v, torch, min(block, length))
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    # the last query sees every key, the first only itself
    assert torch.allclose(got[..., 0, :], v[..., 0, :], atol=1e-6)


def test_the_causal_work_counts_half_the_square(bench):
    assert bench.causal_flops(9, 16384, 64) == pytest.approx(309.2e9, rel=1e-3)


def test_a_quick_run_writes_every_figure(bench, tmp_path):
    out = tmp_path / "attention.json"
    assert bench.main(["--quick", "--repeats", "1", "--output", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/bench_prefill_attention.py --quick")
    assert [r["length"] for r in record["rows"]] == [256, 512]
    for row in record["rows"]:
        assert set(row["kernels"]) == {"sdpa", "blocks", "blocks, no softmax"}
        assert row["kernels"]["sdpa"]["ratio_to_sdpa"] == 1.0
        assert row["max_abs_difference"] < 0.05  # bf16
    assert {"cpu", "threads", "torch"} <= set(record["machine"])
    assert "load_avg_before" in record and "load_avg_after" in record


def test_the_backward_mode_gives_the_block_alternative_the_same_gradients_and_times_both(bench, tmp_path):
    """--backward compares training's work: autograd through the alternative must give SDPA's gradients."""
    gen = torch.Generator().manual_seed(2)
    leaves = [torch.randn(1, 3, 200, 16, generator=gen, requires_grad=True) for _ in range(3)]
    grad = torch.randn(1, 3, 200, 16, generator=gen)
    grads = []
    for fn in (lambda: bench.sdpa(*leaves, torch), lambda: bench.blocks(*leaves, torch, 64)):
        for t in leaves:
            t.grad = None
        fn().backward(grad)
        grads.append([t.grad.clone() for t in leaves])
    for ours, theirs in zip(*grads):
        assert torch.allclose(ours, theirs, atol=1e-5)
    out = tmp_path / "train-attention.json"
    assert bench.main(["--quick", "--backward", "--repeats", "1", "--output", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["timed"] == "forward and backward"
    row = record["rows"][0]  # the work counted is three times the forward's
    assert row["causal_gflop"] == pytest.approx(3 * bench.causal_flops(9, 256, 64) / 1e9)


def _has_cxx() -> bool:
    import shutil

    return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _has_cxx(), reason="flex_attention compiles through inductor: no C++ compiler here")
def test_flex_is_the_same_causal_attention_and_its_refusal_is_recorded_not_hidden(bench, tmp_path):
    """--flex times torch's compiled flex_attention beside SDPA: it must compute the same attention, and
    where torch refuses a mode on the CPU (the backward, torch 2.13) the row says torch's reason."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 128, 16, generator=gen) for _ in range(3))
    got, expected = bench.flex_kernel(128, torch)(q, k, v), bench.sdpa(q, k, v, torch)
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    out = tmp_path / "train-attention.json"
    assert bench.main(["--quick", "--backward", "--flex", "--repeats", "1", "--output", str(out)]) == 0
    flex = json.loads(out.read_text())["rows"][0]["kernels"]["flex (compiled)"]
    if "unsupported" in flex:  # torch's own words, naming the backward
        assert "backward" in flex["unsupported"].lower() and "seconds" not in flex
    else:  # a torch that runs it: timed as the others are
        assert flex["seconds"] > 0 and flex["ratio_to_sdpa"] > 0
