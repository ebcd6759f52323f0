"""S²-Attn: full attention when one group covers the sequence, a dense-mask oracle otherwise, strictly
causal, registered through transformers' attention interface, full attention at evaluation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ropescale.training.s2attn import S2ATTN, disable_s2attn, enable_s2attn, s2_attention
from tests.conftest import tiny_model


def qkv(b=2, h=4, n=32, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for _ in range(3)]  # each [b, h, n, d]


def full(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def oracle(q, k, v, g):
    """Dense-mask S²-Attn: token i attends to j <= i in its group; the second half of the heads uses
    groups shifted by g/2 ([0, g/2), [g/2, 3g/2), ...)."""
    n, h = q.shape[2], q.shape[1]
    i = torch.arange(n)
    plain = (i[:, None] // g) == (i[None, :] // g)
    shifted = ((i[:, None] + g // 2) // g) == ((i[None, :] + g // 2) // g)
    causal = i[:, None] >= i[None, :]
    mask = torch.stack([plain & causal] * (h // 2) + [shifted & causal] * (h - h // 2))  # [h, n, n]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None])


def test_one_group_covering_the_sequence_is_full_attention():
    q, k, v = qkv()
    torch.testing.assert_close(s2_attention(q, k, v, group_size=32), full(q, k, v))
    torch.testing.assert_close(s2_attention(q, k, v, group_size=64), full(q, k, v))


@pytest.mark.parametrize("g", [4, 8, 16])
def test_groups_match_the_dense_mask_oracle(g):
    q, k, v = qkv()
    out = s2_attention(q, k, v, group_size=g)
    torch.testing.assert_close(out, oracle(q, k, v, g))
    ref = full(q, k, v)
    # as expected: tokens whose causal past lies inside their group are unchanged ...
    torch.testing.assert_close(out[:, :2, :g], ref[:, :2, :g])  # plain heads, first group
    torch.testing.assert_close(out[:, 2:, : g // 2], ref[:, 2:, : g // 2])  # shifted heads, first half group
    # ... and every later group differs from full attention
    assert (out[:, :2, g:] - ref[:, :2, g:]).abs().amax() > 1e-3
    assert (out[:, 2:, g // 2 :] - ref[:, 2:, g // 2 :]).abs().amax() > 1e-3


def test_strictly_causal_no_look_ahead():
    """Changing the last tokens must not change any earlier output (LongLoRA's roll would leak)."""
    q, k, v = qkv(n=32)
    out = s2_attention(q, k, v, group_size=8)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -4:] += 5.0
    v2[:, :, -4:] -= 5.0
    torch.testing.assert_close(s2_attention(q, k2, v2, group_size=8)[:, :, :-4], out[:, :, :-4])


def test_padding_mask_applies_within_groups():
    q, k, v = qkv(b=1, n=16)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()
    torch.testing.assert_close(s2_attention(q, k, v, 4, attention_mask=mask), s2_attention(q, k, v, 4))


def test_bad_group_size():
    q, k, v = qkv(n=30)
    with pytest.raises(ValueError, match="even group size"):
        s2_attention(q, k, v, group_size=8)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_registered_attention_in_a_model(arch):
    """Through set_attn_implementation: S²-Attn while training, plain attention in eval mode and after
    disabling; with one group (ratio 1) it equals the model's SDPA attention, also with no mask given
    (transformers passes attention_mask=None for unpadded input)."""
    model = tiny_model(arch, attn_implementation="sdpa")
    ids = torch.randint(0, 128, (2, 32))
    model.train()  # dropout is 0 in the tiny configs
    with torch.no_grad():
        ref = model(ids).logits
    enable_s2attn(model, group_ratio=1.0)
    assert model.config._attn_implementation == S2ATTN
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref)
        model.config.ropescale_s2attn_group_ratio = 0.25
        sparse = model(ids).logits
        assert (sparse - ref).abs().amax() > 1e-4
        torch.testing.assert_close(sparse[:, :4], ref[:, :4])  # first half group: its past is inside every group
        model.eval()
        torch.testing.assert_close(model(ids).logits, ref)  # evaluation: full attention
    disable_s2attn(model)
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.config, "ropescale_s2attn_group_ratio")


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_batch_matches_the_oracle_with_padding(side):
    """A padding mask (as transformers builds it: causal and key-not-padding, [b, 1, n, n]) combines with
    the groups exactly as the dense oracle with the same mask; no NaN (fully masked rows of pad queries
    give zeros), so the backward through a padded batch is finite."""
    q, k, v = (t.requires_grad_() for t in qkv(b=2, h=4, n=16))
    valid = torch.ones(2, 16, dtype=torch.bool)
    valid[0, 11:] = False if side == "right" else True
    valid[0, :5] = True if side == "right" else False
    i = torch.arange(16)
    mask = ((i[:, None] >= i[None, :])[None] & valid[:, None, :])[:, None]  # [b, 1, n, n]
    got = s2_attention(q, k, v, 4, attention_mask=mask)
    plain = (i[:, None] // 4) == (i[None, :] // 4)
    shifted = ((i[:, None] + 2) // 4) == ((i[None, :] + 2) // 4)
    groups = torch.stack([plain, plain, shifted, shifted])  # [h, n, n]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & groups[None])
    keep = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[keep], want[keep])
    assert torch.isfinite(got).all()
    got[keep].sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_padded_batch_through_a_model_ignores_the_pad_tokens():
    """Training mode, S²-Attn on, a left-padded row: what the real tokens see does not depend on the
    pad tokens before them (they would if the mask were dropped), and the unpadded row is the same as alone."""
    model = tiny_model("llama", attn_implementation="sdpa").train()
    enable_s2attn(model, group_ratio=0.25)
    ids = torch.randint(4, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, :12] = 0
    other = ids.clone()
    other[1, :12] = 3  # different pad ids
    with torch.no_grad():
        a = model(ids, attention_mask=mask).logits
        b = model(other, attention_mask=mask).logits
        alone = model(ids[:1]).logits
    torch.testing.assert_close(a[1, 12:], b[1, 12:])
    unmasked = model(other, attention_mask=torch.ones_like(mask)).logits.detach()
    assert (unmasked[1, 12:] - a[1, 12:]).abs().amax() > 1e-4  # without the mask the pads would matter
    torch.testing.assert_close(a[0], alone[0], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(a).all()
