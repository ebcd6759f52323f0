"""``model.shipped_scaling``: a checkpoint that arrives extended (Llama-3.1's llama3 RoPE) is never
re-scaled silently. Before: the trainer and the dry run replaced the shipped llama3 x8 by the recipe's
method (``replace=True``) without a word. Now the one rule of patch and recommend: the recipe's word, else
compose where the weights were trained with the shipped scaling (Llama 3.1) and replace where it was
switched on without training (a training-free patch, Qwen's YaRN); where nothing says, a refusal in one line
naming the key, before any weights load. The dry run and the trainer print which."""

from __future__ import annotations

from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.training.config import ConfigError, load_config
from ropescale.training.trainer import Trainer
from tests.conftest import tiny_model
from tests.models.test_config_check import no_weights  # noqa: F401 - fixture
from tests.training.conftest import char_tokenizer, recipe, repetitive_stream

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
LLAMA31 = SHAPES / "llama3.1-8b"
ULTRALONG = "llama3.1-8b/ultralong_yarn_x64_512k"
TINY_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 5e5,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _dry(capsys, *overrides: str) -> tuple[int, str, str]:
    code = main(["train", "--config", ULTRALONG, "--dry-run", "--model", str(LLAMA31), "--gpus", "8", *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dry_run_says_what_it_replaces(capsys):
    code, out, err = _dry(capsys)
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("shipped:"))
    assert (
        f"replaced: rope_type 'llama3' of {LLAMA31 / 'config.json'} (llama3 x8: 8,192 -> 131,072 tokens) is dropped"
        in line
    )
    assert "yarn x64 applies to the pretraining frequencies (model.shipped_scaling=replace)" in line
    assert "written:       yarn x64: 8,192 -> 524,288 tokens" in out


def test_a_recipe_that_does_not_say_follows_the_rule_on_llama31(capsys):
    """Llama 3.1's weights were trained with llama3 (the family table): unsaid, the recipe composes on it."""
    code, out, err = _dry(capsys, "model.shipped_scaling=null", "scaling.factor=4")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("shipped:"))
    assert "composed: yarn x4 applies on top of rope_type 'llama3'" in line and "(the rule: trained with it)" in line


def test_a_scaling_nothing_vouches_for_is_refused_in_one_line(capsys, tmp_path):
    import json

    data = json.loads((LLAMA31 / "config.json").read_text())
    data["rope_scaling"]["original_max_position_embeddings"] = 4096  # no family row
    (tmp_path / "config.json").write_text(json.dumps(data))
    argv = ["train", "--config", ULTRALONG, "--dry-run", "--model", str(tmp_path), "model.shipped_scaling=null"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"ropescale: error: {tmp_path / 'config.json'}: rope_parameters.rope_type = 'llama3' ")
    assert "set model.shipped_scaling=compose to build on it or replace" in err


def test_compose_is_planned_from_the_shipped_context(capsys):
    code, out, err = _dry(capsys, "model.shipped_scaling=compose", "scaling.factor=4")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("shipped:"))
    assert "composed: yarn x4 applies on top of rope_type 'llama3'" in line
    assert "(model.shipped_scaling=compose)" in line


def test_compose_from_a_shipped_context_the_recipe_gives(capsys):
    """Where config.json and the family table are wrong (a Llama 3.1 fine-tuned to 256k whose config still
    says 131,072), ``model.shipped_context`` is the context the composed factor multiplies, as
    ``--shipped-context`` is for patch and eval; the line names the key. Before, the key was unknown and the
    composition started from the family table's 131,072: yarn x4 reached 524,288, not 1,048,576."""
    code, out, err = _dry(capsys, "model.shipped_scaling=compose", "scaling.factor=4", "model.shipped_context=262144")
    assert code == 0, err
    assert "written:       yarn x4: 8,192 -> 1,048,576 tokens" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("shipped:"))
    assert "from its shipped context 262,144 as model.shipped_context gives it (model.shipped_scaling=compose)" in line
    code, out, err = _dry(capsys, "model.shipped_scaling=compose", "scaling.factor=4")
    line = next(ln for ln in out.splitlines() if ln.startswith("shipped:"))
    assert (
        "from its shipped context 131,072 as family table: Llama 3.1/3.3 gives it (model.shipped_scaling=compose)"
        in line
    )
    with pytest.raises(ConfigError, match=r"^model.shipped_context must be a positive token count .* got 0$"):
        load_config(ULTRALONG, ["model.shipped_context=0"])


def test_a_bad_value_names_the_key():
    with pytest.raises(ConfigError, match=r"^model.shipped_scaling must be one of replace, compose, got 'swap'$"):
        load_config(ULTRALONG, ["model.shipped_scaling=swap"])


def test_an_unscaled_checkpoint_needs_no_answer(capsys):
    """Llama-3-8B ships no scaling: its recipe (no model.shipped_scaling) runs as before."""
    assert main(["train", "--config", "llama3-8b/yarn_x8", "--dry-run", "--model", str(SHAPES / "llama3-8b")]) == 0
    out = capsys.readouterr().out
    assert "shipped:       " + str(SHAPES / "llama3-8b" / "config.json") + " carries no scaling; yarn x8 " in out


@pytest.mark.usefixtures("no_weights")
def test_the_trainer_refuses_before_weights(tmp_path):
    path = tmp_path / "tiny-llama31"
    tiny_model("llama", rope_parameters=dict(TINY_LLAMA3), max_position_embeddings=512).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    config = recipe(tmp_path, model={"name": str(path)})
    with pytest.raises(RopescaleError, match=r"rope_parameters.rope_type = 'llama3' .* set model.shipped_scaling="):
        Trainer(config, progress=False).setup()
    assert not config.output_dir.exists()


def test_the_trainer_prints_the_replacement_and_trains(tmp_path, capfd):
    model = tiny_model("llama", rope_parameters=dict(TINY_LLAMA3), max_position_embeddings=512)
    config = recipe(tmp_path, model={"shipped_scaling": "replace"}, train={"max_steps": 1})
    Trainer(config, model=model, train_tokens=repetitive_stream(), progress=False).train()
    err = capfd.readouterr().err
    assert (
        "ropescale: shipped scaling replaced: rope_type 'llama3' of the given model (llama3 x8: 64 -> 512 tokens) "
        "is dropped; yarn x4 applies to the pretraining frequencies" in err
    )
    assert model.config.rope_parameters["rope_type"] == "yarn" and model.config.max_position_embeddings == 256


def test_a_checkpoint_carrying_the_recipes_own_scaling_needs_no_answer(tmp_path, capfd):
    """A run's own export trained again under its recipe: nothing to replace; another training-free scaling
    is replaced by the rule, and said."""
    from ropescale.patching.model import patch

    config = recipe(tmp_path, train={"max_steps": 1})
    same = patch(tiny_model("llama", attn_implementation="sdpa"), "yarn", 4.0)
    Trainer(config, model=same, train_tokens=repetitive_stream(), progress=False).train()
    other = patch(tiny_model("llama", attn_implementation="sdpa"), "yarn", 2.0)
    capfd.readouterr()
    Trainer(recipe(tmp_path / "b"), model=other, train_tokens=repetitive_stream(), progress=False).setup()
    err = capfd.readouterr().err
    assert "replaced: rope_type 'yarn' of the given model (yarn x2: 64 -> 128 tokens)" in err
    assert "(the rule: applied without training)" in err
