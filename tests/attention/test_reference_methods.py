"""The attention-level methods against the reference repositories' own computation, every variant.

Each case patches a tiny Llama / Mistral with a ropescale method and runs it twice: with ropescale's
kernel, and with an eager attention written from the reference file (:mod:`.repo_references`)
in its place (same weights, same unrotated KV cache). Prefill at 1×, 2×, 4× L and an odd length,
and cached decoding from within L across L and 2L, in fp32, must agree to rounding; a reference with
one constant changed must not (so the comparison sees the constants).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import ropescale
from ropescale.attention.function import register_attention
from tests.attention import repo_references as repo
from tests.attention.decoding import assert_padded_batch_equals_rows_alone, cached_vs_full, max_diff
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

L = ORIGINAL_CONTEXT
LENGTHS = (L, 2 * L, 4 * L, 2 * L + 13)
PROMPT = 50  # decoding runs from here to 2L + 13
TOL = 2e-6  # fp32 logits (|logit| < 1), dense softmax against merged partial attentions: ~2e-7 apart
NAME = "ropescale_test_repo_reference"

#: case -> (ropescale method and parameters, the reference's attention (file in the comment))
CASES = {
    # ChunkLlama chunkllama_attn_replace.py: chunk 3L/4 = 48, local window L/8 = 8, 0.05·ln(n/L) + 1
    "dca": (dict(method="dca", factor=4), repo.chunkllama(48, 8, L, 0.05)),
    # ChunkLlama flash_decoding_chunkllama.py: local window L/16 = 4, 0.1·ln(n/L) + 1
    "dca-flash": (dict(method="dca", factor=4, variant="chunkllama_flash"), repo.chunkllama(48, 4, L, 0.1)),
    "dca-no-temperature": (dict(method="dca", factor=4, temperature=False), repo.chunkllama(48, 8, L, 0.0)),
    # STRING string_for_llama.py: S = int(0.33 L) = 21 (W falls back to L/64 = 1 at this L), factor 0.1 ln 2 + 1
    "string": (dict(method="string"), repo.string(21, 1)),
    "string-w8": (dict(method="string", shift=30, local_window=8), repo.string(30, 8)),
    # STRING string_for_qwen2.py: YaRN's frequencies, STRING's factor
    "string-yarn": (dict(method="string", factor=4, frequencies="yarn"), repo.string(21, 1, 4.0, L)),
    # LongLM Mistral.py (W − W // G) and Llama.py (W − W / G); G = 3 does not divide W = 16
    "self_extend-floor": (dict(method="self_extend", group_size=3, window=16), repo.self_extend(3, 16, True)),
    "self_extend-float": (
        dict(method="self_extend", group_size=3, window=16, shift="float"),
        repo.self_extend(3, 16, False),
    ),
    "self_extend-float-logn": (
        dict(method="self_extend", group_size=3, window=16, shift="float", logn=True),
        repo.self_extend(3, 16, False, scale_base=L),
    ),
}

#: a reference with one constant off, which the comparison must see: case -> wrong reference
MUTANTS = {
    "dca": repo.chunkllama(48, 8, L, 0.1),  # the flash file's coefficient
    "dca-flash": repo.chunkllama(48, 8, L, 0.1),  # the plain file's local window
    "dca-no-temperature": repo.chunkllama(48, 8, L, 0.05),
    "string": repo.string(22, 1),
    "string-w8": repo.string(30, 9),
    "string-yarn": repo.string(21, 1, 3.0, L),
    "self_extend-floor": repo.self_extend(3, 16, False),
    "self_extend-float": repo.self_extend(3, 16, True),
    "self_extend-float-logn": repo.self_extend(3, 16, False),
}


def patched(case: str, arch: str):
    params = dict(CASES[case][0])
    return ropescale.patch(tiny_model(arch, num_hidden_layers=2), params.pop("method"), **params)


@contextlib.contextmanager
def swapped(model, attention):
    """Run ``model`` with ``attention`` in place of its kernel (it too takes unrotated q/k)."""
    rotary, own = model.model.rotary_emb, model.config._attn_implementation
    register_attention(NAME, attention)
    model.set_attn_implementation(NAME)
    rotary.attention_name = NAME
    try:
        yield model
    finally:
        model.set_attn_implementation(own)
        rotary.attention_name = own


def prefill(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits  # [b, n, vocab]


def decoded(model, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Teacher-forced cached decoding: the prompt's last logits, then one step per token. # [b, steps, vocab]"""
    with torch.no_grad():
        out = model(ids[:, :prompt], use_cache=True)
        rows, cache = [out.logits[:, -1]], out.past_key_values
        for n in range(prompt + 1, ids.shape[1] + 1):
            out = model(ids[:, n - 1 : n], past_key_values=cache, use_cache=True)
            rows.append(out.logits[:, -1])
            cache = out.past_key_values
    return torch.stack(rows, 1)


def inputs(n: int) -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(0, 128, (2, n))


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_matches_the_reference_file(case, arch):
    model, ids = patched(case, arch), inputs(max(LENGTHS))
    for n in LENGTHS:
        ours = prefill(model, ids[:, :n])
        with swapped(model, CASES[case][1]):
            theirs = prefill(model, ids[:, :n])
        torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL, msg=lambda m, n=n: f"n={n}: {m}")


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("case", CASES)
def test_cached_decoding_matches_the_reference_file(case, arch):
    model, ids = patched(case, arch), inputs(2 * L + 13)
    ours = decoded(model, ids, PROMPT)
    with swapped(model, CASES[case][1]):
        theirs = decoded(model, ids, PROMPT)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=TOL)


@pytest.mark.parametrize("case", CASES)
def test_a_constant_off_is_seen(case):
    model, ids = patched(case, "llama"), inputs(4 * L)
    ours = prefill(model, ids)
    with swapped(model, MUTANTS[case]):
        wrong = prefill(model, ids)
    assert float((ours - wrong).abs().max()) > 100 * TOL


@pytest.mark.parametrize("case", ["string", "string-yarn", "self_extend-float", "self_extend-float-logn"])
def test_the_variants_keep_cached_decoding_equal_to_recomputation(case):
    """Not DCA's temperature: it makes a token's states depend on the length they were computed at."""
    torch.manual_seed(5)
    model = patched(case, "llama")
    cached, full = cached_vs_full(model, torch.randint(0, 128, (2, 2 * L + 13)), prompt=PROMPT)
    assert max_diff(cached, full) < TOL


@pytest.mark.parametrize("case", ["dca", "dca-flash", "string", "self_extend-float"])
def test_the_variants_keep_padded_rows_equal_to_rows_alone(case):
    torch.manual_seed(6)
    params = dict(CASES[case][0])
    model = ropescale.patch(tiny_model(attn_implementation="sdpa"), params.pop("method"), **params)
    assert_padded_batch_equals_rows_alone(model, short=50, long=90, new_tokens=20)
