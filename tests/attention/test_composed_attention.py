"""Attention-level methods composed on a shipped scaling (issue 51), checked against attention written
here by hand: the remapped positions from each paper (Self-Extend arXiv 2401.01325, DCA arXiv 2402.17463
with HKUNLP/ChunkLlama's caps, STRING arXiv 2410.18745, llama.cpp's grouped attention as
ropescale/methods/self_extend_llamacpp.py derives it), q and k rotated at them with frequencies computed
here from the llama3 formula (arXiv 2407.21783, Meta's llama-models) or YaRN's (arXiv 2309.00071), the
shipped attention factor on both, and plain softmax attention in float64. Nothing under test computes
the expected value: only the layer's own projection weights are read.

The rule (docs/extended-checkpoints.md, "Attention-level methods on a shipped scaling"): the shipped
frequencies and attention factor at the remapped positions, sizes measured in the shipped context.
Before: every case here was refused in one line ("... on an already extended model ...").
"""

from __future__ import annotations

import math

import pytest
import torch

import ropescale
from tests.conftest import tiny_model

LLAMA31 = {
    "rope_type": "llama3",
    "rope_theta": 5e5,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
QWEN_YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
#: no family row matches it (original 16): only --compose / --replace decide; shipped context 32 tokens
SMALL_LLAMA3 = {**LLAMA31, "factor": 2.0, "original_max_position_embeddings": 16}
N = 48  # tokens: every region of every method is used


# --- frequencies from the papers ------------------------------------------------------------------


def plain(d: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def llama3(d: int, rope: dict) -> tuple[torch.Tensor, float]:
    """Meta's llama3 rule: wavelengths shorter than L/high_freq_factor kept, longer than L/low_freq_factor
    divided by the factor, a smooth blend between; attention factor 1."""
    theta, L, s = plain(d, rope["rope_theta"]), rope["original_max_position_embeddings"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    out = []
    for t in theta.tolist():
        wavelen = 2 * math.pi / t
        if wavelen < L / high:
            out.append(t)
        elif wavelen > L / low:
            out.append(t / s)
        else:
            smooth = (L / wavelen - low) / (high - low)
            out.append((1 - smooth) * t / s + smooth * t)
    return torch.tensor(out, dtype=torch.float64), 1.0


def yarn(d: int, rope: dict) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071 §3.2-3.4, β_fast 32, β_slow 1, range floored/ceiled): pairs making more than
    32 turns over L kept, fewer than 1 interpolated by 1/s, a linear ramp between; factor 0.1·ln s + 1."""
    base, L, s = rope["rope_theta"], rope["original_max_position_embeddings"], rope["factor"]
    theta = plain(d, base)

    def dim(turns: float) -> float:
        return d * math.log(L / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = max(math.floor(dim(32)), 0), min(math.ceil(dim(1)), d - 1)
    i = torch.arange(d // 2, dtype=torch.float64)
    ramp = ((i - low) / (high - low if high > low else 0.001)).clamp(0, 1)  # 1: interpolated
    return theta / s * ramp + theta * (1 - ramp), 0.1 * math.log(s) + 1


# --- remapped positions from the papers: (query position, key position) of every pair i ≥ j -------


def self_extend(i: int, j: int, G: int, W: int) -> tuple[float, float]:
    return (i, j) if i - j < W else (i // G + W - W // G, j // G)


def dca(i: int, j: int, chunk: int, local: int) -> tuple[float, float]:
    s = chunk - local
    if i // s == j // s:
        return i % s, j % s
    if i // s - j // s == 1:
        return min(s + i % s, chunk), j % s
    return min(2 * s - 1, chunk), j % s


def string(i: int, j: int, S: int, W: int) -> tuple[float, float]:
    return (i, j) if i - j < S else (i - S + W, j)


def llamacpp(i: int, j: int, G: int, W: int, n_batch: int) -> tuple[float, float]:
    """The batch holding query i starts at N = n_batch·⌊i/n_batch⌋; k = ⌊N/W⌋ blocks are grouped, every
    position shifted back by k·(W − W/G); grouped keys turn to 2j − ⌊j/G⌋ (llama.cpp's K-shift sign)."""
    k = (i // n_batch * n_batch) // W
    shift = k * (W - W // G)
    return i - shift, (2 * j - j // G) if j < k * W else j - shift


# --- attention by hand --------------------------------------------------------------------------


def rotate(x: torch.Tensor, position: float, inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
    """x [..., d] rotated at ``position`` in the half layout, cos and sin times ``factor``."""
    angle = position * inv_freq
    cos, sin = torch.cat((angle.cos(), angle.cos())) * factor, torch.cat((angle.sin(), angle.sin())) * factor
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def by_hand(attn, hidden: torch.Tensor, pairs, inv_freq, factor, query_scale=lambda i: 1.0) -> torch.Tensor:
    """The layer's output for hidden [1, n, hidden]: plain causal softmax attention with q_i and k_j rotated
    at pairs(i, j), float64, then the layer's output projection."""
    cfg = attn.config
    H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    h = hidden[0].double()
    q = (h @ attn.q_proj.weight.double().T).view(-1, H, hd)  # [n, H, hd]
    k = (h @ attn.k_proj.weight.double().T).view(-1, KV, hd).repeat_interleave(H // KV, dim=1)
    v = (h @ attn.v_proj.weight.double().T).view(-1, KV, hd).repeat_interleave(H // KV, dim=1)
    n, out = h.shape[0], torch.zeros(h.shape[0], H, hd, dtype=torch.float64)
    for i in range(n):
        scores = []
        for j in range(i + 1):
            pq, pk = pairs(i, j)
            qi, kj = rotate(q[i], pq, inv_freq, factor), rotate(k[j], pk, inv_freq, factor)
            scores.append((qi * kj).sum(-1) * query_scale(i) / math.sqrt(hd))  # [H]
        p = torch.softmax(torch.stack(scores, -1), -1)  # [H, i+1]
        out[i] = torch.einsum("hj,jhd->hd", p, v[: i + 1])
    return out.reshape(n, H * hd) @ attn.o_proj.weight.double().T


def sharpened(model):
    """The model with its first layer's q and k projections ×12: random init gives near-uniform attention,
    which hides a change of the slow pairs' frequencies (llama3 changes only wavelengths over L/4)."""
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.q_proj.weight.mul_(12)
        attn.k_proj.weight.mul_(12)
    return model


def layer_io(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of the first attention layer on ``ids``."""
    attn, seen = model.model.layers[0].self_attn, {}

    def pre(module, args, kwargs):
        seen["in"] = kwargs.get("hidden_states", args[0] if args else None)

    def post(module, args, kwargs, output):
        seen["out"] = output[0]

    hooks = [attn.register_forward_pre_hook(pre, with_kwargs=True), attn.register_forward_hook(post, with_kwargs=True)]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return seen["in"], seen["out"]


CASES = [  # (id, arch, rope, max_position_embeddings, method, params, patch options, frequencies, pairs, scale)
    ("self_extend", "llama", LLAMA31, 131072, "self_extend", {"group_size": 4, "window": 8}, {}, llama3,
     lambda i, j: self_extend(i, j, 4, 8), 1.0),
    ("dca", "llama", LLAMA31, 131072, "dca", {"chunk_size": 16, "local_window": 4}, {}, llama3,
     lambda i, j: dca(i, j, 16, 4), 1.0),
    ("string", "llama", LLAMA31, 131072, "string", {"shift": 16, "local_window": 4}, {}, llama3,
     lambda i, j: string(i, j, 16, 4), 0.1 * math.log(2) + 1),
    ("llamacpp", "llama", LLAMA31, 131072, "self_extend_llamacpp", {"group_size": 4, "window": 8, "n_batch": 16},
     {}, llama3, lambda i, j: llamacpp(i, j, 4, 8, 16), 1.0),
    ("qwen2_yarn_self_extend", "qwen2", QWEN_YARN, 131072, "self_extend", {"group_size": 4, "window": 8},
     {"compose": True}, yarn, lambda i, j: self_extend(i, j, 4, 8), 1.0),
    ("qwen2_yarn_string", "qwen2", QWEN_YARN, 131072, "string", {"shift": 16, "local_window": 4},
     {"compose": True}, yarn, lambda i, j: string(i, j, 16, 4), 0.1 * math.log(2) + 1),
    ("qwen2_yarn_dca", "qwen2", QWEN_YARN, 131072, "dca", {"chunk_size": 16, "local_window": 4},
     {"compose": True}, yarn, lambda i, j: dca(i, j, 16, 4), 1.0),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_composed_attention_equals_attention_by_hand(case):
    _, arch, rope, field, method, params, options, frequencies, pairs, own = case
    model = tiny_model(arch, rope_parameters=dict(rope), max_position_embeddings=field, attn_implementation="sdpa")
    ropescale.patch(sharpened(model), method, **params, **options)
    assert model.config.ropescale["mode"] == "compose"
    inv_freq, shipped = frequencies(model.config.head_dim, rope)
    ids = torch.randint(0, 128, (1, N), generator=torch.Generator().manual_seed(3))
    hidden, out = layer_io(model, ids)
    expected = by_hand(model.model.layers[0].self_attn, hidden, pairs, inv_freq, shipped * own)
    torch.testing.assert_close(out[0].double(), expected, rtol=1e-4, atol=1e-5)


def test_replaced_on_qwens_switch_rotates_with_plain_rope():
    """Qwen's YaRN switch was applied without training: by the rule STRING replaces it, rotating with the
    pretraining frequencies (θ_i = b^(−2i/d), factor STRING's only)."""
    model = tiny_model(
        "qwen2", rope_parameters=dict(QWEN_YARN), max_position_embeddings=131072, attn_implementation="sdpa"
    )
    ropescale.patch(sharpened(model), "string", shift=16, local_window=4)
    assert model.config.ropescale["mode"] == "replace"
    ids = torch.randint(0, 128, (1, N), generator=torch.Generator().manual_seed(3))
    hidden, out = layer_io(model, ids)
    theta = plain(model.config.head_dim, QWEN_YARN["rope_theta"])
    expected = by_hand(
        model.model.layers[0].self_attn, hidden, lambda i, j: string(i, j, 16, 4), theta, 0.1 * math.log(2) + 1
    )
    torch.testing.assert_close(out[0].double(), expected, rtol=1e-4, atol=1e-5)


def test_dca_temperature_and_self_extend_logn_count_from_the_shipped_context():
    """A llama3 checkpoint no family row names, composed with --compose, shipped at 32 tokens: past 32 (not
    the pretraining 16) DCA's logits take ChunkLlama's (0.05·ln(n/32) + 1)², Self-Extend's logn
    max(1, ln(i+1)/ln 32)."""
    field = 32
    ids = torch.randint(0, 128, (1, N), generator=torch.Generator().manual_seed(5))
    inv_freq, _ = llama3(16, SMALL_LLAMA3)
    temperature = (0.05 * math.log(N / field) + 1) ** 2
    for method, params, pairs, scale in (
        ("dca", {"chunk_size": 12, "local_window": 3}, lambda i, j: dca(i, j, 12, 3), lambda i: temperature),
        (
            "self_extend",
            {"group_size": 2, "window": 6, "logn": True},
            lambda i, j: self_extend(i, j, 2, 6),
            lambda i: max(1.0, math.log(i + 1) / math.log(field)),
        ),
    ):
        model = tiny_model(
            rope_parameters=dict(SMALL_LLAMA3), max_position_embeddings=field, attn_implementation="sdpa"
        )
        ropescale.patch(sharpened(model), method, compose=True, **params)
        hidden, out = layer_io(model, ids)
        expected = by_hand(model.model.layers[0].self_attn, hidden, pairs, inv_freq, 1.0, scale)
        torch.testing.assert_close(out[0].double(), expected, rtol=1e-4, atol=1e-5)


def test_defaults_are_measured_in_the_shipped_context():
    """On Llama 3.1 (shipped 131,072) the defaults are those of a model trained at 131,072: STRING's shift is
    the authors' README value int(0.33 × 131072) = 43253, DCA's chunk 3/4 of it, Self-Extend's window 1024."""
    expected = {
        "string": {"shift": 43253, "local_window": 128},
        "dca": {"chunk_size": 98304, "local_window": 16384},
        "self_extend": {"window": 1024, "group_size": 2},  # the smallest G that reaches 160,000 from 131,072
    }
    for method, settings in expected.items():
        model = tiny_model(rope_parameters=dict(LLAMA31), max_position_embeddings=131072, attn_implementation="sdpa")
        ropescale.patch(model, method, target_length=160000)
        rotary = model.model.rotary_emb
        assert {k: getattr(rotary, k) for k in settings} == settings
        assert model.config.ropescale["params"]["factor"] == 160000 / 131072  # the target over the shipped context
        assert rotary.spec.original_max_position_embeddings == 131072


#: llama.cpp's grouping depends on where its batches start (a generated token is a batch of one), so its
#: cached decoding differs from a recomputation by design (tests/attention/test_self_extend_llamacpp.py)
CACHED = [c for c in CASES if c[1] == "llama" and c[4] != "self_extend_llamacpp"]


@pytest.mark.parametrize("case", CACHED, ids=[c[0] for c in CACHED])
def test_composed_cached_decoding_equals_recomputation(case):
    """The pinned shipped frequencies serve the cached path too (rotated keys kept beside the cache)."""
    from tests.attention.decoding import cached_vs_full, max_diff

    _, arch, rope, field, method, params, options, *_ = case
    model = tiny_model(arch, rope_parameters=dict(rope), max_position_embeddings=field, attn_implementation="sdpa")
    ropescale.patch(sharpened(model), method, **params, **options)
    ids = torch.randint(0, 128, (1, N), generator=torch.Generator().manual_seed(4))
    cached, full = cached_vs_full(model, ids, prompt=N - 6)
    assert max_diff(cached, full) < 1e-4
