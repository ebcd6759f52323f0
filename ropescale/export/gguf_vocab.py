"""A Hugging Face (fast) tokenizer as llama.cpp's ``tokenizer.ggml.*`` metadata.

Built from the tokenizer itself (its ``tokenizer.json`` model, pre-tokenizer and behaviour), never
copied from a reference file. Two BPE families, as llama.cpp's converter
(``convert_hf_to_gguf.py``: ``_set_vocab_gpt2``, ``_set_vocab_llama_hf``) distinguishes them:

- byte-level BPE (GPT-2, SmolLM, Llama 3): ``tokenizer.ggml.model = "gpt2"``, the tokens in their
  byte-level spelling, the merges, and ``tokenizer.ggml.pre`` naming llama.cpp's pre-tokenizer
  (read off the tokenizer's pre-tokenizer: plain ByteLevel is ``gpt-2``, digits split first is
  ``smollm``, Llama 3's split regex is ``llama-bpe``, Qwen2's ``qwen2``);
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral 7B): ``"llama"``, ``▁``-spelled
  tokens with scores. llama.cpp's SPM tokenizer merges the adjacent pair whose concatenation has
  the highest score, so a token made by merge rank r gets score −r: the same merge order as BPE.

Whether BOS/EOS are added is measured (encode a word with and without special tokens), so the
GGUF adds exactly what the Hugging Face tokenizer adds.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypedDict

from ..errors import RopescaleError
from .gguf_rope import GGUFMetadata

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType values

#: Llama 3's split regex as it appears in tokenizer.json (llama.cpp's ``llama-bpe``).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
#: Qwen2's (and Qwen2.5's, Qwen3's) split regex: Llama 3's with single digits (llama.cpp's ``qwen2``).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
SPM_SPACE = "\u2581"  # ▁


class TokenizerStep(TypedDict, total=False):
    """One step of ``tokenizer.json``'s ``normalizer`` or ``pre_tokenizer`` (a ``Sequence`` holds
    others): the keys read to name llama.cpp's pre-tokenizer and its space prefix."""

    type: str
    pretokenizers: list[TokenizerStep]
    normalizers: list[TokenizerStep]
    use_regex: bool
    individual_digits: bool
    pattern: dict[str, str]  # {"Regex": ...} or {"String": ...}
    prepend: str
    prepend_scheme: str
    add_prefix_space: bool


class BPEModel(TypedDict, total=False):
    """``tokenizer.json``'s ``model``: the keys of a BPE model read here."""

    type: str
    vocab: dict[str, int]
    merges: list[str] | list[list[str]]
    byte_fallback: bool


class AddedToken(TypedDict, total=False):
    """An entry of ``tokenizer.json``'s ``added_tokens``."""

    id: int
    content: str
    special: bool


class TokenizerJSON(TypedDict, total=False):
    """A fast tokenizer's ``tokenizer.json`` (JSON read from the tokenizer): the keys read here."""

    model: BPEModel
    normalizer: TokenizerStep | None
    pre_tokenizer: TokenizerStep | None
    added_tokens: list[AddedToken]


def tokenizer_json(tokenizer: Any) -> TokenizerJSON:
    """The ``tokenizer.json`` structure of a fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise RopescaleError(
            f"GGUF export needs a fast (tokenizers) tokenizer with a tokenizer.json; got {type(tokenizer).__name__}"
        )
    return json.loads(backend.to_str())


def vocab_metadata(tokenizer: Any, vocab_size: int, pre_tokenizer: str | None = None) -> GGUFMetadata:
    """All ``tokenizer.ggml.*`` keys for ``tokenizer`` on a model with ``vocab_size`` embeddings.

    Args:
        tokenizer: a Hugging Face fast tokenizer (BPE).
        vocab_size: rows of the model's embedding; ids the tokenizer lacks become ``[PAD<i>]`` (unused).
        pre_tokenizer: llama.cpp pre-tokenizer name for byte-level BPE, overriding the detection.

    Returns:
        Key → value (lists for arrays); the writer picks the GGUF types.
    """
    spec = tokenizer_json(tokenizer)
    model: BPEModel = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise RopescaleError(
            f"GGUF export supports BPE tokenizers (GPT-2 and SentencePiece style), got {model.get('type')!r}"
        )
    spm = bool(model.get("byte_fallback"))
    tokens, types = _tokens_and_types(spec, vocab_size, spm, getattr(tokenizer, "unk_token_id", None))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out: GGUFMetadata = {"tokenizer.ggml.model": "llama" if spm else "gpt2"}
    if spm:
        out["tokenizer.ggml.tokens"] = tokens
        out["tokenizer.ggml.scores"] = merge_scores(tokens, merges)
        out["tokenizer.ggml.token_type"] = types
        out["tokenizer.ggml.add_space_prefix"] = spm_adds_space_prefix(spec)
    else:
        out["tokenizer.ggml.pre"] = pre_tokenizer or detect_pre_tokenizer(spec)
        out["tokenizer.ggml.tokens"] = tokens
        out["tokenizer.ggml.token_type"] = types
        out["tokenizer.ggml.merges"] = merges
        out["tokenizer.ggml.add_space_prefix"] = bool(_byte_level(spec.get("pre_tokenizer")).get("add_prefix_space"))
    for role in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if isinstance(token_id, int) and 0 <= token_id < vocab_size:
            out[f"tokenizer.ggml.{'padding' if role == 'pad' else ('unknown' if role == 'unk' else role)}_token_id"] = (
                token_id
            )
    add_bos, add_eos = added_specials(tokenizer)
    out["tokenizer.ggml.add_bos_token"] = add_bos
    out["tokenizer.ggml.add_eos_token"] = add_eos
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        out["tokenizer.chat_template"] = template
    return out


def _tokens_and_types(
    spec: TokenizerJSON, vocab_size: int, spm: bool, unk_id: int | None
) -> tuple[list[str], list[int]]:
    by_id: dict[int, str] = {int(i): t for t, i in spec["model"]["vocab"].items()}
    added = {int(a["id"]): a for a in spec.get("added_tokens", [])}
    for i, a in added.items():
        by_id[i] = a["content"]
    if by_id and max(by_id) >= vocab_size:
        raise RopescaleError(f"the tokenizer has token id {max(by_id)} but the model only {vocab_size} embeddings")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        text = by_id[i]
        tokens.append(text)
        if spm and i == unk_id:  # SentencePiece's <unk> is UNKNOWN even where HF lists it as special
            types.append(UNKNOWN)
        elif i in added:
            special = added[i].get("special") or (text.startswith("<|") and text.endswith("|>"))
            types.append(CONTROL if special else USER_DEFINED)
        elif spm and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    return tokens, types


def merge_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """SentencePiece-style scores: −(rank of the first merge that makes the token), 0 otherwise."""
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        rank.setdefault(left + right, r)
    return [float(-rank[t]) if t in rank else 0.0 for t in tokens]


def _parts(node: TokenizerStep | None) -> list[TokenizerStep]:
    """The steps of a (possibly Sequence) normalizer or pre-tokenizer."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        key = "pretokenizers" if "pretokenizers" in node else "normalizers"
        return [p for child in node.get(key, []) for p in _parts(child)]
    return [node]


def _byte_level(node: TokenizerStep | None) -> TokenizerStep:
    return next((p for p in _parts(node) if p.get("type") == "ByteLevel"), {})


def detect_pre_tokenizer(spec: TokenizerJSON) -> str:
    """llama.cpp's name for a byte-level BPE pre-tokenizer, read off its steps."""
    parts = [p for p in _parts(spec.get("pre_tokenizer"))]
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        pattern = parts[0].get("pattern", {})
        if pattern.get("Regex") == LLAMA3_SPLIT:
            return "llama-bpe"
        if pattern.get("Regex") == QWEN2_SPLIT:
            return "qwen2"
    raise RopescaleError(
        f"the tokenizer's pre-tokenizer ({' + '.join(map(str, kinds)) or 'none'}) has no known llama.cpp name; "
        "pass the llama.cpp pre-tokenizer name explicitly (--tokenizer-pre NAME)"
    )


def spm_adds_space_prefix(spec: TokenizerJSON) -> bool:
    """Whether a SentencePiece-style tokenizer prepends ``▁`` to the text (llama.cpp's add_space_prefix)."""
    for p in _parts(spec.get("normalizer")):
        if p.get("type") == "Prepend" and p.get("prepend") == SPM_SPACE:
            return True
    for p in _parts(spec.get("pre_tokenizer")):
        if p.get("type") == "Metaspace":
            return p.get("prepend_scheme", "always" if p.get("add_prefix_space", True) else "never") != "never"
    return False


def added_specials(tokenizer: Any) -> tuple[bool, bool]:
    """(adds BOS, adds EOS) as the tokenizer actually does when encoding with special tokens."""
    text = "Hello world"
    plain = tokenizer(text, add_special_tokens=False)["input_ids"]
    full = tokenizer(text, add_special_tokens=True)["input_ids"]
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    extra = len(full) > len(plain)
    return (
        bool(extra and bos is not None and full[0] == bos and full[1 : 1 + len(plain)] == plain),
        bool(extra and eos is not None and full[-1] == eos),
    )
