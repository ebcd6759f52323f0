"""Attention-level methods on a checkpoint its maker already extended (Llama 3.1's llama3 RoPE, a YaRN
Qwen), issue 51: the same compose/replace rule as the frequency methods (ropescale.patching.shipped).
Composed, they rotate with the shipped frequencies and attention factor at their remapped positions, their
sizes measured in the shipped context (tests/attention/test_composed_attention.py checks the attention
against a hand-written reference); replaced, they run from the pretraining frequencies and context; where
neither a family row nor provenance decides, one line asks for --compose or --replace.

Before: every case was refused in one line ("string on an already extended model (...): ropescale's string
rotates with plain RoPE from the original 64 tokens ... give --model the base model ..."), with or without
--replace."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

import ropescale
from ropescale.errors import AlreadyScaledError
from ropescale.methods.composed import ATTENTION_ON_TOP
from ropescale.patching.plan import plan_patch
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.conftest import tiny_config, tiny_model
from tests.models.test_config_check import no_weights  # noqa: F401 - fixture

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
#: llama3 on an original context no family row names: nothing decides compose or replace
UNDECIDED = {
    "rope_type": "llama3",
    "rope_theta": 5e5,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
ATTENTION_METHODS = list(ATTENTION_ON_TOP)
FACTOR = {"self_extend": 2, "self_extend_llamacpp": 2, "dca": 2, "string": 1.05}  # within each method's reach


@pytest.mark.parametrize("method", ATTENTION_METHODS)
@pytest.mark.parametrize(
    "shape, mode, start",
    [
        ("llama3.1-8b", "compose", "composed on the shipped llama3 x8 (trained with it: family table: Llama 3.1/3.3)"),
        ("qwen2.5-7b-yarn", "replace", "replaced the shipped yarn x4 (applied without training: family table: Qwen2"),
        ("qwen3-8b-yarn", "replace", "replaced the shipped yarn x4 (applied without training: family table: Qwen3"),
    ],
)
def test_the_rule_decides_on_a_known_family(shape, mode, start, method):
    plan = plan_patch(AutoConfig.from_pretrained(SHAPES / shape), method, factor=FACTOR[method])
    assert plan.mode == mode and plan.start.startswith(start) and plan.attention_mode == method
    if mode == "compose":  # the second method, measured from the shipped context
        assert plan.method.name == "composed" and plan.method.shipped_context == 131072
        assert plan.method.attention_view(plan.spec)[1].original_max_position_embeddings == 131072
    else:
        assert plan.method.name == method and plan.spec.original_max_position_embeddings == 32768


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_where_nothing_decides_it_asks_and_either_flag_answers(method):
    config = tiny_config("llama", rope_parameters=dict(UNDECIDED), max_position_embeddings=512)
    with pytest.raises(AlreadyScaledError) as info:
        ropescale.patch_config(config, method, factor=FACTOR[method])
    line = str(info.value)
    assert "\n" not in line and "--compose" in line and "--replace" in line
    assert "already extended model" not in line  # the old refusal no longer fires
    composed = ropescale.patch_config(config, method, factor=FACTOR[method], compose=True).ropescale
    assert composed["method"] == "composed" and composed["params"]["on_top"]["method"] == method
    assert composed["params"]["shipped_context"] == 512 and composed["mode"] == "compose"
    replaced = ropescale.patch_config(config, method, factor=FACTOR[method], replace=True).ropescale
    assert replaced["method"] == method and replaced["original_max_position_embeddings"] == 64


@pytest.mark.usefixtures("no_weights")
def test_cli_asks_in_one_line_before_weights(tmp_path, capsys):
    path = tmp_path / "llama3-undecided"
    tiny_model(rope_parameters=dict(UNDECIDED), max_position_embeddings=512).save_pretrained(path)
    code, _, err = run(capsys, "patch", "--model", str(path), "--method", "string", "--factor", "1.05")
    assert code == 2
    assert_one_line_error(code, err, "ships with llama3 x8", "pass --compose", "or --replace")
    assert "already extended model" not in err


def test_patch_says_it_composed_and_doctor_names_what_cannot_be_expressed(tmp_path, capsys):
    path, out = tmp_path / "llama31", tmp_path / "out"
    rope = {**UNDECIDED, "original_max_position_embeddings": 8192}  # the Llama 3.1 row
    tiny_model(rope_parameters=rope, max_position_embeddings=131072).save_pretrained(path)
    code, printed, err = run(
        capsys, "patch", "--model", str(path), "--method", "dca", "--target-length", "262144", "--output", str(out)
    )
    assert code == 0, err
    assert "wrote dca x2 on llama3 x8 checkpoint" in printed
    assert (
        "composed on the shipped llama3 x8 (trained with it: family table: Llama 3.1/3.3), from the shipped " in printed
    )
    note = "note: dca x2 on the shipped llama3 x8 (composed) cannot be expressed outside ropescale"
    assert note in printed
    code, printed, _ = run(capsys, "doctor", str(out))
    assert (
        note in printed and "needs ropescale: dca x2 on the shipped llama3 x8 (composed) is not expressible" in printed
    )
    assert (
        "note: composed cannot" not in printed
    )  # before: named "composed", which engines do read when saved as LongRoPE
    code, printed, _ = run(capsys, "patch", "--model", str(path), "--method", "self_extend", "--factor", "2")
    assert "method:             self_extend x2 on llama3 x8 (factor 2, group_size=3, window=1024" in printed
    assert "starts:             composed on the shipped llama3 x8" in printed


def test_a_composed_attention_checkpoint_reloads_as_composed(tmp_path):
    import torch

    rope = {**UNDECIDED, "original_max_position_embeddings": 8192}
    model = ropescale.patch(
        tiny_model(rope_parameters=rope, max_position_embeddings=131072, attn_implementation="sdpa"),
        "string",
        shift=16,
        local_window=4,
    )
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    again = ropescale.from_pretrained(tmp_path / "ckpt", attn_implementation="sdpa")
    assert again.model.rotary_emb.shift == 16 and again.model.rotary_emb.spec.original_max_position_embeddings == 131072
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, before)


def test_doctor_knows_every_attention_method():
    from ropescale.interop.verdict import _ATTENTION_METHODS

    assert _ATTENTION_METHODS == ATTENTION_ON_TOP


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_a_checkpoint_ropescale_scaled_is_repatched_from_its_recorded_original(method):
    """ropescale's own scaled checkpoints record their true original geometry: re-patching is allowed."""
    config = ropescale.patch_config(tiny_config("llama"), "yarn", factor=4)
    new = ropescale.patch_config(config, method, factor=1.25, replace=True)
    assert new.ropescale["method"] == method and new.ropescale["original_max_position_embeddings"] == 64


def test_composed_sizes_are_checked_against_the_shipped_context():
    """STRING alone reaches L + shift − local_window; composed, L is the shipped 512 and the line says so."""
    config = tiny_config("llama", rope_parameters=dict(UNDECIDED), max_position_embeddings=512)
    with pytest.raises(ValueError) as info:
        ropescale.patch_config(config, "string", factor=1.25, compose=True)
    assert str(info.value) == (
        "string on the shipped llama3 x8, measured in the shipped context 512 (its 'original context' below): "
        "STRING with plain RoPE reaches 552 tokens (L + shift - local_window), less than factor 1.25 x 512; add "
        "frequencies=yarn, or use a smaller factor"
    )
