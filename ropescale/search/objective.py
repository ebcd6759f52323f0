"""The calibration metric: perplexity of a patched model on fixed windows of text.

A window is ``eval_length`` real tokens after a BOS. Two layouts:

* ``contiguous``: positions 0..eval_length (the usual evaluation; needs eval_length > L, or the
  long factors are never used).
* ``spread``: the tokens are cut into ``chunks`` contiguous pieces placed evenly over positions
  [0, target_length) (PoSE-style position skipping, Zhu et al. arXiv 2309.10400). A window costs
  ``eval_length`` tokens of compute yet exercises relative distances up to the target length. It is
  a proxy: it sees fewer keys than a real window of the target length, so it under-rates attention
  temperature (fix the attention factor when searching on it), and its gains shrink at the real
  length — on SmolLM2-135M ×4 a 1.7% gain over YaRN on the proxy was 2.1% at a real 16k window and
  0.9% at 32k (``benchmarks/bench_search.py``). Report the result at the real length too.

Every token after the BOS is scored (next-token NLL, fp32 cross entropy, ``chunk_size`` positions
through the LM head at a time, as :func:`ropescale.scoring.perplexity.chunked_nll`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..scoring.nll import final_hidden_states, model_device, summed_nll
from .options import LAYOUTS
from .records import MethodParams, ScoreParts, ScoreRecord


@dataclass(frozen=True)
class Window:
    input_ids: list[int]  # BOS (if any) + tokens
    position_ids: list[int]


def spread_positions(n_tokens: int, span: int, chunks: int, offset: int = 0) -> list[int]:
    """Positions of ``n_tokens`` cut into ``chunks`` pieces spread evenly over [offset, offset+span)."""
    if chunks < 1 or n_tokens < chunks:
        raise ValueError(f"chunks must be between 1 and the number of tokens, got {chunks}")
    if span < n_tokens:
        raise ValueError(f"cannot spread {n_tokens} tokens over {span} positions")
    sizes = [n_tokens // chunks + (1 if i < n_tokens % chunks else 0) for i in range(chunks)]
    gap_total = span - n_tokens
    positions, start = [], offset
    for i, size in enumerate(sizes):
        positions += list(range(start, start + size))
        # the gaps are shared evenly between consecutive chunks; the last chunk ends at span-1
        start += size + (gap_total // (chunks - 1) + (1 if i < gap_total % (chunks - 1) else 0) if chunks > 1 else 0)
    return positions


def make_windows(
    tokens: Sequence[int],
    eval_length: int,
    n_windows: int,
    layout: str,
    target_length: int,
    chunks: int = 4,
    bos_token_id: int | None = None,
) -> list[Window]:
    """``n_windows`` consecutive windows of ``eval_length`` tokens from the start of ``tokens``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if eval_length < 2 or n_windows < 1:
        raise ValueError(f"eval length must be >= 2 and windows >= 1, got {eval_length} and {n_windows}")
    need = eval_length * n_windows
    if len(tokens) < need:
        raise ValueError(f"the text has {len(tokens)} tokens; {n_windows} window(s) of {eval_length} need {need}")
    prefix = [] if bos_token_id is None else [int(bos_token_id)]
    windows = []
    for w in range(n_windows):
        ids = prefix + [int(t) for t in tokens[w * eval_length : (w + 1) * eval_length]]
        if layout == "contiguous":
            pos = list(range(len(ids)))
        else:
            span = target_length - len(prefix)
            pos = list(range(len(prefix))) + spread_positions(eval_length, span, chunks, offset=len(prefix))
        windows.append(Window(ids, pos))
    return windows


@torch.inference_mode()
def window_nll(model: Any, window: Window, chunk_size: int = 1024) -> tuple[float, int]:
    """Summed next-token NLL (nats) of every token after the first, and how many were scored."""
    device = model_device(model)
    ids = torch.tensor([window.input_ids], device=device)  # [1, T]
    pos = torch.tensor([window.position_ids], device=device)  # [1, T]
    hidden = final_hidden_states(model, ids, position_ids=pos)  # [1, T, H]
    total, n = summed_nll(hidden, model.lm_head, ids, chunk_size)
    return total.item(), n


@dataclass
class Score:
    """A candidate's score; the search minimises ``ppl``, the exponential of the objective's mean NLL
    (the calibration perplexity, the answer-token perplexity of the needle prompts, or their mix)."""

    ppl: float
    nll: float  # summed over scored tokens
    tokens: int
    seconds: float
    objective: str = "perplexity"
    parts: ScoreParts | None = None  # per-objective details (needle: each prompt's answer NLL)

    def to_dict(self) -> ScoreRecord:
        out: ScoreRecord = {
            "ppl": self.ppl,
            "nll": self.nll,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "objective": self.objective,
        }
        if self.parts:
            out["parts"] = self.parts
        return out


class PerplexityObjective:
    """Patch the model in place with a candidate and score it on fixed windows (lower is better).

    Args:
        model: a loaded ``*ForCausalLM``; re-patched for every candidate (only its rotary module changes).
        windows: the calibration windows (:func:`make_windows`).
        method: the method name passed to ``ropescale.patch``.
    """

    def __init__(self, model: Any, windows: list[Window], method: str, chunk_size: int = 1024):
        self.model, self.windows, self.method, self.chunk_size = model, windows, method, chunk_size

    @property
    def tokens(self) -> int:
        return sum(len(w.input_ids) - 1 for w in self.windows)

    def __call__(self, method_params: MethodParams) -> Score:
        from ..patching.model import patch

        patch(self.model, self.method, replace=True, **method_params)
        return self.evaluate()

    def evaluate(self) -> Score:
        """Score the model as it is patched now."""
        return score_windows(self.model, self.windows, self.chunk_size)


def score_windows(model: Any, windows: list[Window], chunk_size: int = 1024) -> Score:
    """Token-weighted perplexity of ``model`` on ``windows``."""
    start = time.perf_counter()
    nll, n = 0.0, 0
    for window in windows:
        a, b = window_nll(model, window, chunk_size)
        nll, n = nll + a, n + b
    return Score(math.exp(nll / n) if math.isfinite(nll) else math.inf, nll, n, time.perf_counter() - start)


Objective = Callable[[MethodParams], Score]
