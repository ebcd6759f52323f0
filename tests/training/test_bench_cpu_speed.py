"""benchmarks/bench_cpu_speed.py (issue 54): its FLOP count is the issue's (172 tokens/s of
yarn_x4_long's 2048-token full fine-tune ≈ 212 GFLOP/s), and one quick run on a tiny random model goes
through every part (matmul rate, a recipe's optimizer steps, prefill) and writes the JSON with the
machine and the load average before and after. No figure of the quick run means anything."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_cpu_speed.py")


SMOLLM2 = SimpleNamespace(
    hidden_size=576,
    intermediate_size=1536,
    vocab_size=49152,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
)


def test_the_flop_count_is_the_issues(bench):
    s = bench.shapes(SMOLLM2)
    assert bench.weights(s) == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) + 576 * 49152  # 134.5M
    per_token = bench.train_flops_per_token(s, 2048, lora=False)
    assert 172 * per_token / 1e9 == pytest.approx(212, abs=1)  # issue 54: 172 tokens/s ≈ 212 GFLOP/s
    assert bench.train_flops_per_token(s, 2048, lora=True) < per_token  # no weight gradients of frozen weights
    # prefill: the forward third without the head; attention grows with the window
    assert bench.prefill_flops_per_token(s, 32768) > 5 * bench.prefill_flops_per_token(s, 4096) / 2


def test_a_quick_run_measures_every_part_and_writes_the_machine_and_load(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    out = tmp_path / "speed.json"
    argv = ["--quick", "--steps", "1", "--warmup", "1", "--repeats", "1", "--output", str(out), "--profile", "256"]
    argv += ["--recipes", "smollm2-135m/yarn_x2_cpu"]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert set(result["machine"]) >= {"cpu", "threads", "bf16_kernels", "flags", "torch"}
    assert "load_avg_before" in result and "load_avg_after" in result
    assert set(result["matmul"]["rate"]) == {"bfloat16", "float32"}
    (train,) = result["training"]
    assert train["recipe"] == "smollm2-135m/yarn_x2_cpu" and train["tokens_per_s"] > 0
    assert train["step_tokens"] == 2 * 64 and "share_of_bf16_matmul" in train  # grad_accum 2 of 64-token windows
    assert train["ceiling"]["attention_layer_s"] > 0 and train["ceiling"]["gflops"] > 0
    assert [p["length"] for p in result["prefill"]] == [128, 256, 512]
    assert result["profile"] and all(op["self_s"] >= 0 for op in result["profile"])  # where a prefill's time goes
    printed = capsys.readouterr().out
    assert "bf16 matmul rate on the model's shapes" in printed and "% of it" in printed and "load average" in printed


def test_the_ceiling_is_the_steps_flops_over_attention_as_timed_and_the_rest_at_the_matmul_rate(bench, monkeypatch):
    """With SDPA's attention taking 0.05 s a layer and window (forward and backward), SmolLM2-135M's
    4,096-token step of two 2,048-token windows spends 30 · 2 · 0.05 = 3 s in it; the rest, 6N a token at
    2,000 GFLOP/s, 6 · 134.5M · 4,096 / 2e12 = 1.65 s: the step cannot beat its FLOPs over 4.65 s."""
    import torch

    s = bench.shapes(SMOLLM2)
    monkeypatch.setattr(bench, "_timed", lambda fn: 0.05)
    per_token = bench.train_flops_per_token(s, 2048, lora=False)
    row = {
        "recipe": "r",
        "seq_len": 2048,
        "step_tokens": 4096,
        "lora": False,
        "step_s": 10.0,
        "flops_per_token": per_token,
    }
    ceiling = bench.attention_ceiling(s, row, 2000.0, 2, torch)
    rest = 6 * bench.weights(s) * 4096 / 2e12
    assert ceiling["attention_step_s"] == pytest.approx(3.0)
    assert ceiling["rest_at_matmul_rate_s"] == pytest.approx(rest) and rest == pytest.approx(1.65, abs=0.01)
    assert ceiling["gflops"] == pytest.approx(per_token * 4096 / (3.0 + rest) / 1e9)
    assert ceiling["share_of_bf16_matmul"] == pytest.approx(ceiling["gflops"] / 2000.0)
    assert ceiling["attention_share_of_step"] == pytest.approx(0.3)
    lora = bench.attention_ceiling(s, {**row, "lora": True}, 2000.0, 2, torch)
    assert lora["rest_at_matmul_rate_s"] == pytest.approx(rest * 4 / 6)  # no weight gradients of frozen weights
