"""DCA's temperature in cached decoding: ropescale's step differs from ChunkLlama's, exactly as
ropescale/attention/dca.py and docs/methods.md say. ChunkLlama caches keys rotated with the cos/sin
of the step that wrote them (× get_mscale(n_then / L)); ropescale scales the query by the current
length's factor squared, i.e. gives every cached key the factor of the current length. So a step
after the cache crossed L differs by about c·ln(n_now / n_then) on the keys written earlier (before:
the docstring said a cached step "equals the reference's cached step"), while the prefill, and
decoding without the temperature, are equal (tests/attention/test_reference_methods.py)."""

from __future__ import annotations

import torch

from tests.attention import repo_references as repo
from tests.attention.test_reference_methods import PROMPT, TOL, decoded, inputs, patched, swapped
from tests.conftest import ORIGINAL_CONTEXT

L = ORIGINAL_CONTEXT


def chunkllama_keeping_key_factors(coefficient: float):
    """ChunkLlama's forward (chunk 3L/4, window L/8) whose cached keys keep the factor of the step that
    wrote them: rotation is linear, so a key written at length m is the file's key × mscale(m)/mscale(n)."""
    inner = repo.chunkllama(48, 8, L, coefficient)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        n = key.shape[2]
        written = torch.arange(1, n + 1).clamp(min=PROMPT)  # the prompt's keys at PROMPT, then one per step
        ratio = torch.tensor([repo.get_mscale(m / L, coefficient) for m in written.tolist()])
        ratio = ratio / repo.get_mscale(n / L, coefficient)
        return inner(module, query, key * ratio[None, None, :, None], value, attention_mask, scaling, dropout, **kwargs)

    return attention


def test_cached_step_keeps_no_key_factor_and_differs_from_the_reference():
    model, ids = patched("dca", "llama"), inputs(2 * L + 13)
    ours = decoded(model, ids, PROMPT)
    with swapped(model, repo.chunkllama(48, 8, L, 0.05)):
        every_key_now = decoded(model, ids, PROMPT)  # the file's rotation, every key at this step's factor
    with swapped(model, chunkllama_keeping_key_factors(0.05)):
        reference = decoded(model, ids, PROMPT)  # each cached key keeps the factor of its own step
    torch.testing.assert_close(ours, every_key_now, rtol=0, atol=TOL)  # what ropescale does
    before_L = L - PROMPT + 1  # steps whose length is still <= L: no temperature, nothing differs
    torch.testing.assert_close(ours[:, :before_L], reference[:, :before_L], rtol=0, atol=TOL)
    gap = float((ours - reference).abs().max())
    assert gap > 20 * TOL, gap  # the difference the docstring states (1.3e-4 here)
    assert gap < 0.05 * float(reference.abs().max()), gap  # small: c·ln(n_now/n_then), c = 0.05
