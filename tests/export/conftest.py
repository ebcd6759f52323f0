"""A tiny random Llama with a tiny byte-level BPE tokenizer, saved as a checkpoint directory."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model

VOCAB = 300  # 256 byte-level symbols, a few merges, 3 specials


def tiny_tokenizer(kind: str = "gpt2"):
    """A byte-level BPE (``gpt2``) or SentencePiece-style BPE with byte fallback (``spm``) tokenizer."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if kind == "gpt2":
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        vocab = {c: i for i, c in enumerate(sorted(alphabet))}
        merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "n"), ("Ġ", "a")]
        for a, b in merges:
            vocab[a + b] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}
    else:
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
        vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
        merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("a", "n")]
        for ch in "▁thean":
            vocab.setdefault(ch, len(vocab))
        for a, b in merges:
            vocab[a + b] = len(vocab)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    fast.add_special_tokens({k: v for k, v in specials.items()})
    return fast


def tiny_llama(seed: int = 0, **overrides):
    return tiny_model("llama", seed=seed, vocab_size=VOCAB, **overrides)


@pytest.fixture
def checkpoint(tmp_path):
    """(directory, model, tokenizer) of a saved tiny Llama with a byte-level BPE tokenizer."""
    torch.manual_seed(0)
    model, tokenizer = tiny_llama(), tiny_tokenizer()
    path = tmp_path / "tiny-llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer
