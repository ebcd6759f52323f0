"""llama.cpp itself runs the exported file like ropescale runs the patched model (same perplexity under
llama-perplexity's protocol, same tokens). Runs only when $LLAMA_PERPLEXITY names the binary
(``llama-tokenize`` is used when it sits beside it)."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
import torch

from ropescale import patch
from ropescale.export import export_gguf
from ropescale.export.llamacpp import llama_tokenize, perplexity_protocol_nll, run_llama_perplexity
from tests.export.conftest import tiny_llama, tiny_tokenizer
from tests.export.test_gguf_forms import qwen

BINARY = os.environ.get("LLAMA_PERPLEXITY", "")
pytestmark = pytest.mark.skipif(
    not Path(BINARY).is_file(), reason="set LLAMA_PERPLEXITY to llama.cpp's llama-perplexity binary to run"
)
N_CTX = 256  # 4x the tiny model's trained 64
WORDS = ["the", "then", "an", "ant", "theatre", "hen", "ate", "cat", "tea", "net", "Zoë's", "3", "\n"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    random.seed(0)
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(" ".join(random.choice(WORDS) for _ in range(700)), encoding="utf-8")
    return path


def sharp_model(method=None, arch="llama", **kw):
    """A tiny Llama (or Qwen2/Qwen3, with random biases and q/k norms) whose attention and output are
    peaky enough for positions to move the perplexity."""
    overrides = kw.pop("config", {})
    model = tiny_llama(seed=0, **overrides) if arch == "llama" else qwen(arch, **overrides)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.mul_(8)
            attn.k_proj.weight.mul_(8)
            for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
                if norm is not None:  # Qwen3 normalises q and k per head: sharpen after the norm
                    norm.weight.mul_(3)
        model.lm_head.weight.mul_(8)
    return patch(model, method, **kw) if method else model


@pytest.mark.parametrize(
    "method, kw",
    [
        (None, {}),
        ("linear", {"factor": 4}),
        ("ntk", {"factor": 4}),
        ("yarn", {"factor": 4}),
        ("yarn", {"factor": 4, "attention_factor": 1.3}),
        ("llama3", {"factor": 4}),
        ("longrope", {"factor": 4, "long_factor": [1.0 + i for i in range(8)], "kv_consistent": False}),
    ],
)
def test_llama_cpp_perplexity_matches_ropescale(tmp_path, text, method, kw):
    check_perplexity(tmp_path, text, method, dict(kw), discriminates=method is not None)


def check_perplexity(tmp_path, text, method, kw, arch="llama", discriminates=True):
    """llama-perplexity on the exported file equals ropescale's perplexity under its protocol (0.1 %),
    and (``discriminates``) differs from the unscaled model's by more than 1 %."""
    tokenizer = tiny_tokenizer("gpt2")
    model = sharp_model(method, arch, **kw)
    gguf = export_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=tokenizer)
    theirs, _, log = run_llama_perplexity(BINARY, gguf, text, N_CTX, threads=1)
    ids = tokenizer(text.read_text(encoding="utf-8"))["input_ids"]
    nll, n = perplexity_protocol_nll(model, ids, N_CTX)
    ours = math.exp(nll / n)
    assert theirs / ours == pytest.approx(1.0, abs=1e-3), log[-500:]
    if discriminates:  # the check can tell scalings apart: the unscaled model is further off
        unscaled_nll, n = perplexity_protocol_nll(sharp_model(None, arch), ids, N_CTX)
        assert abs(theirs / math.exp(unscaled_nll / n) - 1) > 1e-2


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
EQUAL = [1.0 + i for i in range(8)]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize(
    "method, kw",
    [(None, {}), ("linear", {"factor": 4}), ("yarn", {"factor": 4}), ("yarn", {"factor": 4, "attention_factor": 1.3})],
)
def test_llama_cpp_runs_qwen_like_ropescale(tmp_path, text, arch, method, kw):
    """llama.cpp's qwen2/qwen3 architectures (biases, q/k norms, NeoX rotation, YaRN keys) on the file export-gguf writes."""
    check_perplexity(tmp_path, text, method, dict(kw), arch, discriminates=method is not None)


@pytest.mark.parametrize(
    "kw, discriminates",
    [
        # Llama 3.1's numbers from the tiny model's trained context, where 4L tokens reach every regime
        (
            {"config": {"rope_parameters": {**LLAMA31, "rope_theta": 10000.0, "original_max_position_embeddings": 64}}},
            True,
        ),
        # Llama 3.1's config as published (8192 original tokens): the file must still agree
        (
            {
                "config": {
                    "rope_parameters": {**LLAMA31, "rope_theta": 5e5, "original_max_position_embeddings": 8192},
                    "max_position_embeddings": 131072,
                }
            },
            False,
        ),
    ],
    ids=["llama31-from-64", "llama31-as-published"],
)
def test_llama_cpp_runs_a_llama3_scaled_checkpoint_from_rope_freqs(tmp_path, text, kw, discriminates):
    check_perplexity(tmp_path, text, None, dict(kw), discriminates=discriminates)


def test_llama_cpp_runs_longrope_with_equal_factors_from_rope_freqs(tmp_path, text):
    """The form composed scalings are saved in: rope_freqs and rope.scaling.attn_factor."""
    check_perplexity(tmp_path, text, "longrope", {"factor": 4, "long_factor": EQUAL, "short_factor": EQUAL})


def test_llama_cpp_tokenizes_a_qwen2_checkpoint_like_transformers(tmp_path, text):
    """The tokenizer transformers builds for a Qwen2 checkpoint (Qwen's split regex) as llama.cpp's ``qwen2``."""
    from ropescale.models.loading import load_tokenizer

    tokenize = Path(BINARY).with_name("llama-tokenize")
    if not tokenize.is_file():
        pytest.skip(f"{tokenize} not built")
    qwen("qwen2").save_pretrained(tmp_path / "q")
    tiny_tokenizer("gpt2").save_pretrained(tmp_path / "q")
    tokenizer = load_tokenizer(str(tmp_path / "q"))
    gguf = export_gguf(str(tmp_path / "q"), tmp_path / "q.gguf", "f32")
    assert llama_tokenize(tokenize, gguf, text) == tokenizer(text.read_text(encoding="utf-8"))["input_ids"]


@pytest.mark.parametrize("kind", ["gpt2", "spm"])
def test_llama_cpp_tokenizes_like_the_hf_tokenizer(tmp_path, text, kind):
    tokenize = Path(BINARY).with_name("llama-tokenize")
    if not tokenize.is_file():
        pytest.skip(f"{tokenize} not built")
    tokenizer = tiny_tokenizer(kind)
    gguf = export_gguf(tiny_llama(), tmp_path / "t.gguf", "f32", tokenizer=tokenizer)
    assert llama_tokenize(tokenize, gguf, text) == tokenizer(text.read_text(encoding="utf-8"))["input_ids"]
