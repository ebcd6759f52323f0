"""llama.cpp's own completion tool with ``--grp-attn-n/--grp-attn-w`` generates, greedily, what
ropescale's ``self_extend_llamacpp`` generates on the exported GGUF, past the trained context; LongLM's
``self_extend``, the wrong batch size and the intended (not the shipped) K-shift sign do not. Runs only when $LLAMA_COMPLETION names the binary
(``make llamacpp`` builds it)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from ropescale import patch
from ropescale.export import export_gguf
from ropescale.export.llamacpp_completion import greedy_ids, run_llama_completion, token_bytes
from tests.export.conftest import VOCAB, tiny_tokenizer
from tests.export.test_gguf_llamacpp import WORDS, sharp_model

BINARY = os.environ.get("LLAMA_COMPLETION", "")
pytestmark = pytest.mark.skipif(
    not Path(BINARY).is_file(), reason="set LLAMA_COMPLETION to llama.cpp's llama-completion binary to run"
)
G, W, N_PREDICT = 4, 16, 24  # the tiny model's trained context is 64: Self-Extend reaches 208 tokens


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(GGUF, tokenizer, prompt file, banned ids): a ~150-token prompt, 2.3x the trained context."""
    random.seed(1)
    folder = tmp_path_factory.mktemp("grp")
    prompt = folder / "prompt.txt"
    prompt.write_text(" ".join(random.choice(WORDS[:-1]) for _ in range(52)), encoding="utf-8")
    tokenizer = tiny_tokenizer("gpt2")
    gguf = export_gguf(sharp_model(), folder / "m.gguf", "f32", tokenizer=tokenizer)
    banned = [*tokenizer.all_special_ids, *range(len(tokenizer), VOCAB)]  # no end of generation, no padding ids
    return gguf, tokenizer, prompt, banned


def llama_cpp(setup, n_batch, f32_cache=True):
    gguf, _, prompt, banned = setup
    return run_llama_completion(
        BINARY, gguf, prompt, N_PREDICT, group_size=G, window=W, n_batch=n_batch, banned=banned,
        threads=1, f32_cache=f32_cache,
    )  # fmt: skip


def ours(setup, prompt_ids, method, **params):
    _, tokenizer, _, banned = setup
    model = patch(sharp_model(), method, group_size=G, window=W, **params)
    return token_bytes(tokenizer, greedy_ids(model, prompt_ids, N_PREDICT, banned))


@pytest.mark.parametrize("n_batch, f32_cache", [(32, True), (2048, True), (32, False)])
def test_llama_cpp_generates_what_self_extend_llamacpp_predicts(setup, n_batch, f32_cache):
    prompt_ids, theirs, log = llama_cpp(setup, n_batch, f32_cache)
    assert 2 * 64 < len(prompt_ids) < 208 - N_PREDICT, log[-2000:]  # past L, within Self-Extend's reach
    assert theirs == ours(setup, prompt_ids, "self_extend_llamacpp", n_batch=n_batch), log[-2000:]


def test_longlm_self_extend_the_wrong_batch_size_and_the_intended_kshift_do_not(setup):
    prompt_ids, theirs, log = llama_cpp(setup, 32)
    assert theirs != ours(setup, prompt_ids, "self_extend")  # the check tells the schedules apart
    assert theirs != ours(setup, prompt_ids, "self_extend_llamacpp", n_batch=2048)
    assert theirs != ours(setup, prompt_ids, "self_extend_llamacpp", n_batch=32, kshift="intended")
