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


def sharp_model(method=None, **kw):
    """A tiny Llama whose attention and output are peaky enough for positions to move the perplexity."""
    model = tiny_llama(seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
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
    tokenizer = tiny_tokenizer("gpt2")
    model = sharp_model(method, **kw)
    gguf = export_gguf(model, tmp_path / "m.gguf", "f32", tokenizer=tokenizer)
    theirs, _, log = run_llama_perplexity(BINARY, gguf, text, N_CTX, threads=1)
    ids = tokenizer(text.read_text(encoding="utf-8"))["input_ids"]
    nll, n = perplexity_protocol_nll(model, ids, N_CTX)
    ours = math.exp(nll / n)
    assert theirs / ours == pytest.approx(1.0, abs=1e-3), log[-500:]
    if method is not None:  # the check can tell scalings apart: the unscaled model is further off
        unscaled_nll, n = perplexity_protocol_nll(sharp_model(), ids, N_CTX)
        assert abs(theirs / math.exp(unscaled_nll / n) - 1) > 1e-2


@pytest.mark.parametrize("kind", ["gpt2", "spm"])
def test_llama_cpp_tokenizes_like_the_hf_tokenizer(tmp_path, text, kind):
    tokenize = Path(BINARY).with_name("llama-tokenize")
    if not tokenize.is_file():
        pytest.skip(f"{tokenize} not built")
    tokenizer = tiny_tokenizer(kind)
    gguf = export_gguf(tiny_llama(), tmp_path / "t.gguf", "f32", tokenizer=tokenizer)
    assert llama_tokenize(tokenize, gguf, text) == tokenizer(text.read_text(encoding="utf-8"))["input_ids"]
