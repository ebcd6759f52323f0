"""The legacy config.json keys: written by hand per method (transformers 4.57's field names), and
read back by transformers 5 as the same scaling."""

from __future__ import annotations

import json
import math

import pytest
import transformers

import ropescale
from ropescale.interop.legacy import legacy_keys, with_legacy_keys
from tests.conftest import ORIGINAL_CONTEXT, tiny_config, tiny_model

L, BASE = ORIGINAL_CONTEXT, 10000.0
LONG = [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]

# method, factor, params, the legacy keys expected (by hand, from transformers 4.57 modeling_rope_utils)
CASES = [
    (
        "linear",
        4,
        {},
        {
            "rope_scaling": {"type": "linear", "rope_type": "linear", "factor": 4.0},
            "rope_theta": BASE,
            "max_position_embeddings": L,  # vLLM and SGLang serve it x factor = the extended context
        },
    ),
    ("ntk", 4, {}, {"rope_scaling": None, "rope_theta": BASE * 4 ** (16 / 14), "max_position_embeddings": 4 * L}),
    (
        "dynamic_ntk",
        4,
        {},
        {
            "rope_scaling": {"type": "dynamic", "rope_type": "dynamic", "factor": 4.0},
            "rope_theta": BASE,
            "max_position_embeddings": L,
        },
    ),
    (
        "yarn",
        8,
        {"beta_fast": 16, "attention_factor": 1.0},
        {
            "rope_scaling": {
                "type": "yarn",
                "rope_type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": L,
                "beta_fast": 16,
                "beta_slow": 1.0,
                "truncate": True,
                "attention_factor": 1.0,
                "attn_factor": 1.0 / (0.1 * math.log(8) + 1),  # what vLLM < 0.30 and SGLang read
            },
            "rope_theta": BASE,
            "max_position_embeddings": 8 * L,
            "original_max_position_embeddings": L,
        },
    ),
    (
        "llama3",
        8,
        {},
        {
            "rope_scaling": {
                "type": "llama3",
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": L,
            },
            "rope_theta": BASE,
            "max_position_embeddings": 8 * L,
            "original_max_position_embeddings": L,
        },
    ),
    (
        "longrope",
        4,
        {"long_factor": LONG},
        {
            "rope_scaling": {
                "type": "longrope",
                "rope_type": "longrope",
                "factor": 4.0,
                "long_factor": LONG,
                "short_factor": [1.0] * 8,
                "original_max_position_embeddings": L,
            },
            "rope_theta": BASE,
            "max_position_embeddings": 4 * L,
            "original_max_position_embeddings": L,
        },
    ),
]


@pytest.mark.parametrize("method,factor,params,expected", CASES, ids=[c[0] for c in CASES])
def test_legacy_keys_per_method(method, factor, params, expected):
    config = ropescale.patch_config(tiny_config(), method, factor=factor, **params)
    got = legacy_keys(config)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float):
            assert got[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("method,factor,params,expected", CASES, ids=[c[0] for c in CASES])
def test_transformers_5_reads_the_legacy_keys_as_the_same_scaling(method, factor, params, expected):
    """transformers 5 gives rope_scaling precedence: it must rebuild exactly rope_parameters."""
    config = ropescale.patch_config(tiny_config(), method, factor=factor, **params)
    data = with_legacy_keys(json.loads(config.to_json_string(use_diff=False)))
    assert data["rope_scaling"] == expected["rope_scaling"]
    reread = transformers.LlamaConfig(**data)
    want = {k: v for k, v in config.rope_parameters.items()}
    got = {k: v for k, v in reread.rope_parameters.items() if k not in ("type", "attn_factor")}  # engines' key
    assert got == want


def test_saved_checkpoint_carries_the_keys_and_reloads_the_same(tmp_path, long_input):
    model = ropescale.patch(tiny_model(), "yarn", factor=4)
    ropescale.save_pretrained(model, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "config.json").read_text())
    assert data["rope_scaling"]["rope_type"] == "yarn" and data["rope_scaling"]["factor"] == 4.0
    assert data["rope_theta"] == BASE and data["original_max_position_embeddings"] == L
    assert data["rope_parameters"]["rope_type"] == "yarn"
    import torch

    reloaded = ropescale.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(long_input).logits, model(long_input).logits, rtol=0, atol=1e-5)


def test_non_native_checkpoint_has_no_rope_scaling(tmp_path):
    with pytest.warns(UserWarning, match="dynamic_yarn cannot be expressed outside ropescale"):
        ropescale.save_pretrained(
            ropescale.patch(tiny_model(), "dynamic_yarn", factor=4), tmp_path / "o", config_only=True
        )
    data = json.loads((tmp_path / "o" / "config.json").read_text())
    assert data["rope_scaling"] is None and data["rope_theta"] == BASE
    assert data["model_type"] == "ropescale_llama"


def test_kv_consistent_save_warns_what_other_loaders_get(tmp_path):
    with pytest.warns(UserWarning, match="load it as plain dynamic_ntk, whose cached keys keep the frequencies"):
        ropescale.save_pretrained(
            ropescale.patch(tiny_model(), "dynamic_ntk", factor=4), tmp_path / "o", config_only=True
        )


def test_stale_original_context_is_removed_and_partial_rotary_kept():
    data = {
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0, "partial_rotary_factor": 0.5},
    }
    out = with_legacy_keys(data)
    assert "original_max_position_embeddings" not in out
    assert out["partial_rotary_factor"] == 0.5 and out["rope_scaling"]["factor"] == 4.0
    assert with_legacy_keys({"model_type": "llama"}) == {"model_type": "llama"}  # nothing to mirror


def test_longrope_pins_the_attention_factor_when_the_field_is_not_factor_times_L():
    rope = {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "factor": 2.5,
        "original_max_position_embeddings": 100,
        "long_factor": [1.0],
        "short_factor": [1.0],
    }
    scaling = legacy_keys({"max_position_embeddings": 251, "rope_parameters": rope})["rope_scaling"]
    assert scaling["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(2.5) / math.log(100)))
    exact = legacy_keys({"max_position_embeddings": 250, "rope_parameters": rope})["rope_scaling"]
    assert "attention_factor" not in exact


def test_patch_cli_config_only_writes_the_keys_and_the_verdict(tmp_path, capsys):
    from ropescale.cli.main import main

    src = tmp_path / "src"
    tiny_model().save_pretrained(src)
    code = main(
        [
            "patch",
            "--model",
            str(src),
            "--method",
            "llama3",
            "--factor",
            "8",
            "--output",
            str(tmp_path / "out"),
            "--config-only",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads((tmp_path / "out" / "config.json").read_text())
    assert data["rope_scaling"]["rope_type"] == "llama3"
    assert "loaders: llama3: every loader keeps it" in out and "loses" not in out  # the answer, in one line
    assert "transformers 4.45-4.57" not in out  # the table only on request
    capsys.readouterr()
    assert (
        main(
            ["patch", "--model", str(src), "--method", "llama3", "--factor", "8", "--verbose"]
            + ["--output", str(tmp_path / "out2"), "--config-only"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "transformers 4.45-4.57" in out and "keeps" in out and "loses" not in out
