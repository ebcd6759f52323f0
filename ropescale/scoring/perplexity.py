"""Sliding-window perplexity of a causal LM on pre-tokenized text.

Three window layouts are used in the long-context literature; all are expressed as
:class:`Window` objects ``(begin, end, score_from)`` over a document's token indices: the window
feeds tokens ``[begin, end)`` to the model and scores tokens ``[score_from, end)``.

* ``"yarn"`` (Press et al.; PI arXiv 2306.15595, YaRN arXiv 2309.00071, HF "perplexity of
  fixed-length models"): windows of ``window`` tokens start every ``stride`` tokens (default 256) and
  each scores only the tokens no earlier window scored, so every token is scored once with at least
  ``window - stride`` tokens of context (except the first window's).
* ``"longlora"`` (LongLoRA's ``eval.py``): windows start every ``stride`` tokens and every token of
  every window is scored, so tokens are scored several times, some with little context.
* ``"nonoverlap"`` (lm-eval rolling loglikelihood): ``stride = window``; every token scored once.

Conventions (docs/evaluation.md):

* **Every window holds exactly ``window`` real tokens.** The last window is right-aligned to end at
  the document's last token (it may overlap its predecessor more than ``stride``; in "yarn" and
  "nonoverlap" mode it scores only the tokens not scored yet, as lm-eval's rolling windows do). HF's
  recipe instead lets the last window start at a multiple of the stride and be shorter; the two agree
  whenever ``(n_tokens - window) % stride == 0``, e.g. YaRN's protocol (documents truncated to the
  evaluation length: one window).
* **BOS is extra.** With ``bos_token_id`` set, the BOS is prepended to *every* window, so the model
  sees ``window + 1`` positions; the BOS is never scored, but the window's first real token is,
  conditioned on the BOS alone. YaRN's and PI's code count the BOS inside ``max_length`` ("leave
  room for <BOS>"): to reproduce their numbers at evaluation length L, pass ``window = L - 1``.
* **Without BOS** a window's first token has nothing to condition on and is not scored: the first
  token of a document is never scored, and in "longlora"/"nonoverlap" mode each window scores one
  token fewer. :func:`sliding_windows` with ``bos=False`` describes exactly that.

Memory: the full ``[T, vocab]`` logits are never materialised. The decoder produces the final hidden
states ``[1, T, H]``; only scored positions go through ``lm_head``, ``chunk_size`` positions at a time,
and the cross entropy is computed in fp32 (:func:`chunked_nll`).
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, TypedDict, cast

import torch
from tqdm.auto import tqdm

from .nll import IGNORE_INDEX, final_hidden_states, model_device, summed_nll

MODES = ("yarn", "longlora", "nonoverlap")
DEFAULT_STRIDE = 256


class Window(NamedTuple):
    """One evaluation window over a document's tokens.

    Attributes:
        begin: index of the window's first token (fed to the model).
        end: one past the window's last token.
        score_from: first token that this window scores; tokens ``[score_from, end)`` are scored.
    """

    begin: int
    end: int
    score_from: int

    @property
    def n_scored(self) -> int:
        """Number of tokens this window scores."""
        return self.end - self.score_from


def resolve_stride(window: int, stride: int | None, mode: str) -> int:
    """Return the stride a mode uses, validating ``window``/``stride``/``mode``.

    Args:
        window: number of real tokens per window.
        stride: requested stride, or None for the mode's default (256 capped at ``window`` for
            "yarn"/"longlora"; ``window`` for "nonoverlap").
        mode: one of ``MODES``.

    Returns:
        The stride to use.

    Raises:
        ValueError: unknown mode, ``window <= 0``, ``stride <= 0``, ``stride > window``, or a
            "nonoverlap" stride different from ``window``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown perplexity mode {mode!r}; expected one of {', '.join(MODES)}")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if stride is None:
        return window if mode == "nonoverlap" else min(DEFAULT_STRIDE, window)
    if isinstance(stride, bool) or not isinstance(stride, int) or stride <= 0:
        raise ValueError(f"stride must be a positive integer, got {stride!r}")
    if stride > window:
        raise ValueError(f"stride {stride} is larger than window {window}; tokens would be skipped")
    if mode == "nonoverlap" and stride != window:
        raise ValueError(f"mode 'nonoverlap' uses stride = window ({window}), got stride {stride}")
    return stride


def sliding_windows(
    n_tokens: int, window: int, stride: int | None = None, mode: str = "yarn", *, bos: bool = True
) -> list[Window]:
    """Lay out the evaluation windows over one document.

    Every window holds exactly ``window`` tokens; windows start at ``0, stride, 2·stride, ...`` as
    long as they fit, and a last window ``[n_tokens - window, n_tokens)`` covers any remaining tail.

    Args:
        n_tokens: number of tokens in the document.
        window: real tokens per window (a BOS, if any, is extra).
        stride: distance between window starts; None for the mode's default (see
            :func:`resolve_stride`).
        mode: "yarn" (score only tokens not scored before), "longlora" (score every token of every
            window) or "nonoverlap" (stride = window, every token scored once).
        bos: whether a BOS will be prepended to each window. Without it a window's first token cannot
            be scored, so ``score_from`` is at least ``begin + 1``.

    Returns:
        The windows, in order. In "yarn" and "nonoverlap" mode the scored ranges partition
        ``[0, n_tokens)`` (``[1, n_tokens)`` without BOS, provided ``stride < window`` for "yarn").

    Raises:
        ValueError: ``window > n_tokens`` or an invalid window/stride/mode.
    """
    stride = resolve_stride(window, stride, mode)
    if n_tokens < window:
        raise ValueError(f"window {window} is larger than the text, which has {n_tokens} tokens")
    begins = list(range(0, n_tokens - window + 1, stride))
    if begins[-1] + window < n_tokens:
        begins.append(n_tokens - window)
    windows: list[Window] = []
    scored_until = 0
    for begin in begins:
        end = begin + window
        score_from = begin if mode == "longlora" else max(begin, scored_until)
        if not bos:
            score_from = max(score_from, begin + 1)
        windows.append(Window(begin, end, score_from))
        scored_until = end
    return windows


def chunked_nll(model: Any, input_ids: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024) -> tuple[float, int]:
    """Summed next-token NLL of a causal LM without materialising the full logits.

    Labels follow transformers' convention: ``labels`` has the shape of ``input_ids``, position
    ``t`` predicts ``labels[:, t + 1]``, and ``-100`` marks tokens that are not scored. So the result
    equals ``model(input_ids, labels=labels).loss * n_scored`` (up to float rounding), but peak memory
    is ``chunk_size × vocab`` logits instead of ``T × vocab``.

    Args:
        model: a ``*ForCausalLM`` with ``get_decoder()`` (or ``.model``) and ``lm_head``.
        input_ids: token ids. # [B, T]
        labels: target ids or -100. # [B, T]
        chunk_size: scored positions pushed through ``lm_head`` at once.

    Returns:
        ``(total_nll, n_scored)``: the summed NLL in nats (accumulated in fp32 per chunk, then in
        double precision) and the number of scored tokens.
    """
    if input_ids.shape != labels.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} differs from input_ids {tuple(input_ids.shape)}")
    hidden = final_hidden_states(model, input_ids)  # [B, T, H]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    total, n = summed_nll(hidden, model.lm_head, labels, chunk_size, softcap)
    return total.item(), n


class _PerplexityFields(TypedDict):
    mode: str
    window: int
    stride: int
    bos_token_id: int | None
    n_documents: int
    tokens_scored: int
    total_nll: float
    ppl: float
    mean_window_ppl: float
    window_nll: list[float]
    window_tokens: list[int]
    window_document: list[int]
    elapsed_s: float


class PerplexityJSON(_PerplexityFields):
    """:meth:`PerplexityResult.to_dict`: its fields in order, then ``nll_per_token`` and
    ``tokens_per_second`` (None when no time was measured)."""

    nll_per_token: float
    tokens_per_second: float | None


@dataclass
class PerplexityResult:
    """Outcome of :func:`evaluate_perplexity`.

    Attributes:
        mode, window, stride: the window layout (``window`` counts real tokens, BOS excluded).
        bos_token_id: the BOS prepended to each window, or None.
        n_documents: number of documents evaluated.
        tokens_scored: total scored tokens (a token scored by several windows counts each time).
        total_nll: summed NLL in nats.
        ppl: token-weighted perplexity, ``exp(total_nll / tokens_scored)``.
        mean_window_ppl: ``exp(mean over windows of the window's mean NLL)``; what YaRN's and PI's
            scripts report (equal to ``ppl`` when all windows score the same number of tokens).
        window_nll: per-window summed NLL.
        window_tokens: per-window scored token count.
        window_document: index of each window's document.
        elapsed_s: wall-clock seconds spent in the model.
    """

    mode: str
    window: int
    stride: int
    bos_token_id: int | None
    n_documents: int
    tokens_scored: int
    total_nll: float
    ppl: float
    mean_window_ppl: float
    window_nll: list[float] = field(default_factory=list)
    window_tokens: list[int] = field(default_factory=list)
    window_document: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def nll_per_token(self) -> float:
        """Mean NLL per scored token (nats)."""
        return self.total_nll / self.tokens_scored

    @property
    def tokens_per_second(self) -> float:
        """Scored tokens per second of model time."""
        return self.tokens_scored / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    def to_dict(self) -> PerplexityJSON:
        """Return a JSON-serialisable dict: all fields plus ``nll_per_token`` and
        ``tokens_per_second`` (None when no time was measured)."""
        d = cast(PerplexityJSON, asdict(self))  # every field, in order
        d["nll_per_token"] = self.nll_per_token
        d["tokens_per_second"] = self.tokens_per_second if self.elapsed_s > 0 else None
        return d


def _as_documents(token_ids: Any) -> list[list[int]]:
    """Normalise one document or several into a list of int lists."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dim() == 1:
            return [token_ids.tolist()]
        if token_ids.dim() == 2:
            return [row.tolist() for row in token_ids]
        raise ValueError(f"token_ids tensor must be 1-D or 2-D, got shape {tuple(token_ids.shape)}")
    if not isinstance(token_ids, Sequence) or isinstance(token_ids, (str, bytes)) or len(token_ids) == 0:
        raise ValueError("token_ids must be a non-empty list of token ids, a list of documents or a tensor")
    first = token_ids[0]
    if isinstance(first, numbers.Integral) or (isinstance(first, torch.Tensor) and first.dim() == 0):
        return [[int(t) for t in token_ids]]
    return [d.tolist() if isinstance(d, torch.Tensor) else [int(t) for t in d] for d in token_ids]


@torch.inference_mode()
def evaluate_perplexity(
    model: Any,
    token_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]],
    window: int,
    stride: int | None = None,
    mode: str = "yarn",
    bos_token_id: int | None = None,
    max_tokens: int | None = None,
    chunk_size: int = 1024,
    progress: bool = True,
) -> PerplexityResult:
    """Sliding-window perplexity of ``model`` on one or several pre-tokenized documents.

    Windows never cross document boundaries; NLLs and counts are summed over all documents. See the
    module docstring for the window layouts and the BOS convention. The model should be in eval mode;
    its dtype is the caller's choice, the loss is computed in fp32.

    Args:
        model: a ``*ForCausalLM`` (Llama/Mistral family).
        token_ids: one document (1-D tensor or list of ints, without BOS) or several (2-D tensor,
            list of lists or list of 1-D tensors).
        window: real tokens per window (the evaluation length; a BOS is extra).
        stride: distance between window starts; None for the mode's default (256 for
            "yarn"/"longlora", capped at ``window``; ``window`` for "nonoverlap").
        mode: "yarn", "longlora" or "nonoverlap".
        bos_token_id: BOS id to prepend to every window, or None for no BOS.
        max_tokens: if set, each document is truncated to its first ``max_tokens`` tokens (YaRN
            truncates each document to the evaluation length).
        chunk_size: scored positions per ``lm_head`` call (see :func:`chunked_nll`).
        progress: show a tqdm bar over windows.

    Returns:
        A :class:`PerplexityResult`.

    Raises:
        ValueError: a document shorter than ``window``, a bad stride or an unknown mode.
    """
    stride = resolve_stride(window, stride, mode)
    if bos_token_id is None and window < 2:
        raise ValueError("window must be at least 2 without a BOS: a window's first token is not scored")
    docs = _as_documents(token_ids)
    if max_tokens is not None:
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        docs = [d[:max_tokens] for d in docs]
    plan: list[tuple[int, Window]] = []
    for i, doc in enumerate(docs):
        if len(doc) < window:
            where = "the text" if len(docs) == 1 else f"document {i}"
            raise ValueError(f"window {window} is larger than {where}, which has {len(doc)} tokens")
        plan += [(i, w) for w in sliding_windows(len(doc), window, stride, mode, bos=bos_token_id is not None)]

    device = model_device(model)
    tensors = [torch.tensor(d, dtype=torch.long) for d in docs]
    prefix = [] if bos_token_id is None else [bos_token_id]
    window_nll: list[float] = []
    window_tokens: list[int] = []
    start = time.perf_counter()
    for doc_index, w in tqdm(plan, desc=f"ppl {mode} w={window}", disable=not progress, unit="win"):
        ids = torch.cat([torch.tensor(prefix, dtype=torch.long), tensors[doc_index][w.begin : w.end]])  # [T]
        labels = ids.clone()
        labels[: len(prefix) + w.score_from - w.begin] = IGNORE_INDEX
        nll, n = chunked_nll(model, ids[None].to(device), labels[None], chunk_size)
        window_nll.append(nll)
        window_tokens.append(n)
    elapsed = time.perf_counter() - start

    tokens = sum(window_tokens)
    total = math.fsum(window_nll)
    mean_nll = math.fsum(nll / n for nll, n in zip(window_nll, window_tokens)) / len(window_nll)
    return PerplexityResult(
        mode=mode,
        window=window,
        stride=stride,
        bos_token_id=bos_token_id,
        n_documents=len(docs),
        tokens_scored=tokens,
        total_nll=total,
        ppl=math.exp(total / tokens),
        mean_window_ppl=math.exp(mean_nll),
        window_nll=window_nll,
        window_tokens=window_tokens,
        window_document=[i for i, _ in plan],
        elapsed_s=elapsed,
    )
