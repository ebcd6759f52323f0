"""Recipes: every shipped YAML validates (and goes through the CLI); bad input is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ropescale.cli.main import main
from ropescale.training.config import (
    CONFIGS_DIR,
    ConfigError,
    apply_overrides,
    config_from_dict,
    load_config,
)

RECIPES = sorted(CONFIGS_DIR.rglob("*.yaml"))
ACCELERATE = sorted((CONFIGS_DIR.parent / "accelerate").glob("*.yaml"))
MINIMAL = {"model": {"name": "m"}, "scaling": {"method": "yarn", "factor": 4}}


def test_the_required_recipes_are_shipped():
    names = {str(p.relative_to(CONFIGS_DIR)) for p in RECIPES}
    for required in (
        "llama2-7b/yarn_x4.yaml",
        "llama2-7b/yarn_x8.yaml",
        "llama2-7b/yarn_x16.yaml",
        "llama2-7b/pi_x4_longlora.yaml",
        "smollm2-135m/pose_yarn_x4_cpu.yaml",
    ):
        assert required in names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS_DIR)))
def test_shipped_recipe_validates_and_round_trips(path):
    config = load_config(path)
    assert config.name == path.stem
    assert config_from_dict(config.to_dict()) == config
    if config.pose.enabled:
        assert config.pose.target_length is None or config.pose.target_length >= config.data.seq_len


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(CONFIGS_DIR)))
def test_shipped_recipe_dry_run_through_the_cli(path, capsys, tmp_path):
    code = main(["train", "--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "recipe:" in out and f"output:        {tmp_path / 'out'}" in out
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_yarn_recipes_carry_the_paper_hyper_parameters():
    for factor in (4, 8, 16):
        c = load_config(f"llama2-7b/yarn_x{factor}")
        assert (c.scaling.method, c.scaling.factor) == ("yarn", factor)
        assert (c.optim.lr, c.optim.warmup_steps, c.optim.betas, c.optim.weight_decay) == (2e-5, 20, [0.9, 0.95], 0.0)
        assert c.train.max_steps == 400
        assert c.data.seq_len == 4096 * factor


def test_longlora_recipe():
    c = load_config("llama2-7b/pi_x4_longlora")
    assert (c.scaling.method, c.scaling.factor) == ("linear", 4)
    assert (c.lora.r, c.lora.alpha, c.lora.target_modules) == (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert c.lora.trainable == ["embed", "norm"] and c.s2attn.enabled


def test_cpu_recipe_is_pose_on_the_embedded_model():
    c = load_config("smollm2-135m/pose_yarn_x4_cpu")
    assert c.model.name == "smollm2-135m" and (c.scaling.method, c.scaling.factor) == ("yarn", 4)
    assert c.pose.enabled and c.pose.target_length == 4 * 8192 and 1024 <= c.data.seq_len <= 2048
    assert c.lora.r == 8 and c.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert "Emma" in c.data.holdout


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs(path):
    data = yaml.safe_load(path.read_text())
    assert data["distributed_type"] in ("MULTI_GPU", "FSDP")
    if data["distributed_type"] == "FSDP":
        fsdp = data["fsdp_config"]
        # LoRA mixes frozen and trainable parameters in a unit: FSDP2, or FSDP1 with use_orig_params
        assert fsdp["fsdp_version"] == 2 or fsdp["fsdp_use_orig_params"] is True
    assert {p.name for p in ACCELERATE} >= {"ddp.yaml", "fsdp.yaml", "fsdp2_cp.yaml"}


def test_overrides_are_typed():
    raw = apply_overrides(
        MINIMAL, ["lora.r=16", "optim.lr=1e-4", "pose.enabled=true", "lora.trainable=[embed, norm]", "name=x"]
    )
    c = config_from_dict(raw)
    assert (c.lora.r, c.optim.lr, c.pose.enabled, c.lora.trainable, c.name) == (16, 1e-4, True, ["embed", "norm"], "x")
    assert MINIMAL == {"model": {"name": "m"}, "scaling": {"method": "yarn", "factor": 4}}  # not modified
    nested = config_from_dict(apply_overrides(MINIMAL, ["scaling.params={attention_factor: 1.07}"]))
    assert nested.scaling.params == {"attention_factor": 1.07}  # a method parameter: a mapping as one value
    with pytest.raises(ConfigError, match=r"a mapping as one value: 'scaling.params=\{attention_factor"):
        apply_overrides(MINIMAL, ["scaling.params.attention_factor=1.07"])


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"lora": {"rank": 8}}, "unknown key 'lora.rank'; known: r, alpha, dropout"),
        ({"lora": {"dropuot": 0.1}}, "unknown key 'lora.dropuot' (did you mean 'dropout'?)"),
        ({"trian": {}}, "unknown section 'trian' (did you mean 'train'?)"),
        ({"lora": {"r": "eight"}}, "lora.r must be an integer"),
        ({"optim": {"schedule": "cosine_with_restarts"}}, "optim.schedule must be one of linear, cosine, constant"),
        ({"scaling": {"method": "yarn", "factor": 0.5}}, "scaling:"),
        ({"scaling": {"method": "nope", "factor": 4}}, "scaling:"),
        ({"s2attn": {"enabled": True, "group_ratio": 0.3}}, "even group size"),
        ({"pose": {"enabled": True, "target_length": 100}}, "pose.target_length (100) must be at least data.seq_len"),
        ({"lora": {"trainable": ["lm_head"]}}, "lora.trainable entries must be among embed, norm"),
        ({"model": {"name": ""}}, "model.name is required"),
        ({"optim": {"betas": [0.9]}}, "optim.betas must be two numbers"),
    ],
)
def test_bad_recipes_fail_with_one_line(raw, fragment):
    merged = {k: dict(v) for k, v in MINIMAL.items()}
    for section, values in raw.items():
        merged[section] = {**merged.get(section, {}), **values}
    with pytest.raises(ConfigError) as info:
        config_from_dict(merged)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_cli_errors_are_one_line(capsys, tmp_path):
    for name, text in (("damaged", "model: ["), ("list", "- model")):  # a run folder whose config.yaml is damaged
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(text)
    for argv, fragment in [
        (["train", "--config", "no/such/recipe", "--dry-run"], "training recipe 'no/such/recipe' not found"),
        (["train", "--config", "smollm2-135m/pose_yarn_x4_cpu", "lora.r", "--dry-run"], "override must be KEY=VALUE"),
        (
            ["train", "--config", "smollm2-135m/pose_yarn_x4_cpu", "optim.learning_rate=4", "--dry-run"],
            "unknown key 'optim.learning_rate'",
        ),
        (["export", str(tmp_path / "nothing"), "--output", str(tmp_path / "o")], "not a training run folder"),
        (["export", str(tmp_path / "damaged"), "--output", str(tmp_path / "o")], "config.yaml is not valid YAML"),
        (["export", str(tmp_path / "list"), "--output", str(tmp_path / "o")], "must be a mapping of sections"),
    ]:
        code = main(argv)
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("ropescale: error:"), err
        assert fragment in lines[0], lines[0]


def test_recipe_given_by_name_or_path():
    by_name = load_config("smollm2-135m/pose_yarn_x4_cpu")
    by_path = load_config(Path(CONFIGS_DIR) / "smollm2-135m" / "pose_yarn_x4_cpu.yaml")
    assert by_name == by_path
