"""Offline fixtures for the evaluation tests: a tiny random Llama and tiny trained tokenizers."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from ropescale.evals.tasks.passkey import FILLER, NEEDLE, QUESTION, TASK
from ropescale.models import tiny

SPECIAL = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}

# Made-up English: the passkey prompt's words plus some prose, and every digit.
CORPUS = [
    TASK,
    FILLER,
    NEEDLE.format(key=12345),
    NEEDLE.format(key=67890),
    QUESTION,
    "The quick brown fox jumps over the lazy dog. A cat sat on the mat and looked at the rain.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 and 2024 or 31415 appear in text. What is it? It is here.",
    "She went to the market, bought bread and milk, then walked home along the river.",
] * 20


def _train(kind: str) -> PreTrainedTokenizerFast:
    """Train a small BPE tokenizer: byte-level (GPT-2/SmolLM style) or Metaspace (SentencePiece style).

    Digits are always split one per token, so any 5-digit key encodes and decodes exactly.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(prepend_scheme="first"), pre_tokenizers.Digits(individual_digits=True)]
        )
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(SPECIAL.values()), initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    # Prepend BOS like Llama's tokenizer does.
    bos = tok.token_to_id(SPECIAL["bos_token"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)


@pytest.fixture(scope="session")
def bytelevel_tokenizer() -> PreTrainedTokenizerFast:
    return _train("bytelevel")


@pytest.fixture(scope="session")
def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    return _train("metaspace")


@pytest.fixture(params=["bytelevel", "metaspace"])
def tokenizer(request) -> PreTrainedTokenizerFast:
    """Both tokenizer styles, one after the other."""
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(scope="session")
def tiny_llama(bytelevel_tokenizer) -> LlamaForCausalLM:
    """A 2-layer random Llama whose vocabulary matches the byte-level tokenizer, in eval mode."""
    return sharpened_tiny_llama(bytelevel_tokenizer)


def sharpened_tiny_llama(tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """:func:`tiny_llama` for ``tok`` (also used outside this folder: tests/test_goldens.py)."""
    model = tiny.tiny_model(
        vocab_size=len(tok),
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        attn_implementation="sdpa",
    )
    # Random init with std 0.02 gives nearly uniform predictions; sharpen them so the NLL comparisons
    # are not trivially satisfied by any distribution.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_llama, bytelevel_tokenizer):
    """:func:`tiny_llama` and its tokenizer saved as a checkpoint directory (for ``--model``)."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama.save_pretrained(path)
    bytelevel_tokenizer.save_pretrained(path)
    return path
