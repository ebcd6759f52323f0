"""llama.cpp's Self-Extend schedule against a line-by-line transliteration of its completion loop
(``tools/completion/completion.cpp``, llama-cpp-python 0.3.36's llama.cpp): the positions its KV
cache rotates its keys at, batch by batch (with its K-shift sign after seq_div, and the intended
one), and the attention kernel against an eager reference on those positions."""

from __future__ import annotations

import pytest
import torch

from ropescale.attention.rotate_on_read import AttentionRotary
from ropescale.attention.self_extend_llamacpp import _llamacpp
from ropescale.methods import RotarySpec, get_method
from ropescale.methods.self_extend_llamacpp import llamacpp_positions
from tests.attention.references import random_qkv, region_reference

TOL = 2e-6
SPEC = RotarySpec(16, 1e4, 64)


def completion_loop(n_prompt: int, n_gen: int, ga_n: int, ga_w: int, n_batch: int, kshift: str = "shipped"):
    """Yield ``(batch token indices, position every token so far is rotated at)`` per llama_decode
    call, as completion.cpp edits its cache: seq_add / seq_div move cell positions (C integer
    division) and record each cell's shift as src/llama-kv-cells.h's pos_add (``+d``) and pos_div
    (``p_old − pos``; ``intended``: ``pos − p_old``) do; the K-shift turns a key by its shift."""
    pos: list[int] = []
    turned: list[int] = []  # the position each key is rotated at: where it was written + its shifts

    def seq_add(p0, p1, delta):
        for j, p in enumerate(pos):
            if p0 <= p < p1:
                pos[j], turned[j] = p + delta, turned[j] + delta

    def seq_div(p0, p1, d):
        for j, p in enumerate(pos):
            if p0 <= p < p1:
                pos[j] = p // d
                turned[j] += p - pos[j] if kshift == "shipped" else pos[j] - p

    n_past = ga_i = 0
    batches = [range(s, min(s + n_batch, n_prompt)) for s in range(0, n_prompt, n_batch)]
    batches += [range(t, t + 1) for t in range(n_prompt, n_prompt + n_gen)]
    for batch in batches:
        while n_past >= ga_i + ga_w:
            ib = (ga_n * ga_i) // ga_w
            bd = (ga_w // ga_n) * (ga_n - 1)
            dd = (ga_w // ga_n) - ib * bd - ga_w
            seq_add(ga_i, n_past, ib * bd)
            seq_div(ga_i + ib * bd, ga_i + ib * bd + ga_w, ga_n)
            seq_add(ga_i + ib * bd + ga_w, n_past + ib * bd, dd)
            n_past -= bd
            ga_i += ga_w // ga_n
        for _ in batch:
            pos.append(n_past)
            turned.append(n_past)
            n_past += 1
        assert all(p <= n_past for p in pos)  # cell positions stay causal: the mask reads them
        yield list(batch), list(turned)


@pytest.mark.parametrize("kshift", ["shipped", "intended"])
@pytest.mark.parametrize(
    "n_prompt, n_gen, G, W, n_batch",
    [(100, 30, 4, 16, 32), (97, 50, 2, 8, 7), (64, 80, 8, 16, 64), (300, 10, 4, 32, 2048), (50, 40, 3, 12, 1)],
)
def test_positions_follow_the_completion_loop(n_prompt, n_gen, G, W, n_batch, kshift):
    for batch, pos in completion_loop(n_prompt, n_gen, G, W, n_batch, kshift):
        first, queries, keys = torch.tensor(batch[0]), torch.tensor(batch), torch.arange(len(pos))
        q_p, k_p = llamacpp_positions(first, queries, keys, G, W, kshift)
        assert k_p.tolist() == pos
        assert q_p.tolist() == pos[batch[0] :]


def rotary_for(G, W, n_batch, kshift="shipped"):
    method = get_method("self_extend_llamacpp", group_size=G, window=W, n_batch=n_batch, kshift=kshift)
    rotary = AttentionRotary(method, SPEC, "self_extend_llamacpp", "sdpa")
    rotary.group_size, rotary.window, rotary.n_batch, rotary.kshift = G, W, n_batch, kshift
    return rotary


def reference(q, k, v, q_index, G, W, n_batch, n_prompt, kshift="shipped"):
    """Each query row attends with the positions the loop gives its batch: [b, h, q, d] float64."""
    loop = list(completion_loop(n_prompt, k.shape[2] - n_prompt, G, W, n_batch, kshift))
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    for batch, pos in loop:
        rows = [r for r, i in enumerate(q_index) if i in batch]
        if not rows:
            continue
        end = batch[-1] + 1
        qp = torch.tensor([pos[i] for i in q_index[rows[0] : rows[-1] + 1]]).expand(q.shape[0], -1)
        kp = torch.tensor(pos[:end]).expand(q.shape[0], -1)
        everything = (lambda i, j: torch.ones(i.shape[0], i.shape[1], j.shape[2], dtype=torch.bool), qp, kp)
        part = q[:, :, rows[0] : rows[-1] + 1]
        got = region_reference(part, k[:, :, :end], v[:, :, :end], qp, kp, [everything], SPEC.base_inv_freq(), 0.25)
        out[:, :, rows[0] : rows[-1] + 1] = got
    return out


@pytest.mark.parametrize("kshift", ["shipped", "intended"])
@pytest.mark.parametrize("n, G, W, n_batch", [(97, 4, 16, 32), (64, 2, 8, 64), (40, 4, 8, 5), (130, 8, 16, 2048)])
def test_prefill_matches_the_loop(n, G, W, n_batch, kshift):
    q, k, v, q_pos, _ = random_qkv(n)
    got = _llamacpp(q, k, v, None, q_pos, rotary_for(G, W, n_batch, kshift), 0.25).transpose(1, 2)
    want = reference(q, k, v, list(range(n)), G, W, n_batch, n, kshift)
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=0)


@pytest.mark.parametrize("kshift", ["shipped", "intended"])
@pytest.mark.parametrize("n_prompt, n, G, W, n_batch", [(40, 90, 4, 16, 16), (20, 50, 2, 8, 2048)])
def test_decoding_steps_match_the_loop(n_prompt, n, G, W, n_batch, kshift):
    q, k, v, _, _ = random_qkv(n, q_len=n, seed=1)
    rotary = rotary_for(G, W, n_batch, kshift)
    want = reference(q, k, v, list(range(n)), G, W, n_batch, n_prompt, kshift)
    for i in range(n_prompt, n):  # one generated token at a time, over the cache of all before it
        step = torch.tensor([[i]]).expand(2, -1)
        got = _llamacpp(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], None, step, rotary, 0.25)
        torch.testing.assert_close(got.transpose(1, 2).double(), want[:, :, i : i + 1], atol=TOL, rtol=0)


def test_masked_path_matches_the_mask_free_one():
    q, k, v, q_pos, _ = random_qkv(70)
    rotary = rotary_for(4, 16, 24)
    causal = torch.ones(70, 70, dtype=torch.bool).tril()[None, None].expand(2, -1, -1, -1)
    free = _llamacpp(q, k, v, None, q_pos, rotary, 0.25)
    masked = _llamacpp(q, k, v, causal, q_pos, rotary, 0.25)
    torch.testing.assert_close(masked, free, atol=TOL, rtol=0)


def test_the_batch_size_changes_the_result():
    q, k, v, q_pos, _ = random_qkv(97)
    a = _llamacpp(q, k, v, None, q_pos, rotary_for(4, 16, 32), 0.25)
    b = _llamacpp(q, k, v, None, q_pos, rotary_for(4, 16, 2048), 0.25)
    assert (a - b).abs().max() > 1e-2
