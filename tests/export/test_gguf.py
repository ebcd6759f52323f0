"""GGUF export: metadata per method, tensors, the q/k permutation, the tokenizer, and refusals.

Every file is read back with ``gguf.GGUFReader``; expected values are computed independently of the
exporter (closed forms, transformers' own rope functions, an explicit per-row formula)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropescale.export import NotExpressibleError, export_gguf
from ropescale.export.gguf import gguf_tensor_name, permute_rotary_rows
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

gguf = pytest.importorskip("gguf")
HEAD_DIM = 16
BASE = 10000.0


def read(path):
    reader = gguf.GGUFReader(path)
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            meta[key] = [f.contents(i) for i in range(len(f.data))]
        else:
            meta[key] = f.contents()
    return meta, {t.name: t for t in reader.tensors}


def export(checkpoint, tmp_path, dtype="f32", **kw):
    path, _, _ = checkpoint
    out = export_gguf(path, tmp_path / "out.gguf", dtype, **kw)
    return read(out)


def rope_keys(meta):
    return {k.removeprefix("llama.rope."): v for k, v in meta.items() if k.startswith("llama.rope.")}


def test_permutation_matches_the_interleaved_formula():
    n_heads, d, cols = 3, 8, 5
    w = torch.randn(n_heads * d, cols)
    out = permute_rotary_rows(w, n_heads)
    for h in range(n_heads):
        for j in range(d // 2):  # pair j = (j, j + d/2) in transformers → (2j, 2j + 1) in ggml
            assert torch.equal(out[h * d + 2 * j], w[h * d + j])
            assert torch.equal(out[h * d + 2 * j + 1], w[h * d + d // 2 + j])
    bias = torch.randn(n_heads * d)
    assert torch.equal(permute_rotary_rows(bias, n_heads)[1], bias[d // 2])


def test_tensors_names_shapes_and_permuted_qk(checkpoint, tmp_path):
    _, model, _ = checkpoint
    meta, tensors = export(checkpoint, tmp_path)
    sd = model.state_dict()
    assert set(tensors) == {gguf_tensor_name(n) for n in sd} - {None}
    # ggml lists dimensions fastest first: [in, out] for a [out, in] matrix
    assert list(tensors["token_embd.weight"].shape) == [64, 300]
    assert list(tensors["blk.1.attn_k.weight"].shape) == [64, 2 * HEAD_DIM]
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    half = HEAD_DIM // 2
    for name, hf_name, heads in (
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 4),
        ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 2),
    ):
        got = np.asarray(tensors[name].data).reshape(heads * HEAD_DIM, 64)
        w = sd[hf_name].numpy()
        for h in range(heads):
            rows = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            np.testing.assert_array_equal(got[rows][0::2], w[rows][:half])  # first of each pair
            np.testing.assert_array_equal(got[rows][1::2], w[rows][half:])  # its partner i + d/2
    v = np.asarray(tensors["blk.0.attn_v.weight"].data).reshape(2 * HEAD_DIM, 64)
    np.testing.assert_array_equal(v, sd["model.layers.0.self_attn.v_proj.weight"].numpy())  # v is not permuted
    assert meta["llama.block_count"] == 2 and meta["llama.attention.head_count_kv"] == 2
    assert meta["llama.context_length"] == ORIGINAL_CONTEXT and meta["general.file_type"] == 0


def test_untied_output_and_dtypes(tmp_path):
    from tests.export.conftest import tiny_llama, tiny_tokenizer

    model = tiny_llama(tie_word_embeddings=False)
    for dtype, matrix_type in (("f16", "F16"), ("q8_0", "Q8_0")):
        out = export_gguf(model, tmp_path / f"{dtype}.gguf", dtype, tokenizer=tiny_tokenizer())
        meta, tensors = read(out)
        assert tensors["output.weight"].tensor_type.name == matrix_type
        assert tensors["blk.0.ffn_down.weight"].tensor_type.name == matrix_type
        assert tensors["output_norm.weight"].tensor_type.name == "F32"
        assert meta["general.file_type"] == {"f16": 1, "q8_0": 7}[dtype]
    deq = gguf.quants.dequantize(tensors["output.weight"].data, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(deq, model.lm_head.weight.detach().numpy(), atol=2e-3)


@pytest.mark.parametrize(
    "method, factor, expected",
    [
        (None, None, {"freq_base": BASE, "dimension_count": HEAD_DIM, "scaling.type": "none"}),
        ("linear", 4, {"freq_base": BASE, "scaling.type": "linear", "scaling.factor": 4.0}),
        ("ntk", 4, {"freq_base": BASE * 4 ** (HEAD_DIM / (HEAD_DIM - 2)), "scaling.type": "none"}),
        (
            "yarn",
            4,
            {
                "scaling.type": "yarn",
                "scaling.factor": 4.0,
                "scaling.original_context_length": ORIGINAL_CONTEXT,
                "scaling.attn_factor": 1.0,
                "scaling.yarn_beta_fast": 32.0,
                "scaling.yarn_beta_slow": 1.0,
            },
        ),
    ],
)
def test_rope_metadata_per_method(checkpoint, tmp_path, method, factor, expected):
    kw = {} if method is None else {"method": method, "factor": factor}
    meta, tensors = export(checkpoint, tmp_path, **kw)
    got = rope_keys(meta)
    for key, value in expected.items():
        assert got[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-6)), key
    if method in (None, "ntk"):
        assert not {"scaling.factor", "scaling.attn_factor"} & set(got)  # plain RoPE to llama.cpp
    assert not any(name.startswith("rope_") for name in tensors)
    assert meta["llama.context_length"] == ORIGINAL_CONTEXT * (factor or 1)


def test_yarn_attention_factor_is_divided_by_llama_cpps_own(checkpoint, tmp_path):
    # llama.cpp multiplies cos/sin by 0.1 ln s + 1 itself whenever YaRN is on
    meta, _ = export(checkpoint, tmp_path, method="yarn", factor=4, attention_factor=1.5)
    assert rope_keys(meta)["scaling.attn_factor"] == pytest.approx(1.5 / (0.1 * math.log(4) + 1), rel=1e-6)


def test_llama3_writes_rope_freqs_as_transformers_computes_them(checkpoint, tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ropescale import patch_config

    _, model, _ = checkpoint
    meta, tensors = export(checkpoint, tmp_path, method="llama3", factor=8)
    config = patch_config(model.config, "llama3", factor=8)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / BASE ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
    freqs = np.asarray(tensors["rope_freqs.weight"].data)
    assert freqs.shape == (HEAD_DIM // 2,)
    np.testing.assert_allclose(freqs, (base / scaled).numpy(), rtol=1e-5)  # llama.cpp divides θ_i by it
    assert freqs[0] == pytest.approx(1.0) and freqs[-1] == pytest.approx(8.0)
    assert rope_keys(meta)["scaling.type"] == "none" and "scaling.attn_factor" not in rope_keys(meta)


def test_longrope_writes_long_and_short_factors(checkpoint, tmp_path):
    long = [1.0 + i for i in range(HEAD_DIM // 2)]
    with pytest.raises(NotExpressibleError, match="kv_consistent=false"):  # on by default when short != long
        export(checkpoint, tmp_path, method="longrope", factor=4, long_factor=long)
    meta, tensors = export(checkpoint, tmp_path, method="longrope", factor=4, long_factor=long, kv_consistent=False)
    np.testing.assert_allclose(tensors["rope_factors_long.weight"].data, long)
    np.testing.assert_allclose(tensors["rope_factors_short.weight"].data, [1.0] * (HEAD_DIM // 2))
    rope = rope_keys(meta)
    assert rope["scaling.type"] == "longrope" and "scaling.factor" not in rope  # a factor would rescale again
    assert rope["scaling.attn_factor"] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(ORIGINAL_CONTEXT)))
    assert rope["scaling.original_context_length"] == ORIGINAL_CONTEXT


def test_a_natively_scaled_checkpoint_exports_its_own_scaling(tmp_path):
    from tests.export.conftest import tiny_llama, tiny_tokenizer

    rope = {"rope_type": "yarn", "rope_theta": BASE, "factor": 2.0, "original_max_position_embeddings": 64}
    model = tiny_llama(rope_parameters=rope, max_position_embeddings=128)
    meta, _ = read(export_gguf(model, tmp_path / "y.gguf", "f32", tokenizer=tiny_tokenizer()))
    assert rope_keys(meta)["scaling.type"] == "yarn" and rope_keys(meta)["scaling.factor"] == 2.0


@pytest.mark.parametrize(
    "method, kw, fragment",
    [
        ("dynamic_yarn", {"factor": 4}, "recomputed from the current length"),
        ("dynamic_ntk", {"factor": 4, "kv_consistent": False}, "recomputed from the current length"),
        ("dynamic_ntk", {"factor": 4, "kv_consistent": True}, "kv_consistent"),
        ("self_extend", {"factor": 2}, "inside attention"),
        ("yarn", {"factor": 4, "beta_fast": 16}, "beta_fast=16"),
        ("yarn", {"factor": 4, "truncate": False}, "truncate"),
    ],
)
def test_refused_methods_write_nothing(checkpoint, tmp_path, method, kw, fragment):
    with pytest.raises(NotExpressibleError, match=fragment) as info:
        export(checkpoint, tmp_path, method=method, **kw)
    assert f"method '{method}'" in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.glob("*.gguf*")) == [] and list(tmp_path.glob(".out.gguf*")) == []


def test_refuses_other_architectures_and_narrow_sliding_windows(tmp_path):
    import transformers

    from ropescale.errors import UnsupportedModelError
    from tests.export.conftest import tiny_tokenizer

    phi3 = transformers.Phi3Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        pad_token_id=0,
    )
    with pytest.raises(UnsupportedModelError, match="supports llama, mistral, qwen2 and qwen3 models, not 'phi3'"):
        export_gguf(transformers.Phi3ForCausalLM(phi3), tmp_path / "q.gguf", tokenizer=tiny_tokenizer())
    with pytest.raises(UnsupportedModelError, match="sliding_window=32"):
        export_gguf(tiny_model("mistral", sliding_window=32), tmp_path / "m.gguf", tokenizer=tiny_tokenizer())
    assert not list(tmp_path.iterdir())


def test_mistral_exports_as_llama(tmp_path):
    from tests.export.conftest import VOCAB, tiny_tokenizer

    model = tiny_model("mistral", vocab_size=VOCAB)
    meta, tensors = read(export_gguf(model, tmp_path / "m.gguf", tokenizer=tiny_tokenizer()))
    assert meta["general.architecture"] == "llama" and "blk.1.ffn_up.weight" in tensors


def test_existing_file_is_kept_unless_overwrite(checkpoint, tmp_path):
    target = tmp_path / "out.gguf"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        export(checkpoint, tmp_path)
    assert target.read_bytes() == b"old"
    export(checkpoint, tmp_path, overwrite=True)
    assert target.read_bytes()[:4] == b"GGUF"


def test_transformers_reads_the_file_back_to_the_same_logits(checkpoint, tmp_path):
    """transformers' own GGUF loader undoes llama.cpp's q/k permutation: same logits as the source."""
    from transformers import AutoModelForCausalLM

    _, model, _ = checkpoint
    export(checkpoint, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="out.gguf", dtype=torch.float32).eval()
    x = torch.randint(0, 300, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, rtol=1e-4, atol=1e-4)
