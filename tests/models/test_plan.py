"""The plan (ropescale/models/plan.py) against every training-memory cell measured so far, and its parts.

The cells are read from benchmarks/README.md by benchmarks/measured_memory.py (a new measured table in
its "Training memory per step" section becomes a new cell here).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from ropescale.models import plan
from tests.conftest import load_script

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
measured = load_script("benchmarks/measured_memory.py")
bench = load_script("benchmarks/bench_train_memory.py")
CELLS = measured.cells()


def test_the_measured_cells_are_read():
    cards = {(c["card"], c["option"]) for c in CELLS}
    assert len(CELLS) >= 21 and {("H200", "plain"), ("H100", "offload+tiled"), ("CPU", "tiled")} <= cards
    assert sum(c["device"] == "cuda" for c in CELLS) >= 5


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: f"{c['shape']}-{c['card']}-{c['option']}-{c['length']}")
def test_plan_within_15_percent_of_every_measured_cell(cell):
    estimate, _ = measured.estimate(cell, bench.SHAPES)
    assert abs(estimate / cell["peak_mib"] - 1) <= 0.15, (estimate, cell)


def test_time_within_25_percent_on_the_calibrated_gpu_cells():
    """The 16k H200 cell includes CUDA's warm-up (one step per cell): left out, as in the calibration."""
    for cell in CELLS:
        if cell["device"] == "cuda" and cell["length"] >= 32768:
            _, tok_s = measured.estimate(cell, bench.SHAPES)
            assert abs(tok_s / cell["tok_s"] - 1) <= 0.25, (tok_s, cell)


@pytest.mark.parametrize("name", sorted(p.name for p in SHAPES.iterdir()))
def test_parameter_formula_equals_the_meta_model(name):
    config = transformers.AutoConfig.for_model(**json.loads((SHAPES / name / "config.json").read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = plan.Shape.from_config(config)
    assert shape.params() == sum(p.numel() for p in model.parameters())
    targets = list(shape.linear_shapes())
    lora = sum(
        16 * (m.in_features + m.out_features)
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets
    )
    assert shape.lora_params(targets, 16) == lora


def _llama3():
    config = json.loads((SHAPES / "llama3-8b" / "config.json").read_text())
    return plan.Shape.from_config(transformers.AutoConfig.for_model(**config))


def test_each_option_lowers_the_peak_by_what_it_removes():
    shape = _llama3()
    base = plan.Options(tokens=65536, trainable=shape.lora_params(["q_proj", "v_proj"], 8))
    plain = plan.train_estimate(shape, base)
    offload = plan.train_estimate(shape, plan.Options(**{**base.__dict__, "offload": True}))
    assert plain.peak - offload.peak == 32 * 65536 * 4096 * 2  # exactly the layer inputs
    tiled = plan.train_estimate(shape, plan.Options(**{**base.__dict__, "tile": 4096}))
    assert tiled.peak < plain.peak and tiled.seconds > plain.seconds  # one more MLP forward
    cp = plan.train_estimate(shape, plan.Options(**{**base.__dict__, "context_parallel": 2, "gpus": 2, "fsdp": True}))
    assert cp.parts["layer inputs"] == plain.parts["layer inputs"] / 2 and cp.tokens == 32768


def test_full_fine_tune_shards_under_fsdp():
    shape = _llama3()
    n = shape.params()
    one = plan.train_estimate(shape, plan.Options(tokens=8192, trainable=n, full=True))
    assert one.parts["weights"] + one.parts["gradients"] + one.parts["optimizer"] == 16 * n  # fp32 + grads + AdamW
    eight = plan.train_estimate(shape, plan.Options(tokens=8192, trainable=n, full=True, gpus=8, fsdp=True))
    assert eight.parts["optimizer"] == 8 * n / 8
    assert not plan.fits(one, plan.CARDS["h100-80gb"]) and plan.fits(eight, plan.CARDS["h100-80gb"])


def test_eval_memory_parts():
    shape = _llama3()
    est = plan.eval_estimate(shape, 131072, decode_tokens=16, card=plan.CARDS["h100-80gb"])
    assert est.parts["KV cache"] == 2 * 32 * 131072 * 1024 * 2  # 16 GiB
    assert est.parts["weights"] == shape.params() * 2
    ppl = plan.eval_estimate(shape, 131072, kv_cache=False)
    assert "KV cache" not in ppl.parts and ppl.seconds < est.seconds


def test_gpu_plan_check_smoke_on_the_cpu(tmp_path, capsys):
    """The GPU script's own code path, on tiny shapes of two families (the GPU run is for a GPU session)."""
    check = load_script("benchmarks/gpu_plan_check.py")
    argv = ["--smoke", "--eval-shapes", "qwen2.5-7b", "--recipes", "qwen3-8b/yarn_x4", "--output", str(tmp_path)]
    assert check.main(argv) == 0
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert [(c["kind"], c.get("mode")) for c in cells] == [("eval", "ppl")] * 2 + [("eval", "gen")] * 2 + [
        ("train", None)
    ]
    assert all("error" not in c and c["seconds"] > 0 and c["plan_mib"] > 0 for c in cells)


def test_context_parallel_counts_the_gathered_keys_and_values():
    """torch's CP (allgather) holds the whole window's K and V for one layer, and the shard's fp32 K/V gradients
    three times in its backward. Before: not counted."""
    shape = _llama3()
    base = plan.Options(tokens=524288, trainable=0, context_parallel=8, gpus=8, fsdp=True)
    est = plan.train_estimate(shape, base)
    assert est.parts["gathered K/V"] == 2 * 524288 * shape.kv_dim * 2 + 3 * 2 * 65536 * shape.kv_dim * 4
    assert "gathered K/V" not in plan.train_estimate(shape, plan.Options(tokens=65536, trainable=0)).parts


def test_a_plan_beyond_the_measured_cells_says_so():
    assert plan.outside_calibration(plan.Options(tokens=131072, trainable=0)) is None
    line = plan.outside_calibration(plan.Options(tokens=1048576, trainable=0, context_parallel=8, gpus=8, fsdp=True))
    assert (
        "131,072 tokens a GPU" not in line and "a 1,048,576-token window" in line and "context parallel over 8" in line
    )
