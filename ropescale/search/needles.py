"""The retrieval-aware objectives: answer-token NLL of needle prompts, alone or mixed with perplexity.

Perplexity on long text is dominated by local prediction, so a candidate that keeps it low can
still lose what lies far back. LongRoPE2 (arXiv 2502.20082) instead scores only the answer tokens
of prompts whose answer sits far back in the context. Here a prompt is exactly ``length`` tokens
(the target length)::

    [BOS] task | haystack[:k] | needle | haystack[k:n] | question | answer

* the haystack is real text: prompt ``i`` takes ``n`` tokens from offset ``i · length`` of the text
  the search calibrates on (cut at token granularity, as the windows are);
* the needle carries a random 7-digit key, ``k = floor(depth · n + 0.5)`` haystack tokens before it;
* the answer is the key, teacher-forced after the question; only its tokens are scored (leading
  whitespace-only tokens, e.g. a lone " ", are part of the prompt, not of the answer).

One forward pass per prompt, at positions 0..length−1. The keys come from ``seed`` alone, so every
candidate sees the same prompts (and a resumed search too). Prompt ``i`` puts its needle at
``depths[i % len(depths)]``; by default one prompt per calibration window at depths spread evenly
over (0, 1) (one prompt: depth 0.5), so with the default contiguous windows of the target length a
candidate costs what the perplexity objective costs.

``mixed`` is a weighted sum of the two objectives' mean NLLs (nats per scored token):
``ppl = exp((1 − w) · NLL_text + w · NLL_answer)``, default w = 0.5 — the geometric mean of the
calibration perplexity and the answer perplexity. Per-token means put both on the same scale: a
lost needle costs several nats per key token, a worse text fit a fraction of a nat over many
tokens, and either shows. A mixed candidate costs both objectives.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.documents import tokens_after_sentence
from ..scoring.nll import IGNORE_INDEX, final_hidden_states, model_device, summed_nll
from .objective import PerplexityObjective, Score, Window
from .options import OBJECTIVES
from .records import MethodParams, NeedleRecord, ScoreParts

TASK = (
    "There is an important piece of information hidden inside a long text. Find it and memorize it. "
    "I will quiz you about it at the end."
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
KEY_DIGITS = 7


def template_fingerprint() -> str:
    """Identifies the prompt wording (part of a search's settings: another wording is another objective)."""
    return hashlib.sha256("\n".join((TASK, NEEDLE, QUESTION, str(KEY_DIGITS))).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class NeedleSettings:
    """How many needle prompts, at which depths, how long, with which keys.

    Attributes:
        prompts: prompts per candidate (one forward pass each).
        depths: needle depths in [0, 1]; prompt ``i`` uses ``depths[i % len(depths)]``.
        length: tokens per prompt, BOS and answer included (the target length).
        seed: the keys' random seed.
    """

    prompts: int
    depths: tuple[float, ...]
    length: int
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in (("needle prompts", self.prompts), ("needle length", self.length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.depths:
            raise ValueError("needle depths must not be empty")
        for d in self.depths:
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1:
                raise ValueError(f"needle depths must be numbers in [0, 1], got {d!r}")

    def depth(self, i: int) -> float:
        return float(self.depths[i % len(self.depths)])

    def keys(self) -> list[int]:
        """The prompts' keys: ``KEY_DIGITS``-digit numbers drawn from ``seed``."""
        rng = random.Random(self.seed)
        return [rng.randrange(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS) for _ in range(self.prompts)]

    @property
    def tokens_needed(self) -> int:
        """Text tokens the haystacks draw from (prompt ``i`` starts at ``i · length``)."""
        return self.prompts * self.length

    def as_dict(self) -> NeedleRecord:
        return {
            "prompts": self.prompts,
            "depths": [float(d) for d in self.depths],
            "length": self.length,
            "seed": self.seed,
            "template": template_fingerprint(),
        }


def default_depths(n: int) -> tuple[float, ...]:
    """``n`` depths spread evenly over (0, 1): (i + 0.5) / n."""
    return tuple(round((i + 0.5) / n, 6) for i in range(n))


def resolve_needles(
    objective: str, prompts: int | None, depths: Sequence[float], windows: int, length: int, seed: int
) -> NeedleSettings | None:
    """The needle settings of a search (None for the perplexity objective).

    Args:
        objective: ``perplexity``, ``needle`` or ``mixed``.
        prompts: prompts per candidate; None: ``len(depths)`` if depths are given, else ``windows``.
        depths: needle depths; empty: spread evenly over the prompts.
        windows: the search's calibration windows per candidate.
        length: the target length.
        seed: the keys' seed.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "perplexity":
        return None
    n = prompts if prompts is not None else (len(depths) if depths else windows)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"needle prompts must be an integer >= 1, got {n!r}")
    return NeedleSettings(n, tuple(depths) or default_depths(n), length, seed)


def needle_settings(options: Any) -> NeedleSettings | None:
    """The needle settings of a :class:`~ropescale.search.pipeline.SearchOptions` (None for perplexity);
    prompts are the target length."""
    return resolve_needles(
        options.objective,
        options.needles,
        options.needle_depths,
        options.windows,
        options.target_length,
        options.needle_seed,
    )


def tokens_needed(options: Any, eval_length: int) -> int:
    """Text tokens a search's objective reads: its windows and/or its needle prompts' haystacks."""
    needles = needle_settings(options)
    windows = eval_length * options.windows if options.objective != "needle" else 0
    return max(windows, needles.tokens_needed if needles else 0)


@dataclass(frozen=True)
class NeedlePrompt:
    """A tokenized needle prompt and where its parts lie (offsets into ``input_ids``)."""

    input_ids: list[int]
    key: int
    depth: float
    haystack_start: int
    needle_start: int
    needle_end: int
    answer_start: int  # the first scored token; the answer runs to the end
    n_haystack: int


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def question_and_answer(tokenizer: Any, key: int) -> tuple[list[int], list[int]]:
    """(question tokens, answer tokens): the key as it follows the question, whitespace-only tokens
    moved to the question so that only the key's own tokens are scored."""
    question = tokens_after_sentence(tokenizer, QUESTION)
    both = tokens_after_sentence(tokenizer, f"{QUESTION} {key}")
    answer = both[len(question) :] if both[: len(question)] == question else _encode(tokenizer, f" {key}")
    while len(answer) > 1 and not tokenizer.decode([answer[0]]).strip():
        question, answer = question + answer[:1], answer[1:]
    return question, answer


def build_needle_prompts(
    tokenizer: Any, haystack: Sequence[int], settings: NeedleSettings, bos_token_id: int | None = None
) -> list[NeedlePrompt]:
    """The needle prompts of ``settings`` with haystacks from ``haystack`` (see the module docstring)."""
    if len(haystack) < settings.tokens_needed:
        raise ValueError(
            f"the text has {len(haystack)} tokens; {settings.prompts} needle prompt(s) of {settings.length} "
            f"need {settings.tokens_needed}"
        )
    prefix = [] if bos_token_id is None else [int(bos_token_id)]
    task = _encode(tokenizer, TASK)
    prompts = []
    for i, key in enumerate(settings.keys()):
        needle = tokens_after_sentence(tokenizer, NEEDLE.format(key=key))
        question, answer = question_and_answer(tokenizer, key)
        n = settings.length - len(prefix) - len(task) - len(needle) - len(question) - len(answer)
        if n < 1:
            raise ValueError(
                f"needle length {settings.length} is too short: BOS, task, needle, question and answer take "
                f"{settings.length - n} tokens"
            )
        depth = settings.depth(i)
        k = math.floor(depth * n + 0.5)
        hay = [int(t) for t in haystack[i * settings.length : i * settings.length + n]]
        ids = prefix + task + hay[:k] + needle + hay[k:] + question + answer
        start = len(prefix) + len(task)
        prompts.append(
            NeedlePrompt(ids, key, depth, start, start + k, start + k + len(needle), len(ids) - len(answer), n)
        )
    return prompts


@torch.inference_mode()
def answer_nll(model: Any, prompt: NeedlePrompt, chunk_size: int = 1024) -> tuple[float, int]:
    """Summed NLL (nats) of the answer tokens, teacher-forced in one forward pass, and their count."""
    device = model_device(model)
    ids = torch.tensor([prompt.input_ids], device=device)  # [1, T]
    labels = torch.full_like(ids, IGNORE_INDEX)  # [1, T]
    labels[:, prompt.answer_start :] = ids[:, prompt.answer_start :]
    pos = torch.arange(ids.shape[1], device=device)[None]  # [1, T]
    hidden = final_hidden_states(model, ids, position_ids=pos)  # [1, T, H]
    total, n = summed_nll(hidden, model.lm_head, labels, chunk_size)
    return total.item(), n


class NeedleObjective:
    """Patch the model with a candidate and score the answer tokens of fixed needle prompts (lower is better)."""

    name = "needle"

    def __init__(self, model: Any, prompts: list[NeedlePrompt], method: str, chunk_size: int = 1024):
        self.model, self.prompts, self.method, self.chunk_size = model, prompts, method, chunk_size

    def __call__(self, method_params: MethodParams) -> Score:
        from ..patching.model import patch

        patch(self.model, self.method, replace=True, **method_params)
        return self.evaluate()

    def evaluate(self) -> Score:
        """Score the model as it is patched now: exp(mean answer NLL), with each prompt's mean NLL."""
        start = time.perf_counter()
        nll, n, per_prompt = 0.0, 0, []
        for prompt in self.prompts:
            a, b = answer_nll(self.model, prompt, self.chunk_size)
            nll, n = nll + a, n + b
            per_prompt.append(round(a / b, 4) if math.isfinite(a) else math.inf)
        ppl = math.exp(nll / n) if math.isfinite(nll) else math.inf
        parts: ScoreParts = {"answer_nll": per_prompt, "depths": [p.depth for p in self.prompts]}
        return Score(ppl, nll, n, time.perf_counter() - start, objective="needle", parts=parts)


class MixedObjective:
    """``exp((1 − w)·mean text NLL + w·mean answer NLL)``: perplexity and needle on one patch."""

    name = "mixed"

    def __init__(self, perplexity: PerplexityObjective, needle: NeedleObjective, weight: float = 0.5):
        if not 0 <= weight <= 1:
            raise ValueError(f"needle weight must be in [0, 1], got {weight!r}")
        self.perplexity, self.needle, self.weight = perplexity, needle, weight
        self.model, self.method = perplexity.model, perplexity.method

    def __call__(self, method_params: MethodParams) -> Score:
        from ..patching.model import patch

        patch(self.model, self.method, replace=True, **method_params)
        return self.evaluate()

    def evaluate(self) -> Score:
        text, answer = self.perplexity.evaluate(), self.needle.evaluate()
        if not (math.isfinite(text.nll) and math.isfinite(answer.nll)):
            value = math.inf
        else:
            value = math.exp((1 - self.weight) * text.nll / text.tokens + self.weight * answer.nll / answer.tokens)
        parts: ScoreParts = {
            "perplexity": text.ppl,
            "needle": answer.ppl,
            "weight": self.weight,
            **(answer.parts or {}),
        }
        seconds = text.seconds + answer.seconds
        return Score(value, text.nll + answer.nll, text.tokens + answer.tokens, seconds, objective="mixed", parts=parts)


def build_objective(
    objective: str,
    model: Any,
    method: str,
    tokens: Sequence[int],
    windows: list[Window] | None = None,
    needles: NeedleSettings | None = None,
    tokenizer: Any = None,
    bos_token_id: int | None = None,
    weight: float = 0.5,
) -> PerplexityObjective | NeedleObjective | MixedObjective:
    """The search's objective on ``tokens`` (the calibration or the held-out text).

    Args:
        objective: ``perplexity``, ``needle`` or ``mixed``.
        model: the model, re-patched for every candidate.
        method: the method name passed to ``ropescale.patch``.
        tokens: the text (the needle prompts' haystacks).
        windows: the perplexity windows (:func:`ropescale.search.objective.make_windows`); for
            ``perplexity`` and ``mixed``.
        needles: the needle settings; for ``needle`` and ``mixed``.
        tokenizer: encodes the task, needle and question; for ``needle`` and ``mixed``.
        bos_token_id: BOS prepended to every prompt.
        weight: the needle's weight in ``mixed``.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    perplexity = PerplexityObjective(model, windows, method) if objective != "needle" else None
    if objective == "perplexity":
        return perplexity
    if needles is None or tokenizer is None:
        raise ValueError(f"the {objective} objective needs needle settings and the model's tokenizer")
    needle = NeedleObjective(model, build_needle_prompts(tokenizer, tokens, needles, bos_token_id), method)
    return needle if perplexity is None else MixedObjective(perplexity, needle, weight)


__all__ = [
    "OBJECTIVES",
    "MixedObjective",
    "NeedleObjective",
    "NeedlePrompt",
    "NeedleSettings",
    "answer_nll",
    "build_needle_prompts",
    "build_objective",
    "needle_settings",
    "tokens_needed",
    "resolve_needles",
]
