"""Passkey retrieval (Mohtashami & Jaggi, arXiv 2305.16300), as used by PI, YaRN and LongLoRA.

The prompt is a task description, a repeated filler text with one "needle" sentence carrying a
random 5-digit key, and a question; the model decodes greedily and is right when the first integer
it writes equals the key (the prompt wording is the one PI, YaRN and LongLoRA report passkey
accuracy with, so numbers can be set beside theirs).

Prompt layout, in tokens (each part tokenized once, then concatenated as token ids)::

    [BOS] task | filler[:k] | needle | filler[k:n] | question

* The prompt has **exactly** ``length`` tokens, BOS included when one is added. The filler is one
  long tokenization of the repeated filler text, cut at token granularity: ``n`` filler tokens make
  up whatever the fixed parts (BOS, task, needle, question) leave, so the length is exact whatever
  the tokenizer merges. A cut may fall inside a word; the needle and question are never cut.
* **Depth** is the fraction of the ``n`` filler tokens placed before the needle:
  ``k = floor(depth · n + 0.5)``. Depth 0 puts the needle right after the task description, depth 1
  right before the question. The text after the needle continues the filler stream where it was cut.
* **Jitter** (off by default: the fixed depth grid of every shipped cell). At fixed depths every
  trial of a (length, depth) group sits at the same token offset, so its trials differ only in the
  key's digits and mostly succeed or fail together (88% of the groups of 6 in our 30-prompt cells
  were all right or all wrong: 30 prompts measured about 5 positions). The passkey scripts of YaRN
  and LongLoRA (after landmark attention's) draw each trial's position at random instead. With
  ``jitter = h`` each trial draws its own depth uniformly from ``[depth - h, depth + h]`` cut to
  [0, 1] (its own ``random.Random``, like the key), so a group spreads over a band of positions;
  ``h = 0.125`` with depths 0, 0.25, ..., 1 covers [0, 1]. Records keep the nominal depth;
  ``needle_start`` says where each needle went.
* The needle, question and filler are tokenized as they appear after a sentence (``". " + part``,
  keeping the tokens after the ``"."``), so byte-level BPE tokenizers get their leading-space tokens
  (" The") and SentencePiece ones their "▁" word starts.
"""

from __future__ import annotations

import math
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ropescale.data.documents import tokens_after_sentence
from ropescale.evals.tasks.generation import (
    GridJSON,
    GridResult,
    Journaled,
    PromptJournal,
    bos_prefix,
    check_depth,
    check_grid,
    check_positive_int,
    encode,
    greedy_generate,
    grid_jobs,
    plot_accuracy_heatmap,
)
from ropescale.evals.tasks.generation import tokenizer_adds_bos as tokenizer_adds_bos  # public here since the start

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
PASS_THRESHOLD = 0.8  # YaRN: "passkey context" = largest length with >= 80% accuracy
_FIRST_INTEGER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class PasskeyPrompt:
    """A tokenized passkey prompt and where its parts lie.

    Attributes:
        input_ids: the prompt's token ids (BOS included when added); ``len(input_ids)`` is the
            requested length.
        key: the pass key hidden in the needle.
        depth: the requested depth in [0, 1].
        filler_start: offset of the first filler token (after BOS and task).
        needle_start: offset of the needle's first token.
        needle_end: one past the needle's last token.
        question_start: offset of the question's first token (end of the filler region).
        n_filler: number of filler tokens, needle excluded.
    """

    input_ids: list[int]
    key: int
    depth: float
    filler_start: int
    needle_start: int
    needle_end: int
    question_start: int
    n_filler: int

    @property
    def length(self) -> int:
        """Number of tokens in the prompt."""
        return len(self.input_ids)

    @property
    def actual_depth(self) -> float:
        """Fraction of filler tokens before the needle, after rounding to whole tokens."""
        return (self.needle_start - self.filler_start) / self.n_filler if self.n_filler else self.depth


def too_short(length: int, fixed: int) -> str:
    """The line for a passkey length below its prompt's fixed parts (the run and the dry run say the same)."""
    return (
        f"length {length} is too short for the passkey prompt: BOS, task, needle and question take {fixed} "
        f"tokens with this tokenizer; use lengths of at least {fixed}"
    )


def check_prompt_lengths(
    tokenizer: Any,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    seed: int,
    add_bos: bool | None = None,
) -> None:
    """Refuse, before any weights load, a length that cannot hold its prompts' fixed parts (BOS, task,
    needle with each trial's own key, question): the check :meth:`_PromptBuilder.build` makes when
    the model is already loaded, run on the tokenizer alone, by the suite and by ``--dry-run``.

    Raises:
        ValueError: :func:`too_short` for the first length that cannot.
    """
    builder = _PromptBuilder(tokenizer, add_bos)
    base = len(builder.prefix) + len(builder.task) + len(builder.question)
    for length, depth, trial in grid_jobs(sorted(set(lengths)), list(depths), trials):
        needle = tokens_after_sentence(tokenizer, NEEDLE.format(key=passkey_key(seed, length, depth, trial)))
        if length < base + len(needle):
            raise ValueError(too_short(length, base + len(needle)))


class _PromptBuilder:
    """Tokenizes the fixed parts once and the filler lazily, then assembles prompts."""

    def __init__(self, tokenizer: Any, add_bos: bool | None) -> None:
        self.tokenizer = tokenizer
        self.prefix = bos_prefix(tokenizer, add_bos)
        self.task = encode(tokenizer, TASK)
        self.question = tokens_after_sentence(tokenizer, QUESTION)
        self._filler: list[int] = []
        self._filler_reps = 0

    def filler(self, n: int) -> list[int]:
        """The first ``n`` tokens of the tokenized repeated filler text."""
        if len(self._filler) < n:
            reps = max(64, self._filler_reps)
            while True:
                ids = tokens_after_sentence(self.tokenizer, " ".join([FILLER] * reps))
                if len(ids) >= n:
                    break
                reps *= 2
            self._filler, self._filler_reps = ids, reps
        return self._filler[:n]

    def build(self, length: int, depth: float, key: int) -> PasskeyPrompt:
        check_positive_int("length", length)
        depth = check_depth(depth)
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise ValueError(f"key must be a non-negative integer, got {key!r}")
        needle = tokens_after_sentence(self.tokenizer, NEEDLE.format(key=key))
        fixed = len(self.prefix) + len(self.task) + len(needle) + len(self.question)
        if length < fixed:
            raise ValueError(too_short(length, fixed))
        n_filler = length - fixed
        n_before = math.floor(depth * n_filler + 0.5)
        filler = self.filler(n_filler)
        ids = self.prefix + self.task + filler[:n_before] + needle + filler[n_before:] + self.question
        filler_start = len(self.prefix) + len(self.task)
        needle_start = filler_start + n_before
        return PasskeyPrompt(
            input_ids=ids,
            key=key,
            depth=depth,
            filler_start=filler_start,
            needle_start=needle_start,
            needle_end=needle_start + len(needle),
            question_start=length - len(self.question),
            n_filler=n_filler,
        )


def build_passkey_prompt(
    tokenizer: Any, length: int, depth: float, key: int, add_bos: bool | None = None
) -> PasskeyPrompt:
    """Build the standard passkey prompt of exactly ``length`` tokens.

    Args:
        tokenizer: a transformers tokenizer (fast or slow) with ``encode``.
        length: total prompt length in tokens, BOS included when added.
        depth: fraction in [0, 1] of the filler tokens placed before the needle (see module doc).
        key: the pass key (a non-negative integer; :func:`run_passkey` uses 5 digits).
        add_bos: prepend the tokenizer's BOS; None follows the tokenizer (BOS iff it adds one
            itself, see :func:`tokenizer_adds_bos`).

    Returns:
        A :class:`PasskeyPrompt` with the ids and the needle's token offsets.

    Raises:
        ValueError: length too short for the fixed parts, depth outside [0, 1], negative key, or
            ``add_bos=True`` with a tokenizer without BOS.
    """
    return _PromptBuilder(tokenizer, add_bos).build(length, depth, key)


def score_passkey(generated_text: str, key: int) -> bool:
    """Whether the first integer in ``generated_text`` equals ``key``.

    Args:
        generated_text: the model's continuation (anything: spaces, punctuation, garbage).
        key: the expected pass key.

    Returns:
        True iff the text contains an ASCII digit run and the first such run, read as an integer,
        equals ``key`` (so " 12345." and "12345 is the key" pass, "1234 5" and "no idea" fail).
    """
    match = _FIRST_INTEGER.search(generated_text)
    return match is not None and int(match.group()) == key


@dataclass(frozen=True)
class PasskeyTrial:
    """One generation: where the needle was, what the key was, what the model wrote."""

    length: int
    depth: float
    trial: int
    key: int
    output: str
    correct: bool
    needle_start: int


class PasskeyJSON(GridJSON):
    """A passkey result's JSON (:meth:`PasskeyResult.to_dict`): the grid's fields and the passkey context."""

    passkey_context: int | None


@dataclass
class PasskeyResult(GridResult):
    """Outcome of :func:`run_passkey`.

    Attributes:
        lengths, depths: the grid, in the order given.
        trials: trials per (length, depth) cell.
        seed: seed of the keys.
        max_new_tokens: tokens generated per trial.
        records: every trial, in run order.
        elapsed_s: wall-clock seconds spent generating, the journaled prompts' included.
        resumed: what the prompts taken from a journal cost, or None.
        threshold: accuracy a length needs to count towards :attr:`passkey_context`.

    :attr:`passkey_context` is :attr:`effective_context` under the name the passkey papers use;
    the accuracy bookkeeping is :class:`~ropescale.evals.tasks.generation.GridResult`'s, shared with
    :class:`~ropescale.evals.tasks.needle.NeedleResult`.
    """

    lengths: list[int]
    depths: list[float]
    trials: int
    seed: int
    max_new_tokens: int
    records: list[PasskeyTrial] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: the prompts an interrupted run's journal held (:meth:`~ropescale.evals.tasks.generation.PromptJournal.
    #: journaled`): ``elapsed_s`` counts their seconds where the journal has them
    resumed: Journaled | None = None
    threshold: float = PASS_THRESHOLD

    @staticmethod
    def score_of(record: PasskeyTrial) -> float:
        return float(record.correct)

    @property
    def passkey_context(self) -> int | None:
        """Largest length whose accuracy over all depths is >= ``threshold`` (None if none is)."""
        return self.effective_context

    def to_dict(self) -> PasskeyJSON:
        """Return a JSON-serialisable dict (:meth:`GridResult.grid_dict`, plus ``passkey_context``)."""
        return {**self.grid_dict(), "passkey_context": self.passkey_context}


def passkey_key(seed: int, length: int, depth: float, trial: int) -> int:
    """The 5-digit key of one trial.

    Each trial has its own ``random.Random`` seeded from ``(seed, length, depth, trial)``, so a
    cell's keys do not depend on which other lengths or depths are in the run.

    Args:
        seed: run seed.
        length: prompt length.
        depth: needle depth.
        trial: trial index.

    Returns:
        An integer in [10000, 99999].
    """
    return random.Random(f"passkey:{seed}:{length}:{float(depth)!r}:{trial}").randint(10000, 99999)


def placed_depth(seed: int, length: int, depth: float, trial: int, jitter: float, task: str = "passkey") -> float:
    """The depth one trial's needle is placed at: ``depth`` itself without jitter, else a draw
    uniform in ``[depth - jitter, depth + jitter]`` cut to [0, 1], from a ``random.Random`` of its
    own seeded like :func:`passkey_key`'s (so keys are the same with and without jitter). ``task``
    names the stream (the needle task draws its own, ``"needle"``: :func:`~.needle.run_needle`).

    Raises:
        ValueError: ``jitter`` outside [0, 0.5].
    """
    jitter = check_jitter(jitter)
    if jitter == 0:
        return depth
    low, high = max(0.0, depth - jitter), min(1.0, depth + jitter)
    return random.Random(f"{task}-depth:{seed}:{length}:{float(depth)!r}:{trial}").uniform(low, high)


def check_jitter(jitter: Any) -> float:
    """``jitter`` as a float in [0, 0.5], or ValueError naming it."""
    ok = isinstance(jitter, (int, float)) and not isinstance(jitter, bool) and 0 <= jitter <= 0.5
    if not ok:
        raise ValueError(f"jitter must be a number in [0, 0.5] (half the width of a depth's band), got {jitter!r}")
    return float(jitter)


@torch.inference_mode()
def run_passkey(
    model: Any,
    tokenizer: Any,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    seed: int = 0,
    max_new_tokens: int = 10,
    progress: bool = True,
    add_bos: bool | None = None,
    batch_size: int = 1,
    journal: PromptJournal | None = None,
    jitter: float = 0.0,
) -> PasskeyResult:
    """Run passkey retrieval over a grid of prompt lengths and needle depths.

    Each (length, depth) cell runs ``trials`` prompts with keys from :func:`passkey_key`; the model
    decodes greedily with its KV cache (:func:`~ropescale.evals.tasks.generation.greedy_generate`), and a
    trial is correct when :func:`score_passkey` accepts the decoded new tokens.

    Args:
        model: a ``*ForCausalLM`` in eval mode.
        tokenizer: its tokenizer.
        lengths: prompt lengths in tokens (BOS included), distinct.
        depths: needle depths in [0, 1], distinct (see :func:`build_passkey_prompt`).
        trials: prompts per cell.
        seed: seed of the keys.
        max_new_tokens: tokens to generate per prompt.
        progress: show a tqdm bar over prompts.
        add_bos: as in :func:`build_passkey_prompt`.
        batch_size: prompts of one length generated together (they all have the same length, so
            no padding is needed); 1 reproduces single-prompt numerics exactly.
        journal: records each prompt's text as it finishes and skips the prompts it holds
            (:class:`~ropescale.evals.tasks.generation.PromptJournal`; the suite runner keeps one per cell).
        jitter: half-width of the band of depths a cell's trials spread over (module doc; 0: all
            at the depth itself, the fixed grid).

    Returns:
        A :class:`PasskeyResult` (per-cell accuracy, per-trial records, passkey context).

    Raises:
        ValueError: empty or duplicate lengths/depths, bad depth, non-positive trials,
            max_new_tokens or batch_size, jitter outside [0, 0.5], or a length too short for the prompt.
    """
    lengths, depths = check_grid(lengths, depths)
    jitter = check_jitter(jitter)
    check_positive_int("trials", trials)
    check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("batch_size", batch_size)

    jobs, prompts = _jobs(tokenizer, lengths, depths, trials, seed, add_bos, jitter)  # validates lengths early
    result = PasskeyResult(lengths, depths, trials, seed, max_new_tokens)
    start = time.perf_counter()
    result.resumed = journal.journaled([p.input_ids for p in prompts], max_new_tokens) if journal is not None else None
    # Prompts of one length have exactly that many tokens, so batches never need padding.
    texts = greedy_generate(
        model,
        tokenizer,
        [p.input_ids for p in prompts],
        max_new_tokens,
        batch_size,
        progress,
        desc="passkey",
        journal=journal,
    )
    _score(result, jobs, prompts, texts)
    result.elapsed_s = time.perf_counter() - start + ((result.resumed or {}).get("seconds") or 0.0)
    return result


def _jobs(
    tokenizer, lengths, depths, trials, seed, add_bos, jitter=0.0
) -> tuple[list[tuple[int, float, int]], list[PasskeyPrompt]]:
    """A grid's jobs (:func:`~ropescale.evals.tasks.generation.grid_jobs`, in decoding order) and prompts."""
    builder = _PromptBuilder(tokenizer, add_bos)
    jobs = grid_jobs(lengths, depths, trials)
    return jobs, [builder.build(n, placed_depth(seed, n, d, t, jitter), passkey_key(seed, n, d, t)) for n, d, t in jobs]


def _score(result: PasskeyResult, jobs, prompts, texts) -> None:
    """Append the scored trials that have a text, in (length, depth, trial) order."""
    for (n, d, t), p, text in zip(jobs, prompts, texts):
        if text is not None:
            result.records.append(PasskeyTrial(n, d, t, p.key, text, score_passkey(text, p.key), p.needle_start))
    result.sort_records()


def partial_passkey(
    tokenizer: Any,
    journal: PromptJournal,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    seed: int = 0,
    max_new_tokens: int = 10,
    add_bos: bool | None = None,
    jitter: float = 0.0,
) -> PasskeyResult | None:
    """What an unfinished :func:`run_passkey` (same arguments) has so far: the trials its journal
    holds, scored; the grid keeps the lengths that have any and the depths that have some at every
    one of those (the suite runner asks for one length: a cell). The journal is only read. None
    when it holds none.
    """
    lengths, depths = check_grid(lengths, depths)
    jobs, prompts = _jobs(tokenizer, lengths, depths, trials, seed, add_bos, check_jitter(jitter))
    texts = journal.peek([p.input_ids for p in prompts], max_new_tokens)
    done = {(n, d) for (n, d, _), text in zip(jobs, texts) if text is not None}
    if not done:
        return None
    kept = [n for n in lengths if any((n, d) in done for d in depths)]
    result = PasskeyResult(
        kept,
        [d for d in depths if all((n, d) in done for n in kept)],
        trials,
        seed,
        max_new_tokens,
    )
    if not result.depths:
        return None
    keep = set(result.depths)
    _score(result, jobs, prompts, [t if d in keep else None for (_, d, _), t in zip(jobs, texts)])
    return result


def plot_passkey_heatmap(
    result: GridResult,
    path: str | os.PathLike,
    title: str | None = None,
    context_label: str = "passkey context",
) -> Path:
    """Draw accuracy per (length, depth) as a heatmap and write it atomically
    (:func:`~ropescale.evals.tasks.generation.plot_accuracy_heatmap`).

    Args:
        result: a :class:`PasskeyResult`, or any :class:`~ropescale.evals.tasks.generation.GridResult`
            (a :class:`~ropescale.evals.tasks.needle.NeedleResult`).
        path: output file; the format follows its suffix (png if none).
        title: first title line (default "Passkey retrieval"); a second line gives trials per cell
            and the result's ``effective_context``.
        context_label: what the second line calls that context.

    Returns:
        The written path.
    """
    return plot_accuracy_heatmap(result, path, title or "Passkey retrieval", context_label)
