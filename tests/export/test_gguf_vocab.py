"""Tokenizer metadata for GGUF, built from the Hugging Face tokenizer (byte-level and SentencePiece BPE)."""

from __future__ import annotations

import pytest

from ropescale.errors import RopescaleError
from ropescale.export.gguf_vocab import (
    BYTE,
    CONTROL,
    LLAMA3_SPLIT,
    NORMAL,
    UNKNOWN,
    UNUSED,
    detect_pre_tokenizer,
    vocab_metadata,
)
from tests.export.conftest import VOCAB, tiny_tokenizer


def test_byte_level_bpe():
    tok = tiny_tokenizer("gpt2")
    meta = vocab_metadata(tok, VOCAB)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == VOCAB
    assert tokens[tok.convert_tokens_to_ids("Ġthe")] == "Ġthe" and types[tok.convert_tokens_to_ids("Ġthe")] == NORMAL
    assert tokens[tok.bos_token_id] == "<|im_start|>" and types[tok.bos_token_id] == CONTROL
    assert tokens[-1] == f"[PAD{VOCAB - 1}]" and types[-1] == UNUSED  # rows the tokenizer does not use
    assert meta["tokenizer.ggml.merges"][:3] == ["Ġ t", "h e", "Ġt he"]
    assert meta["tokenizer.ggml.bos_token_id"] == tok.bos_token_id
    assert meta["tokenizer.ggml.eos_token_id"] == tok.eos_token_id
    assert meta["tokenizer.ggml.unknown_token_id"] == tok.unk_token_id
    assert meta["tokenizer.ggml.add_bos_token"] is False and meta["tokenizer.ggml.add_eos_token"] is False


def test_added_bos_is_measured_from_the_tokenizer():
    from tokenizers import processors

    tok = tiny_tokenizer("gpt2")
    bos = tok.bos_token
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.bos_token_id)]
    )
    assert tok("the")["input_ids"][0] == tok.bos_token_id
    assert vocab_metadata(tok, VOCAB)["tokenizer.ggml.add_bos_token"] is True


def test_sentencepiece_style_bpe_scores_follow_merge_order():
    tok = tiny_tokenizer("spm")
    meta = vocab_metadata(tok, VOCAB)
    assert meta["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in meta
    tokens, scores, types = (meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    score = dict(zip(tokens, scores))
    # llama.cpp's SPM tokenizer merges the highest-scoring pair first: rank 0 must score highest
    assert score["▁t"] > score["he"] > score["▁the"] > score["an"]
    assert types[tokens.index("<0x41>")] == BYTE and types[tok.unk_token_id] == UNKNOWN
    assert types[tok.bos_token_id] == CONTROL
    assert meta["tokenizer.ggml.add_space_prefix"] is True


def _spec(pre):
    return {"pre_tokenizer": pre}


def test_pre_tokenizer_names():
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    assert detect_pre_tokenizer(_spec(byte_level)) == "gpt-2"
    digits = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    assert detect_pre_tokenizer(_spec(digits)) == "smollm"
    split = {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated", "invert": False}
    llama3 = {"type": "Sequence", "pretokenizers": [split, {**byte_level, "use_regex": False}]}
    assert detect_pre_tokenizer(_spec(llama3)) == "llama-bpe"
    other = {
        "type": "Sequence",
        "pretokenizers": [{**split, "pattern": {"Regex": r"\p{N}{1,2}"}}, {**byte_level, "use_regex": False}],
    }
    with pytest.raises(RopescaleError, match="--tokenizer-pre"):
        detect_pre_tokenizer(_spec(other))
    assert vocab_metadata(tiny_tokenizer("gpt2"), VOCAB, pre_tokenizer="smollm")["tokenizer.ggml.pre"] == "smollm"


def test_a_tokenizer_larger_than_the_model_is_refused():
    with pytest.raises(RopescaleError, match="only 100 embeddings"):
        vocab_metadata(tiny_tokenizer("gpt2"), 100)


def test_a_qwen2_tokenizer_is_llama_cpps_qwen2(tmp_path):
    """transformers builds Qwen2/Qwen3 checkpoints' tokenizer with Qwen's own split regex (single digits):
    llama.cpp's ``qwen2`` pre-tokenizer (issue 51: before, export asked for --tokenizer-pre)."""
    from ropescale.models.loading import load_tokenizer
    from tests.conftest import tiny_model

    tiny_model("qwen2", vocab_size=VOCAB).save_pretrained(tmp_path)
    tiny_tokenizer("gpt2").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(str(tmp_path))
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert vocab_metadata(tokenizer, VOCAB)["tokenizer.ggml.pre"] == "qwen2"
