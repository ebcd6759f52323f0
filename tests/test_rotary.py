"""The reference rotary embedding (``ropescale.rotary_reference``) against independent oracles.

Two oracles, neither built from the code under test:
- ``rotate_oracle``: a float64 rotation written pair by pair from the definition (pair i is
  (i, i + d/2) in the "half" layout, (2i, 2i + 1) in the "interleaved" one);
- transformers' ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` for the "half" layout.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from ropescale.methods import RotarySpec, get_method
from ropescale.rotary_reference import apply_rotary, cos_sin

LAYOUTS = ("half", "interleaved")
FP32_EPS = 2.0**-24  # unit roundoff of fp32
BF16_EPS = 2.0**-8


def pair_indices(d: int, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Which coordinates rotate together: (first, second) of each of the d/2 pairs."""
    if layout == "half":
        first = torch.arange(d // 2)
        return first, first + d // 2
    first = torch.arange(0, d, 2)
    return first, first + 1


def rotate_oracle(
    x: torch.Tensor, inv_freq: torch.Tensor, positions: torch.Tensor, layout: str, attention_factor: float = 1.0
) -> torch.Tensor:
    """float64 rotation by position × θ_i of each pair, from the definition; dims past d pass through.

    x: [..., s, D]; positions: [s] or broadcastable to x's leading dims + [s].
    """
    x = x.double()
    theta = inv_freq.double()  # [d/2]
    angle = positions.double()[..., None] * theta  # [..., s, d/2]
    cos, sin = angle.cos(), angle.sin()
    a, b = pair_indices(2 * theta.numel(), layout)
    out = x.clone()
    out[..., a] = attention_factor * (x[..., a] * cos - x[..., b] * sin)
    out[..., b] = attention_factor * (x[..., b] * cos + x[..., a] * sin)
    return out


def dot_oracle(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, delta: int, layout: str) -> float:
    """⟨R(mθ)q, R(nθ)k⟩ = qᵀR((n−m)θ)k in closed form (float64), with delta = n − m."""
    q, k = q.double(), k.double()
    phi = delta * inv_freq.double()
    a, b = pair_indices(q.shape[-1], layout)
    return float(((q[a] * k[a] + q[b] * k[b]) * phi.cos() + (q[b] * k[a] - q[a] * k[b]) * phi.sin()).sum())


def angle_atol(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0
) -> float:
    """How far fp32 rotary may sit from the float64 oracle: the fp32 angle pos·θ is off by up to
    pos·θ·eps, which moves a coordinate by that much times its size (×4 for margin)."""
    worst_angle = positions.max().item() * inv_freq.max().item()
    return attention_factor * x.abs().max().item() * (4 * worst_angle * FP32_EPS + 1e-6)


def yarn_inv_freq(head_dim: int = 64, factor: float = 8.0) -> tuple[torch.Tensor, float]:
    return get_method("yarn", factor=factor).compute(RotarySpec(head_dim, 1e4, 4096))


def plain_inv_freq(head_dim: int = 64, base: float = 1e4) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def rotate_at(x: torch.Tensor, inv_freq: torch.Tensor, positions: list[int], layout: str, attention_factor=1.0):
    """x [d] rotated at each position → [len(positions), d] (q and k rotated alike)."""
    pos = torch.tensor(positions)
    cos, sin = cos_sin(inv_freq, pos, attention_factor, layout=layout)  # [p, d]
    xs = x.expand(len(positions), -1)  # [p, d]
    out, _ = apply_rotary(xs, xs, cos, sin, layout=layout)
    return out


# --------------------------------------------------------------------------------------------
# (a) relative position: ⟨q_m, k_n⟩ depends only on n − m


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("which", ["plain", "yarn"])
@pytest.mark.parametrize("delta", [7, -3, 250])
def test_dot_product_depends_only_on_relative_position(layout, which, delta):
    torch.manual_seed(0)
    d = 64
    inv_freq = plain_inv_freq(d).float() if which == "plain" else yarn_inv_freq(d)[0]
    q, k = torch.randn(d), torch.randn(d)
    scale = (q.norm() * k.norm()).item()
    m_values = [0, 1, 100, 1000, 4095, 12345, 30000]
    n_values = [m + delta for m in m_values]
    # keep positions non-negative (delta may be negative)
    shift = max(0, -min(n_values))
    m_values, n_values = [m + shift for m in m_values], [n + shift for n in n_values]
    q_rot = rotate_at(q, inv_freq, m_values, layout)
    k_rot = rotate_at(k, inv_freq, n_values, layout)
    expected = dot_oracle(q, k, inv_freq, delta, layout)
    for i, (m, n) in enumerate(zip(m_values, n_values)):
        got = float(q_rot[i] @ k_rot[i])
        # fp32 angles m·θ lose ~m·θ_max·eps; two rotations, a factor 2 of margin
        tol = scale * (4 * (max(m, n) + 1) * FP32_EPS + 1e-6)
        assert abs(got - expected) <= tol, (m, n, got, expected, tol)
    # non-vacuous: the dot product does change with the relative distance
    other = dot_oracle(q, k, inv_freq, delta + 5, layout)
    assert abs(other - expected) > 1e-2 * scale


# --------------------------------------------------------------------------------------------
# (b) norms preserved, (c) attention factor scales dot products by a²


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_preserves_norms(layout):
    torch.manual_seed(1)
    b, h, s, d = 2, 3, 5, 64
    q, k = torch.randn(b, h, s, d), torch.randn(b, 1, s, d)
    inv_freq, _ = yarn_inv_freq(d)
    positions = torch.tensor([[0, 1, 17, 4096, 30000], [5, 9000, 20000, 29999, 31000]])  # [b, s]
    cos, sin = cos_sin(inv_freq, positions, 1.0, layout=layout)
    q_rot, k_rot = apply_rotary(q, k, cos, sin, layout=layout)
    assert q_rot.shape == q.shape and k_rot.shape == k.shape
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=0.0)
    torch.testing.assert_close(k_rot.norm(dim=-1), k.norm(dim=-1), rtol=1e-5, atol=0.0)
    # stronger: each pair keeps its own length (a rotation within the right pairs)
    first, second = pair_indices(d, layout)
    pair_norm = lambda x: x[..., first].square() + x[..., second].square()  # noqa: E731
    torch.testing.assert_close(pair_norm(q_rot), pair_norm(q), rtol=1e-5, atol=1e-6)
    # and rotation actually happened
    assert not torch.allclose(q_rot[..., 1:, :], q[..., 1:, :], atol=1e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("attention_factor", [0.5, 1.1386, 1.347, 2.0])
def test_attention_factor_scales_dot_products_by_its_square(layout, attention_factor):
    torch.manual_seed(2)
    d = 64
    inv_freq, _ = yarn_inv_freq(d, factor=4)
    q, k = torch.randn(d), torch.randn(d)
    m_values, n_values = [3, 100, 2000], [0, 150, 1000]
    cos, sin = cos_sin(inv_freq, torch.tensor(m_values), attention_factor, layout=layout)
    torch.testing.assert_close(cos.square() + sin.square(), torch.full_like(cos, attention_factor**2))
    q_rot = rotate_at(q, inv_freq, m_values, layout, attention_factor)
    k_rot = rotate_at(k, inv_freq, n_values, layout, attention_factor)
    scale = (q.norm() * k.norm()).item()
    for i, (m, n) in enumerate(zip(m_values, n_values)):
        expected = attention_factor**2 * dot_oracle(q, k, inv_freq, n - m, layout)
        assert float(q_rot[i] @ k_rot[i]) == pytest.approx(expected, abs=1e-4 * scale * attention_factor**2)
    torch.testing.assert_close(q_rot.norm(dim=-1), attention_factor * q.norm().expand(3), rtol=1e-5, atol=0.0)


# --------------------------------------------------------------------------------------------
# (d) "half" = transformers' Llama rotary


def transformers_rotary(head_dim: int, rope_parameters: dict, max_position_embeddings: int) -> LlamaRotaryEmbedding:
    config = transformers.LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope_parameters,
    )
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize(
    "name, params, rope_parameters",
    [
        ("default", {}, {"rope_type": "default", "rope_theta": 1e4}),
        (
            "yarn",
            {"factor": 8},
            {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 4096},
        ),
        (
            "llama3",
            {"factor": 8},
            {
                "rope_type": "llama3",
                "rope_theta": 1e4,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 4096,
            },
        ),
    ],
)
def test_half_layout_matches_transformers(name, params, rope_parameters):
    torch.manual_seed(3)
    b, h, h_kv, s, d = 2, 4, 2, 6, 64
    method = get_method(name, **params)
    spec = RotarySpec(d, 1e4, 4096)
    inv_freq, attention_factor = method.compute(spec)
    rotary = transformers_rotary(d, rope_parameters, method.max_position_embeddings(spec))
    torch.testing.assert_close(rotary.inv_freq, inv_freq, rtol=1e-6, atol=0.0)
    assert rotary.attention_scaling == pytest.approx(attention_factor)
    # same θ on both sides from here, so positions up to 32k compare tightly
    rotary.inv_freq.copy_(inv_freq)

    positions = torch.tensor([[0, 1, 2, 4095, 4096, 30000], [7, 100, 8191, 16000, 20000, 32767]])  # [b, s]
    x = torch.zeros(b, s, 4 * d)  # only dtype and device are read
    hf_cos, hf_sin = rotary(x, positions)  # [b, s, d]
    cos, sin = cos_sin(inv_freq, positions, attention_factor, layout="half")
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (b, s, d)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=1e-6)

    q, k = torch.randn(b, h, s, d), torch.randn(b, h_kv, s, d)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    q_rot, k_rot = apply_rotary(q, k, cos, sin, layout="half")  # [b, s, d] cos broadcast over heads
    torch.testing.assert_close(q_rot, hf_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_rot, hf_k, rtol=1e-5, atol=1e-5)
    # 2-D cos/sin ([s, d], shared by the batch) broadcast too
    cos0, sin0 = cos_sin(inv_freq, positions[0], attention_factor)
    q0, _ = apply_rotary(q, k, cos0, sin0)
    torch.testing.assert_close(q0[0], hf_q[0], rtol=1e-5, atol=1e-5)
    # and the definition agrees (catches a shared mistake between us and the transformers call above)
    expected = rotate_oracle(q, inv_freq, positions[:, None, :], "half", attention_factor)
    atol = angle_atol(q, positions, inv_freq, attention_factor)
    torch.testing.assert_close(q_rot.double(), expected, rtol=0, atol=atol)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_inputs_rotate_in_fp32_and_come_back_in_bf16(layout):
    torch.manual_seed(4)
    b, h, s, d = 1, 2, 5, 64
    q32, k32 = torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    q, k = q32.bfloat16(), k32.bfloat16()
    inv_freq, attention_factor = yarn_inv_freq(d, factor=4)
    positions = torch.tensor([[0, 3, 1000, 8000, 16000]])
    # cos/sin stay fp32 even if the frequencies arrive in bf16 (a model cast with .to(bf16))
    cos, sin = cos_sin(inv_freq.bfloat16(), positions, attention_factor, layout=layout)
    assert cos.dtype == sin.dtype == torch.float32
    cos, sin = cos_sin(inv_freq, positions, attention_factor, layout=layout)
    assert cos.dtype == sin.dtype == torch.float32

    q_rot, k_rot = apply_rotary(q, k, cos, sin, layout=layout)
    assert q_rot.dtype == k_rot.dtype == torch.bfloat16
    # oracle: the same bf16 values upcast, rotated exactly, rounded once to bf16
    expected = rotate_oracle(q.double(), inv_freq, positions[:, None, :], layout, attention_factor)
    torch.testing.assert_close(q_rot, expected.to(torch.bfloat16), rtol=BF16_EPS, atol=1e-2)
    # rotating in fp32 then rounding once is as good as bf16 allows: within one rounding of the exact result
    err = (q_rot.double() - expected).abs()
    assert (err <= expected.abs() * BF16_EPS + 5e-3).all()
    if layout == "half":
        # = transformers' rotation of the upcast inputs with fp32 cos/sin, rounded to bf16
        hf_q, _ = apply_rotary_pos_emb(q.float(), k.float(), cos, sin)
        torch.testing.assert_close(q_rot, hf_q.bfloat16(), rtol=BF16_EPS, atol=0.0)


# --------------------------------------------------------------------------------------------
# (e) interleaved = half after permuting the dims


@pytest.mark.parametrize("d", [8, 64, 128])
def test_interleaved_is_half_after_permutation(d):
    torch.manual_seed(5)
    b, h, s = 2, 3, 4
    inv_freq, attention_factor = yarn_inv_freq(d, factor=4)
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))  # interleaved dim perm[j] → half dim j
    positions = torch.tensor([[0, 5, 999, 12000], [1, 2, 3, 4]])
    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d)

    cos_i, sin_i = cos_sin(inv_freq, positions, attention_factor, layout="interleaved")
    cos_h, sin_h = cos_sin(inv_freq, positions, attention_factor, layout="half")
    torch.testing.assert_close(cos_i[..., perm], cos_h, rtol=0, atol=0)
    torch.testing.assert_close(sin_i[..., perm], sin_h, rtol=0, atol=0)

    q_i, k_i = apply_rotary(q, k, cos_i, sin_i, layout="interleaved")
    q_h, k_h = apply_rotary(q[..., perm], k[..., perm], cos_h, sin_h, layout="half")
    torch.testing.assert_close(q_i[..., perm], q_h, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_i[..., perm], k_h, rtol=1e-6, atol=1e-6)
    # the half side itself against transformers, so the chain ends at an independent oracle
    hf_q, _ = apply_rotary_pos_emb(q[..., perm], k[..., perm], cos_h, sin_h)
    torch.testing.assert_close(q_i[..., perm], hf_q, rtol=1e-5, atol=1e-5)
    # the layouts really differ: interleaved ≠ half on the same unpermuted input
    q_wrong, _ = apply_rotary(q, k, cos_h, sin_h, layout="half")
    assert not torch.allclose(q_wrong, q_i, atol=1e-2)


# --------------------------------------------------------------------------------------------
# (f) partial rotary


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, rotary_dim", [(64, 32), (80, 40), (64, 16)])
def test_partial_rotary_passes_the_rest_through(layout, dtype, head_dim, rotary_dim):
    torch.manual_seed(6)
    b, h, s = 2, 2, 5
    spec = RotarySpec(head_dim, 1e4, 4096, partial_rotary_factor=rotary_dim / head_dim)
    inv_freq, attention_factor = get_method("yarn", factor=4).compute(spec)
    assert inv_freq.shape == (rotary_dim // 2,)
    positions = torch.tensor([[0, 1, 50, 4000, 9000], [3, 3, 3, 3, 3]])
    cos, sin = cos_sin(inv_freq, positions, attention_factor, layout=layout)
    assert cos.shape[-1] == rotary_dim
    q, k = torch.randn(b, h, s, head_dim, dtype=dtype), torch.randn(b, 1, s, head_dim, dtype=dtype)
    q_rot, k_rot = apply_rotary(q, k, cos, sin, layout=layout)
    assert q_rot.shape == q.shape and q_rot.dtype == dtype and k_rot.shape == k.shape
    # untouched beyond the rotary dims, bit for bit (no fp32 round trip, no attention factor)
    assert torch.equal(q_rot[..., rotary_dim:], q[..., rotary_dim:])
    assert torch.equal(k_rot[..., rotary_dim:], k[..., rotary_dim:])
    # the rotated part is the full rotation of the first rotary_dim dims
    expected = rotate_oracle(q, inv_freq, positions[:, None, :], layout, attention_factor)
    atol = angle_atol(q.float(), positions, inv_freq, attention_factor)
    tol = dict(rtol=BF16_EPS, atol=atol + 1e-2) if dtype == torch.bfloat16 else dict(rtol=0, atol=atol)
    torch.testing.assert_close(q_rot.double(), expected, **tol)
    if layout == "half":
        hf_q, hf_k = apply_rotary_pos_emb(q[..., :rotary_dim].float(), k[..., :rotary_dim].float(), cos, sin)
        torch.testing.assert_close(q_rot[..., :rotary_dim], hf_q.to(dtype), rtol=BF16_EPS, atol=1e-5)
        torch.testing.assert_close(k_rot[..., :rotary_dim], hf_k.to(dtype), rtol=BF16_EPS, atol=1e-5)
