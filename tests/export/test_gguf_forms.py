"""GGUF export of Qwen2 and Qwen3 (llama.cpp's qwen2/qwen3 architectures) and of the per-dimension
forms of the llama architecture (Llama 3.1's scaling, LongRoPE with short = long factors) as a
``rope_freqs`` tensor. Expected values are computed here from the formulas llama.cpp and its
converter use, never by the exporter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropescale import patch
from ropescale.export import NotExpressibleError, export_gguf
from tests.conftest import ORIGINAL_CONTEXT, tiny_model
from tests.export.conftest import VOCAB, tiny_tokenizer
from tests.export.test_gguf import read

gguf = pytest.importorskip("gguf")
HEAD_DIM = 16


def qwen(arch: str, seed: int = 0, **overrides):
    """A tiny Qwen2/Qwen3 with non-trivial biases (Qwen2) and q/k norms (Qwen3), so that a tensor
    written under the wrong name, permuted, or left out changes the logits."""
    model = tiny_model(arch, seed=seed, vocab_size=VOCAB, **overrides)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                if proj.bias is not None:
                    proj.bias.copy_(0.1 * torch.randn(proj.bias.shape, generator=gen))
            for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
                if norm is not None:
                    norm.weight.copy_(1 + torch.rand(norm.weight.shape, generator=gen))
    return model


def rope_keys(meta, arch):
    return {k.removeprefix(f"{arch}.rope."): v for k, v in meta.items() if k.startswith(f"{arch}.rope.")}


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_tensors_are_named_as_llama_cpp_loads_them_and_not_permuted(tmp_path, arch):
    model = qwen(arch)
    meta, tensors = read(export_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tiny_tokenizer()))
    assert meta["general.architecture"] == arch and meta[f"{arch}.block_count"] == 2
    assert meta[f"{arch}.context_length"] == ORIGINAL_CONTEXT and meta[f"{arch}.attention.head_count_kv"] == 2
    per_layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
    extra = {"attn_q.bias", "attn_k.bias", "attn_v.bias"} if arch == "qwen2" else {"attn_q_norm", "attn_k_norm"}
    expected = {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert not model.config.tie_word_embeddings  # (tied: no output.weight, llama.cpp reuses token_embd)
    for i in range(2):
        expected |= {f"blk.{i}.{t}.weight" for t in per_layer}
        expected |= {f"blk.{i}.{t}" if t.endswith(".bias") else f"blk.{i}.{t}.weight" for t in extra}
    assert set(tensors) == expected
    sd = model.state_dict()
    # qwen2/qwen3 rotate NeoX-style (pairs i, i + d/2) in llama.cpp as in transformers: q and k as they are
    q = np.asarray(tensors["blk.0.attn_q.weight"].data).reshape(4 * HEAD_DIM, 64)
    np.testing.assert_array_equal(q, sd["model.layers.0.self_attn.q_proj.weight"].numpy())
    if arch == "qwen2":
        np.testing.assert_array_equal(tensors["blk.1.attn_k.bias"].data, sd["model.layers.1.self_attn.k_proj.bias"])
    else:
        np.testing.assert_array_equal(
            tensors["blk.1.attn_k_norm.weight"].data, sd["model.layers.1.self_attn.k_norm.weight"]
        )


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_transformers_reads_the_qwen_file_back_to_the_same_logits(tmp_path, arch):
    """transformers' own GGUF loader (qwen2/qwen3 mappings) gives the source's logits: names, layout and
    biases/norms are where llama.cpp's architecture expects them."""
    from transformers import AutoModelForCausalLM

    # transformers' qwen3 GGUF mapping ignores attention.key_length: its default head_dim (128) here
    model = qwen(arch, **({"head_dim": 128} if arch == "qwen3" else {}))
    export_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tiny_tokenizer())
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="q.gguf", dtype=torch.float32).eval()
    x = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize(
    "method, kw, expected",
    [
        (None, {}, {"scaling.type": "none", "freq_base": 10000.0, "dimension_count": HEAD_DIM}),
        ("linear", {"factor": 4}, {"scaling.type": "linear", "scaling.factor": 4.0}),
        (
            "yarn",
            {"factor": 4},
            {
                "scaling.type": "yarn",
                "scaling.factor": 4.0,
                "scaling.original_context_length": ORIGINAL_CONTEXT,
                "scaling.attn_factor": 1.0,
            },
        ),
        # llama.cpp multiplies cos/sin by 0.1 ln s + 1 itself: the key holds what is left
        ("yarn", {"factor": 4, "attention_factor": 1.3}, {"scaling.attn_factor": 1.3 / (0.1 * math.log(4) + 1)}),
    ],
)
def test_qwen_rope_keys_are_the_ones_llama_cpp_reads(tmp_path, arch, method, kw, expected):
    model = patch(qwen(arch), method, **kw) if method else qwen(arch)
    meta, tensors = read(export_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tiny_tokenizer()))
    got = rope_keys(meta, arch)
    for key, value in expected.items():
        assert got[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-6)), key
    assert not any(name.startswith("rope_") for name in tensors)


def test_a_qwen25_style_yarn_config_exports_its_own_scaling(tmp_path):
    """Qwen2.5's model cards: rope_scaling yarn x4 from 32768 in config.json, no ropescale block."""
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
    model = qwen("qwen2", rope_parameters=rope, max_position_embeddings=32768)
    meta, _ = read(export_gguf(model, tmp_path / "q.gguf", "f32", tokenizer=tiny_tokenizer()))
    got = rope_keys(meta, "qwen2")
    assert (got["scaling.type"], got["scaling.factor"], got["scaling.original_context_length"]) == ("yarn", 4.0, 32768)
    assert got["freq_base"] == 1e6


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize(
    "method, kw",
    [("llama3", {"factor": 4}), ("longrope", {"factor": 4, "long_factor": [1.0 + i for i in range(8)], "short": True})],
)
def test_qwen_refuses_per_dimension_factors_in_one_line(tmp_path, arch, method, kw):
    kw = dict(kw)
    if kw.pop("short", False):
        kw["short_factor"] = kw["long_factor"]  # equal factors: fixed frequencies, still per dimension
    with pytest.raises(NotExpressibleError) as info:
        export_gguf(patch(qwen(arch), method, **kw), tmp_path / "q.gguf", tokenizer=tiny_tokenizer())
    assert str(info.value) == (
        f"method '{method}' cannot be exported to GGUF: llama.cpp's {arch} architecture takes no per-dimension rope "
        f"factors (rope_freqs), which {method} is (a llama or mistral model can carry them)"
    )
    assert list(tmp_path.iterdir()) == []


def test_qwen_with_a_sliding_window_is_refused(tmp_path):
    from ropescale.errors import UnsupportedModelError

    model = qwen("qwen2", use_sliding_window=True, sliding_window=32, max_window_layers=0)
    with pytest.raises(
        UnsupportedModelError, match="sliding_window=32 is narrower than the context 64; llama.cpp runs qwen2"
    ):
        export_gguf(model, tmp_path / "q.gguf", tokenizer=tiny_tokenizer())


def converter_llama3_factors(base, dim, factor, low, high, original):
    """llama.cpp convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors), transcribed."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def test_a_llama31_checkpoint_writes_the_converters_rope_freqs(tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    model = tiny_model("llama", vocab_size=VOCAB, rope_parameters=rope, max_position_embeddings=131072)
    meta, tensors = read(export_gguf(model, tmp_path / "l.gguf", "f32", tokenizer=tiny_tokenizer()))
    want = converter_llama3_factors(500000.0, HEAD_DIM, 8.0, 1.0, 4.0, 8192)
    assert 1 < len(set(want.tolist())) and want.max() == 8  # the tiny head has every regime of the ramp
    np.testing.assert_allclose(tensors["rope_freqs.weight"].data, want, rtol=1e-5)
    got = rope_keys(meta, "llama")
    assert got["scaling.type"] == "none" and "scaling.attn_factor" not in got and got["freq_base"] == 500000.0
    assert meta["llama.context_length"] == 131072


def test_longrope_with_equal_factors_is_rope_freqs_and_its_attention_factor(tmp_path):
    long = [1.0 + 0.5 * i for i in range(HEAD_DIM // 2)]
    model = patch(tiny_model("llama", vocab_size=VOCAB), "longrope", factor=4, long_factor=long, short_factor=long)
    meta, tensors = read(export_gguf(model, tmp_path / "l.gguf", "f32", tokenizer=tiny_tokenizer()))
    np.testing.assert_allclose(tensors["rope_freqs.weight"].data, long, rtol=1e-6)
    assert not {"rope_factors_long.weight", "rope_factors_short.weight"} & set(tensors)
    got = rope_keys(meta, "llama")
    assert got["scaling.type"] == "none" and "scaling.factor" not in got  # a factor would rescale again
    # LongRoPE's sqrt(1 + ln s / ln L): llama.cpp multiplies cos/sin by rope.scaling.attn_factor alone
    assert got["scaling.attn_factor"] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(ORIGINAL_CONTEXT)))
