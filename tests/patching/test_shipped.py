"""Checkpoints that arrive already extended (issue 51): the model as shipped, and what a new scaling starts from.

The configs are the Hub's config.json files copied as they ship (tests/data/shapes); the rule is
ropescale.patching.shipped's: compose where the weights were trained with the shipped scaling (Llama 3.1/3.2,
a ropescale fine-tune), replace where it was switched on without training (Qwen's YaRN, a training-free patch),
ask where nothing says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

import ropescale
from ropescale.errors import AlreadyScaledError, RopescaleError
from ropescale.patching.model import apply_plan, patch_config
from ropescale.patching.plan import plan_patch
from ropescale.patching.shipped import shipped_of
from tests.conftest import tiny_config

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


def shape(name: str):
    return AutoConfig.from_pretrained(SHAPES / name)


@pytest.mark.parametrize(
    "name, shipped, pretraining, trained, source",
    [
        ("llama3.1-8b", 131072, 8192, True, "family table: Llama 3.1/3.3"),
        ("llama3.2-1b", 131072, 8192, True, "family table: Llama 3.2"),  # llama3 x32 would say 262,144
        ("qwen2.5-7b", 32768, 32768, None, "family table: Qwen2/Qwen2.5"),  # config states 131,072, no scaling
        ("qwen2.5-7b-yarn", 131072, 32768, False, "family table: Qwen2/Qwen2.5 with the YaRN switch"),
        ("qwen3-8b", 32768, 32768, None, "family table: Qwen3"),  # config states 40,960
        ("qwen3-8b-yarn", 131072, 32768, False, "family table: Qwen3 with the YaRN switch"),
        ("mistral-nemo-12b", 131072, 131072, None, "family table: Mistral-Nemo"),  # config states 1,024,000
        ("llama3-8b", 8192, 8192, None, "config.json max_position_embeddings"),
    ],
)
def test_the_shipped_and_pretraining_contexts_and_their_sources(name, shipped, pretraining, trained, source):
    got = shipped_of(shape(name))
    assert (got.context, got.pretraining, got.trained, got.context_source) == (shipped, pretraining, trained, source)


def test_the_users_shipped_context_wins_and_is_named():
    got = shipped_of(shape("llama3.1-8b"), shipped_context=65536)
    assert (got.context, got.context_source) == (65536, "--shipped-context")
    with pytest.raises(RopescaleError, match="below the pretraining context 8192"):
        shipped_of(shape("llama3.1-8b"), shipped_context=4096)


def test_llama31_past_its_128k_composes_on_llama3_from_the_shipped_context():
    plan = plan_patch(shape("llama3.1-8b"), "yarn", target_length=524288)
    assert plan.mode == "compose" and plan.method.name == "composed"
    assert plan.method.factor == 4 and plan.method.extended_context(plan.spec) == 524288
    assert plan.spec.original_max_position_embeddings == 8192  # the pretraining geometry underneath
    assert plan.start == (
        "composed on the shipped llama3 x8 (trained with it: family table: Llama 3.1/3.3), from the shipped "
        "context 131072 (family table: Llama 3.1/3.3)"
    )
    assert plan.method.label() == "yarn x4 on llama3 x8"


def test_llama31_within_its_128k_is_already_covered():
    """Before: `recommend`/`patch` threw the llama3 scaling away for yarn x8 at 64k, a length it serves."""
    with pytest.raises(RopescaleError, match="target length 65536 is within the shipped context 131072"):
        plan_patch(shape("llama3.1-8b"), "yarn", target_length=65536)
    plan = plan_patch(shape("llama3.1-8b"), "yarn", target_length=65536, replace=True)  # asked: replaced, said
    assert plan.mode == "replace" and plan.method.factor == 8 and "--replace" in plan.start


def test_qwens_yarn_switch_is_replaced_from_the_pretraining_frequencies():
    for name in ("qwen3-8b-yarn", "qwen2.5-7b-yarn"):
        plan = plan_patch(shape(name), "yarn", target_length=262144)
        assert plan.mode == "replace" and plan.method.name == "yarn" and plan.method.factor == 8
        assert plan.start.startswith("replaced the shipped yarn x4 (applied without training: family table: Qwen")
        composed = plan_patch(shape(name), "yarn", target_length=262144, compose=True)  # asked: composed, said
        assert composed.mode == "compose" and composed.method.factor == 2 and "--compose" in composed.start


def test_a_scaling_nothing_vouches_for_asks_in_one_line():
    """rope_type alone cannot tell (Yarn-Mistral-128k was trained with YaRN, Qwen's is a switch)."""
    config = tiny_config(
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64},
        max_position_embeddings=256,
    )
    with pytest.raises(AlreadyScaledError) as info:
        plan_patch(config, "yarn", factor=2)
    assert "pass --compose to build on it" in str(info.value) and "\n" not in str(info.value)
    assert (
        plan_patch(config, "yarn", factor=2, compose=True).method.extended_context(
            plan_patch(config, "yarn", factor=2, compose=True).spec
        )
        == 512
    )


def test_a_ropescale_fine_tune_composes_and_a_training_free_patch_replaces():
    base = tiny_config()
    free = patch_config(base, "yarn", factor=2)
    assert plan_patch(free, "yarn", factor=2).mode == "replace"
    tuned = base.__class__.from_dict(base.to_dict())
    apply_plan(tuned, plan_patch(base, "yarn", factor=2), fine_tuned=True)  # what `ropescale export` writes
    plan = plan_patch(tuned, "yarn", factor=2)
    assert plan.mode == "compose" and "ropescale provenance: a fine-tune" in plan.start
    assert plan.method.shipped_context == 128 and plan.method.extended_context(plan.spec) == 256


def test_attention_level_methods_compose_on_request():
    """Before: refused ("... rotates with plain RoPE ..."). Now composed on the shipped YaRN, from its 128 tokens
    (the attention itself: tests/attention/test_composed_attention.py)."""
    config = tiny_config(
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 64},
        max_position_embeddings=128,
    )
    plan = plan_patch(config, "self_extend", factor=2, compose=True)
    assert plan.method.label() == "self_extend x2 on yarn x2" and plan.attention_mode == "self_extend"
    assert plan.method.extended_context(plan.spec) == 256 and "--compose" in plan.start


def test_compose_on_plain_rope_is_refused():
    with pytest.raises(RopescaleError, match="carries none"):
        plan_patch(tiny_config(), "yarn", factor=2, compose=True)


def test_a_composed_checkpoint_reloads_with_its_frequencies(tmp_path):
    """Saved as LongRoPE with equal factors: plain transformers 5 builds the composed frequencies and
    attention factor, and ropescale.from_pretrained rebuilds the composition from its provenance."""
    import torch
    from transformers import AutoModelForCausalLM

    rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
    model = ropescale.patch(
        ropescale.models.tiny.tiny_model("llama", rope_parameters=rope, max_position_embeddings=512),
        "yarn",
        factor=4,
        compose=True,
    )
    plan = plan_patch(model.config, "none", replace=True)  # (just to prove replace is reachable)
    assert plan.method.name == "default"
    ropescale.save_pretrained(model, tmp_path / "ckpt")
    inv, attention = model.model.rotary_emb.inv_freq, model.model.rotary_emb.attention_scaling
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    torch.testing.assert_close(plain.model.rotary_emb.inv_freq, inv, rtol=1e-6, atol=0)
    assert abs(plain.model.rotary_emb.attention_scaling - attention) < 1e-9
    again = ropescale.from_pretrained(tmp_path / "ckpt")
    assert again.config.ropescale["method"] == "composed" and again.config.ropescale["mode"] == "compose"
    torch.testing.assert_close(again.model.rotary_emb.inv_freq, inv, rtol=1e-6, atol=0)


def test_search_says_its_candidates_replace_the_shipped_scaling():
    from ropescale.search.pipeline import shipped_line

    assert shipped_line(shape("llama3.1-8b")) == (
        "ropescale: search: every candidate replaces the shipped llama3 x8 (trained with it: family table: "
        "Llama 3.1/3.3), starting from the pretraining frequencies at 8192; the model as shipped is measured "
        "beside them (saved)"
    )


def test_every_family_row_is_in_the_guide():
    from ropescale.patching.shipped import FAMILIES

    guide = (Path(__file__).resolve().parents[2] / "docs" / "extended-checkpoints.md").read_text()
    for family in FAMILIES:
        assert f"| {family.name} " in guide, family.name
