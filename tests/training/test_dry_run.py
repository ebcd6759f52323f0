"""``ropescale train --dry-run``: every shipped recipe on a config-only model of its family's real shape.

The shapes are the families' published config.json files (tests/data/shapes/, no weights, nothing
downloaded); the model is built on the meta device. The printed trainable-parameter count is held
against a count made here by hand from config.json (embeddings, LoRA's r x (in + out) per target,
norms), independent of transformers and peft.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.training.config import CONFIGS_DIR, load_config

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
RECIPES = sorted(CONFIGS_DIR.rglob("*.yaml"))
#: recipe folder -> the shape of the family it is for (a new folder needs its shape here)
RECIPE_SHAPES = {
    "llama2-7b": "llama2-7b",
    "llama3-8b": "llama3-8b",
    "llama3.1-8b": "llama3.1-8b",
    "mistral-7b": "mistral-7b-v0.1",
    "mistral-7b-v0.3": "mistral-7b-v0.3",
    "qwen2.5-7b": "qwen2.5-7b",
    "qwen3-8b": "qwen3-8b",
    "smollm2-135m": "smollm2-135m",
}


def count_by_hand(cfg: dict, recipe) -> tuple[int, int]:
    """(trainable, total) parameters of a Llama/Mistral/Qwen2/Qwen3 config.json under a recipe."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    q, k = heads * hd, kv * hd
    linears = {
        "q_proj": (h, q),
        "k_proj": (h, k),
        "v_proj": (h, k),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    bias = q + 2 * k if cfg["model_type"] == "qwen2" else 0
    norms = 2 * h + (2 * hd if cfg["model_type"] == "qwen3" else 0)
    embed = cfg["vocab_size"] * h
    head = 0 if cfg.get("tie_word_embeddings") else embed
    total = embed + head + n * (sum(a * b for a, b in linears.values()) + bias + norms) + h
    if not recipe.lora.enabled:
        return total, total
    lora = n * sum(recipe.lora.r * sum(linears[m]) for m in recipe.lora.target_modules)
    extra = (embed if "embed" in recipe.lora.trainable else 0) + (
        n * norms + h if "norm" in recipe.lora.trainable else 0
    )
    return lora + extra, total


def test_every_recipe_folder_has_a_shape():
    assert {p.parent.name for p in RECIPES} <= set(RECIPE_SHAPES)
    for shape in RECIPE_SHAPES.values():
        assert (SHAPES / shape / "config.json").is_file()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS_DIR)))
def test_dry_run_of_every_recipe_on_its_family_shape(path, capsys):
    shape = SHAPES / RECIPE_SHAPES[path.parent.name]
    code = main(["train", "--config", str(path), "--dry-run", "--model", str(shape), "--gpus", "8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    recipe = load_config(path, [f"model.name={shape}"])
    cfg = json.loads((shape / "config.json").read_text())
    trainable, total = count_by_hand(cfg, recipe)
    shown = re.search(r"trainable: +([\d,]+) of ([\d,]+) parameters", out)
    assert shown, out
    assert (int(shown[1].replace(",", "")), int(shown[2].replace(",", ""))) == (trainable, total)
    if recipe.lora.enabled:
        assert f"training:      LoRA r={recipe.lora.r} " in out
    else:
        assert "training:      full fine-tune" in out and "LoRA" not in out
    t = recipe.train
    dp = 8 // t.context_parallel
    assert f"= {t.batch_size * t.grad_accum * dp * recipe.data.seq_len:,} per optimizer step" in out
    written = re.search(r"written: +\S+ x[\d.]+: ([\d,]+) -> ([\d,]+) tokens", out)
    original, extended = (int(g.replace(",", "")) for g in written.groups())
    assert extended == round(original * recipe.scaling.factor)
    if recipe.pose.enabled and recipe.pose.target_length:
        assert recipe.pose.target_length <= extended
    assert re.search(r"memory: +[\d.]+ GiB peak per GPU of 79.6 GiB: fits", out), out  # every recipe fits an H100
    if recipe.eval.every or recipe.eval.at_end:  # and so does its evaluation, in the training process
        assert re.search(r"evaluation: +perplexity at [\d,]+ tokens .*: [\d.]+ GiB peak per GPU, fits;", out), out
    if recipe.eval.every and recipe.eval.max_tokens:  # and what the run's last line can say of its curve
        assert re.search(r"\n +\d+ windows? a point: ", out), out
    if path.parent.name != "smollm2-135m":  # a GPU recipe: its header says why it has no CPU hours
        head = re.sub(r"\n#\s*", " ", path.read_text().split("\nmodel:")[0])
        said = re.search(
            r"CPU hours: none, a GPU recipe: one optimizer step \(([\d,]+) tokens through ([\d.]+)B parameters.*?"
            r"~(\d+) (hours|days) on 2 cores .*?the (\d+) steps ~([\d.]+) CPU-years.*? ropescale train --config (\S+) "
            r"--dry-run --gpu h100-80gb --gpus \d+ --model (\S+)",
            head,
        )
        assert said, path.name
        tokens, billions = int(said[1].replace(",", "")), float(said[2])
        assert f"= {tokens:,} per optimizer step" in out and abs(billions * 1e9 - total) < 0.05e9
        hours = 6 * total * tokens / 490e9 / 3600  # the header's convention: 6 FLOP a parameter a token
        assert abs(int(said[3]) * (24 if said[4] == "days" else 1) - hours) <= max(1, 0.5 * 24 * (said[4] == "days"))
        assert abs(float(said[6]) - hours * t.max_steps / 8766) <= 0.05 and int(said[5]) == t.max_steps
        assert said[7] == f"{path.parent.name}/{path.stem}" and said[8] == f"tests/data/shapes/{shape.name}"


def test_the_plan_says_what_its_held_out_windows_let_the_last_line_judge(capsys):
    """eval.max_tokens / eval.length windows a point: with 4 or more the run's last line gives a paired
    verdict on the held-out curve; with fewer the plan says so, before any step is taken."""
    shape = SHAPES / "smollm2-135m"
    cases = [("65536", "4 windows a point: the run's last line says whether the held-out curve levelled off")]
    cases += [("32768", "2 windows a point: the interval of the held-out curve's last change is wide")]
    cases += [("16384", "1 window a point: the run's last line judges the held-out curve by its perplexity alone")]
    for tokens, said in cases:
        argv = ["train", "--config", "smollm2-135m/yarn_x2_cpu", "--dry-run", "--model", str(shape)]
        assert main([*argv, f"eval.max_tokens={tokens}"]) == 0
        out = capsys.readouterr().out
        assert said in out and out.count(" a point: ") == 1, out


@pytest.mark.parametrize(
    "recipe, original",
    [
        ("qwen2.5-7b/yarn_x4", 32768),
        ("qwen3-8b/yarn_x4", 32768),
        ("mistral-7b/yarn_x8", 8192),
        ("llama3-8b/yarn_x8", 8192),
    ],
)
def test_trained_context_is_the_families_own(recipe, original, capsys):
    """Qwen2.5-7B's config says 131072 and Qwen3-8B's 40960, Mistral-7B-v0.1's 32768: the recipes say
    what the models were trained at, so factor 4 reaches 131072 (Qwen's own YaRN config)."""
    shape = SHAPES / RECIPE_SHAPES[recipe.split("/")[0]]
    assert main(["train", "--config", recipe, "--dry-run", "--model", str(shape)]) == 0
    out = capsys.readouterr().out
    factor = load_config(recipe).scaling.factor
    assert f"{original:,} -> {int(original * factor):,} tokens" in out
    assert f"original_max_position_embeddings={original}" in out


def test_a_full_fine_tune_is_not_printed_as_lora(capsys):
    """The bug: yarn_x4_recall (lora.enabled: false) printed `lora: r=8 ... on q,k,v,o`."""
    shape = SHAPES / "smollm2-135m"
    assert main(["train", "--config", "smollm2-135m/yarn_x4_recall", "--dry-run", "--model", str(shape)]) == 0
    out = capsys.readouterr().out.split("---")[0]
    assert "full fine-tune" in out and "r=8" not in out and "q_proj" not in out
    assert "trainable:     134,515,008 of 134,515,008 parameters (100.00 %)" in out


def test_without_a_config_the_recipe_is_still_checked(capsys):
    assert main(["train", "--config", "llama3-8b/yarn_x8", "--dry-run"]) == 0  # Hub id, offline, not cached
    out = capsys.readouterr().out
    assert "model config:  not read, so no parameter count and no plan" in out and "--model PATH" in out
    assert "tokens/step:   65,536 a window" in out


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--gpu", "h100"], "unknown --gpu 'h100'; known: h100-80gb"),
        (["--gpus", "0"], "--gpus must be a positive integer, got 0"),
        (
            ["pose.enabled=true", "pose.target_length=65536"],
            "pose.target_length 65536 exceeds the scaled context 32768",
        ),
        (["lora.target_modules=[qkv_proj]"], "the model has no module named 'qkv_proj'"),
    ],
)
def test_what_cannot_run_is_one_line(extra, fragment, capsys):
    argv = ["train", "--config", "llama3-8b/yarn_x4", "--dry-run", "--model", str(SHAPES / "llama3-8b"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("gpu", ["h100-80gb", "l40s-48gb", "rtx4090-24gb"])
def test_a_step_that_does_not_fit_says_what_to_turn_on(gpu, capsys):
    """The advice is recipe overrides; applying them, the same plan fits."""
    argv = ["train", "--config", "llama3-8b/yarn_x8", "--dry-run", "--model", str(SHAPES / "llama3-8b"), "--gpu", gpu]
    longer = ["train.mlp_tile_tokens=0", "data.seq_len=131072", "scaling.factor=16"]
    assert main([*argv, *longer]) == 0
    out = capsys.readouterr().out
    assert "does NOT fit" in out
    tips = re.search(r"to fit: +(.*)", out)[1].split("; then ")
    overrides = []
    for tip in tips:
        cp = re.fullmatch(
            r"(train.context_parallel=\d+) (--gpus \d+) \(launch with configs/accelerate/fsdp2_cp.yaml\)", tip
        )
        overrides += [cp[1], *cp[2].split()] if cp else [tip]
    assert all(re.fullmatch(r"(train|data)\.\w+=\w+|--gpus|\d+", o) for o in overrides), tips
    assert main([*argv, *longer, *overrides]) == 0
    assert re.search(r"memory: +[\d.]+ GiB peak per GPU of [\d.]+ GiB: fits", capsys.readouterr().out)


def test_a_cached_hub_config_is_enough(tmp_path):
    """A Hub id whose config.json alone is in the Hugging Face cache (offline): the full dry run."""
    import os
    import subprocess
    import sys

    repo = tmp_path / "hub" / "models--meta-llama--Meta-Llama-3-8B"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123" / "config.json").write_text((SHAPES / "llama3-8b" / "config.json").read_text())
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "ropescale.cli.main", "train", "--config", "llama3-8b/yarn_x4", "--dry-run"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    assert "model config:  meta-llama/Meta-Llama-3-8B (cached Hub config)" in out
    assert "trainable:     567,545,856 of 8,030,261,248 parameters" in out


@pytest.mark.parametrize(
    "recipe, shape, length",
    [
        ("llama3.1-8b/ultralong_yarn_x64_512k", "llama3.1-8b", 524288),
        ("llama3.1-8b/ultralong_yarn_x128_1m", "llama3.1-8b", 1048576),
        ("qwen2.5-7b/yarn_x16_512k", "qwen2.5-7b", 524288),
        ("qwen3-8b/yarn_x16_512k", "qwen3-8b", 524288),
    ],
)
def test_512k_and_1m_plans_shard_the_window_and_say_they_extrapolate(recipe, shape, length, capsys):
    """Each GPU holds length / 8 tokens (context parallel 8); the plan counts the window's gathered keys and
    values, the offloaded layer inputs' host memory, and says it lies outside the measured cells.
    Before: no such recipes; the plan had no gathered K/V and no word on its range."""
    cfg = json.loads((SHAPES / shape / "config.json").read_text())
    launch = ["--accelerate-config", str(CONFIGS_DIR.parent / "accelerate" / "fsdp2_cp8.yaml")]
    code = main(
        ["train", "--config", recipe, "--dry-run", "--gpu", "h100-80gb", "--gpus", "8", "--model", str(SHAPES / shape)]
        + launch
    )
    out = capsys.readouterr().out
    assert code == 0
    assert f"({length // 8:,} tokens a GPU)" in out and "context parallel 8" in out
    assert f"1 data-parallel x 8 context-parallel ranks; each rank holds {length // 8} of {length} tokens" in out
    kv_dim = cfg["num_key_value_heads"] * (cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    assert f"gathered K/V {(2 * length * kv_dim * 2 + 6 * length // 8 * kv_dim * 4) / 2**30:.1f}" in out
    host = cfg["num_hidden_layers"] * length // 8 * cfg["hidden_size"] * 2 / 2**30
    assert f"host memory: {host:.1f} GiB pinned per GPU" in out
    assert f"calibration: outside the measured cells (one GPU, 128k tokens at most): a {length:,}-token window" in out
    assert "shipped:       " in out and "(model.shipped_scaling=replace)" in out


def test_tokens_per_device_divide_by_the_context_parallel_ranks(capsys):
    """Before: `8388608 tokens per device per step` for 8 windows of 1M over 8 CP ranks (each holds 1/8)."""
    shape = SHAPES / "llama3.1-8b"
    assert main(["train", "--config", "llama3.1-8b/ultralong_yarn_x128_1m", "--dry-run", "--model", str(shape)]) == 0
    assert "(1048576 tokens per device per step: 1/8 of each window)" in capsys.readouterr().out


def test_a_context_parallel_launch_the_real_launch_refuses_is_refused(capsys, monkeypatch):
    """The dry run calls the launch's own check (parallel.check_processes): no plan of 3 GPUs in groups of 2."""
    from ropescale.errors import RopescaleError
    from ropescale.training.parallel import parallelism_config

    argv = ["train", "--config", "llama3-8b/yarn_x4", "--dry-run", "--model", str(SHAPES / "llama3-8b")]
    cp = ["train.context_parallel=2", "data.packing=stream"]
    assert main([*argv, "--gpus", "3", *cp]) == 2
    out, err = capsys.readouterr()
    assert "plan:" not in out and len(err.strip().splitlines()) == 1, err
    assert "ropescale: error: train.context_parallel=2 needs a multiple of 2 processes, got 3 (--gpus 3; " in err
    # nothing says the launch: the fewest GPUs it accepts, one context-parallel group
    assert main([*argv, *cp]) == 0
    assert "x 2 (FSDP, context parallel 2)" in capsys.readouterr().out
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(RopescaleError) as launch:
        parallelism_config(2)
    assert str(launch.value).startswith("train.context_parallel=2 needs a multiple of 2 processes, got 3 (")
    assert main([*argv, "--gpus", "4", *cp]) == 0
    assert "x 4 (FSDP, context parallel 2)" in capsys.readouterr().out


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "num_hidden_layers"])
def test_a_config_without_its_shape_is_not_planned_with_defaults(key, tmp_path, capsys):
    """transformers fills a missing hidden_size with 4096: the plan would size another model."""
    cfg = json.loads((SHAPES / "smollm2-135m" / "config.json").read_text())
    del cfg[key]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    argv = ["train", "--config", "smollm2-135m/yarn_x4", "--dry-run", "--model", str(tmp_path / "m")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "plan:" not in out and "not read" not in out and len(err.strip().splitlines()) == 1, err
    assert f"ropescale: error: {tmp_path / 'm'}/config.json: {key} = (missing): the model's shape is unknown" in err
    assert main(["eval", "perplexity", "--model", str(tmp_path / "m"), "--lengths", "1024", "--dry-run"]) == 2
    assert f"{key} = (missing): the model's shape is unknown" in capsys.readouterr().err
