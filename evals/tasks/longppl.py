"""LongPPL (Fang et al., arXiv 2410.23771): perplexity on the tokens that need the long context.

Plain perplexity averages over every token, and most tokens of a long document are predicted as
well from the last few thousand tokens as from all of them; the paper finds it uncorrelated with
LongBench while perplexity on *key tokens* correlates at −0.96. A token is key when an evaluator
model predicts it much better with the whole document than with a short window before it. This
module follows the authors' code (github.com/BlackieFang/LongPPL, ``LongPPL/longppl.py``):

1. the evaluator scores the document once with its full context, then in windows: for positions
   ``start + trunc_len … start + trunc_len + internal`` (``start`` steps by ``internal``), the
   loss with only the window ``[start, start + trunc_len + internal)`` before them;
2. a token is key when ``loss_short − loss_full > 2`` and ``loss_full < 2`` (nats; the paper's
   α = 2 and β = −2 on the log probability); defaults ``trunc_len = 4096``, ``internal = 1024``;
3. key tokens become character spans of the text (adjacent spans merged), and the evaluated model's
   tokens lying wholly inside a span are its key tokens (so evaluator and model may tokenize apart);
4. the evaluated model scores the text in one pass (no BOS, as the authors' ``add_special_tokens=False``);
   LongPPL is ``exp`` of its mean loss on the key tokens, PPL of its mean loss on all of them;
   documents are combined by the authors' rule: each document's value weighted by its token count.

The evaluator here defaults to the evaluated checkpoint itself, unscaled (the reports say so); the
paper used Qwen2-72B-Instruct, Mistral-Large or Llama-3.1-8B. A small evaluator beyond its own
trained context finds few key tokens — their number is part of every result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

import torch
import torch.nn.functional as F

from ropescale.scoring.nll import final_hidden_states, model_device

#: the authors' defaults (``--trunc-len``, ``--internal``) and thresholds
TRUNC_LEN, INTERNAL, ALPHA, BETA = 4096, 1024, 2.0, 2.0


@torch.inference_mode()
def token_losses(model: Any, input_ids: list[int] | torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Next-token cross entropy of every position: ``out[k]`` is the loss of token ``k + 1``, in fp32
    (the LM head runs ``chunk_size`` positions at a time, so a 32k-token window never holds its logits)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=model_device(model)).reshape(1, -1)  # [1, T]
    hidden = final_hidden_states(model, ids)[0, :-1]  # [T-1, H]
    targets = ids[0, 1:]  # [T-1]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    parts = []
    for i in range(0, targets.numel(), chunk_size):
        logits = model.lm_head(hidden[i : i + chunk_size]).float()  # [c, V]
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        parts.append(F.cross_entropy(logits, targets[i : i + chunk_size], reduction="none"))
    return torch.cat(parts).cpu() if parts else torch.zeros(0)


def find_key_tokens(
    evaluator: Any,
    input_ids: list[int],
    trunc_len: int = TRUNC_LEN,
    internal: int = INTERNAL,
    alpha: float = ALPHA,
    beta: float = BETA,
) -> list[int]:
    """Positions (in ``input_ids``) of the key tokens by the authors' rule (step 1-2 above)."""
    n = len(input_ids)
    full = token_losses(evaluator, input_ids)  # [n-1]
    keys: list[int] = []
    for start in range(0, n - trunc_len, internal):
        step = min(internal, n - start - trunc_len)  # the last window is cut at the end
        window = input_ids[start : start + trunc_len + step]
        short = token_losses(evaluator, window)[trunc_len - 1 : trunc_len + step - 1]
        long = full[start + trunc_len - 1 : start + trunc_len + step - 1]
        hit = ((short - long) > alpha) & (long < beta)
        keys += [start + trunc_len + int(i) for i in torch.nonzero(hit).flatten()]
    return keys


def key_spans(offsets: list[tuple[int, int]], keys: list[int]) -> list[tuple[int, int]]:
    """The character spans of the key tokens, adjacent ones merged (the authors' ``merge_intervals``)."""
    spans: list[tuple[int, int]] = []
    for k in keys:
        a, b = offsets[k]
        if spans and spans[-1][1] == a:
            spans[-1] = (spans[-1][0], b)
        else:
            spans.append((a, b))
    return spans


def loss_positions(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """Indices into :func:`token_losses` of the tokens wholly inside a span (the authors' ``cal_overlap``:
    token ``i``'s loss sits at ``i − 1``)."""
    out, i, j = [], 0, 0
    while i < len(offsets) and j < len(spans):
        (a0, a1), (b0, b1) = offsets[i], spans[j]
        if a0 >= b0 and a1 <= b1:
            out.append(i - 1)
            i += 1
        elif a0 < b0:
            i += 1
        else:
            j += 1
    return out


@dataclass
class LongPPLDocument:
    """One document (window) scored: LongPPL (None without key tokens), PPL and the counts."""

    title: str
    longppl: float | None
    ppl: float
    key_tokens: int
    tokens: int


class LongPPLDocJSON(TypedDict):
    """A :class:`LongPPLDocument` as a cell keeps it (``asdict``)."""

    title: str
    longppl: float | None
    ppl: float
    key_tokens: int
    tokens: int


class LongPPLTotals(TypedDict):
    """The authors' totals over a cell's documents (:func:`combine`): a LongPPL cell's numbers."""

    longppl: float | None
    ppl: float | None
    key_tokens: int
    tokens: int
    documents: list[LongPPLDocJSON]


def score_text(model: Any, tokenizer: Any, text: str, spans: list[tuple[int, int]], title: str = "") -> LongPPLDocument:
    """The evaluated model's LongPPL and PPL on ``text`` given the evaluator's key ``spans`` (step 3-4)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    losses = token_losses(model, enc["input_ids"]).double()  # [T-1]
    positions = loss_positions([tuple(o) for o in enc["offset_mapping"]], spans)
    ppl = math.exp(losses.mean().item())
    if not positions:
        return LongPPLDocument(title, None, ppl, 0, len(enc["input_ids"]))
    return LongPPLDocument(title, math.exp(losses[positions].mean().item()), ppl, len(positions), len(enc["input_ids"]))


def evaluator_spans(
    evaluator: Any,
    tokenizer: Any,
    text: str,
    trunc_len: int = TRUNC_LEN,
    internal: int = INTERNAL,
    alpha: float = ALPHA,
    beta: float = BETA,
) -> list[tuple[int, int]]:
    """The key spans of ``text`` by ``evaluator`` (its tokenizer's special tokens added, as the authors')."""
    enc = tokenizer(text, return_offsets_mapping=True)
    keys = find_key_tokens(evaluator, enc["input_ids"], trunc_len, internal, alpha, beta)
    return key_spans([tuple(o) for o in enc["offset_mapping"]], keys)


def combine(docs: list[LongPPLDocument]) -> LongPPLTotals:
    """The authors' totals: per-document LongPPL weighted by key tokens, PPL by tokens."""
    keyed = [d for d in docs if d.longppl is not None]
    n_key = sum(d.key_tokens for d in keyed)
    n_tok = sum(d.tokens for d in docs)
    return LongPPLTotals(
        longppl=sum(d.longppl * d.key_tokens for d in keyed) / n_key if n_key else None,
        ppl=sum(d.ppl * d.tokens for d in docs) / n_tok if n_tok else None,
        key_tokens=n_key,
        tokens=n_tok,
        documents=[LongPPLDocJSON(**asdict(d)) for d in docs],
    )


def text_window(tokenizer: Any, text: str, length: int) -> str | None:
    """The start of ``text`` holding ``length`` tokens of ``tokenizer`` (None if it is shorter)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) < length:
        return None
    return text[: enc["offset_mapping"][length - 1][1]]


__all__ = [
    "ALPHA",
    "BETA",
    "INTERNAL",
    "TRUNC_LEN",
    "LongPPLDocument",
    "combine",
    "evaluator_spans",
    "find_key_tokens",
    "key_spans",
    "loss_positions",
    "score_text",
    "text_window",
    "token_losses",
]
