"""One intra-op thread for the tiny models: on a busy 2-core machine torch's thread pool spends
far longer waiting for a core than computing a 64-wide matmul."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


NEEDLE_WORDS = ["The", "the", "pass", "key", "is", "Remember", "it", "What", ".", "?"]


def word_tokenizer(words: list[str]):
    """A word-level tokenizer (ids < 128, the tiny models' vocabulary) that splits digits one by one and
    knows the needle prompts' words, so the keys and the question tokenize as with a real tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<unk>", "<s>", *(str(d) for d in range(10)), *NEEDLE_WORDS, *words]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    assert len(names) <= 128
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
