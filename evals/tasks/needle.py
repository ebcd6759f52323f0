"""RULER-style needle-in-a-haystack retrieval (Hsieh et al., arXiv 2404.06654) on real prose.

Four of RULER's synthetic tasks, with its needle, question and answer-prefix wording, keys made of
two random words ("quiet-lantern") and 7-digit values, scored by string match. The haystack is
consecutive text from a real document (by default the embedded Jane Austen corpus, see
:mod:`ropescale.data.corpus`) instead of RULER's Paul Graham essays.

The suite lives in three files: :mod:`ropescale.evals.tasks.needle_tasks` (the four tasks, their wording
and scoring), :mod:`ropescale.evals.tasks.needle_prompt` (haystack and exact-length prompts: the layout,
depths and seeds) and this one (the run over a (length, depth) grid, its result and heatmap). The
names of the other two are importable from here too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ropescale.evals.tasks.generation import (
    GridJSON,
    GridResult,
    Journaled,
    PromptJournal,
    check_grid,
    check_positive_int,
    greedy_generate,
    grid_jobs,
    plot_accuracy_heatmap,
)
from ropescale.evals.tasks.needle_prompt import (
    Needle,
    NeedlePrompt,
    _PromptBuilder,
    build_needle_prompt,
    sentence_boundaries,
)
from ropescale.evals.tasks.needle_tasks import (
    ADJECTIVES,
    ANSWER_PREFIX,
    INTRO,
    METRICS,
    NEEDLE,
    NOUNS,
    QUESTION,
    RULER_THRESHOLD,
    TASKS,
    NeedleTask,
    get_task,
    string_match_all,
    string_match_part,
)
from ropescale.evals.tasks.passkey import check_jitter, placed_depth

__all__ = [
    "ADJECTIVES",
    "ANSWER_PREFIX",
    "INTRO",
    "METRICS",
    "NEEDLE",
    "NOUNS",
    "QUESTION",
    "RULER_THRESHOLD",
    "TASKS",
    "Needle",
    "NeedlePrompt",
    "NeedleResult",
    "NeedleTask",
    "NeedleTrial",
    "build_needle_prompt",
    "get_task",
    "plot_needle_heatmap",
    "run_needle",
    "sentence_boundaries",
    "string_match_all",
    "string_match_part",
]


@dataclass(frozen=True)
class NeedleTrial:
    """One generation: what was hidden and asked, what the model wrote, its score."""

    length: int
    depth: float
    trial: int
    query_keys: list[str]
    expected: list[str]
    distractor_keys: list[str]
    output: str
    score: float
    correct: bool  # score == 1 (every expected value found)
    needle_start: int
    actual_depth: float
    document: str
    start_char: int


class NeedleJSON(GridJSON):
    """A needle result's JSON (:meth:`NeedleResult.to_dict`): the task and its metric, then the grid's fields."""

    task: str
    metric: str | None


@dataclass
class NeedleResult(GridResult):
    """Outcome of :func:`run_needle`; the same shape as :class:`~ropescale.evals.tasks.passkey.PasskeyResult`.

    Attributes:
        task: task name.
        lengths, depths: the grid, in the order given.
        trials: trials per (length, depth) cell.
        seed: run seed.
        max_new_tokens: tokens generated per trial.
        records: every trial, in run order.
        elapsed_s: wall-clock seconds spent generating, the journaled prompts' included.
        resumed: what the prompts taken from a journal cost, or None.
        threshold: mean score a length needs to count towards :attr:`effective_context`.
    """

    task: str
    lengths: list[int]
    depths: list[float]
    trials: int
    seed: int
    max_new_tokens: int
    records: list[NeedleTrial] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: the prompts an interrupted run's journal held (:meth:`~ropescale.evals.tasks.generation.PromptJournal.
    #: journaled`): ``elapsed_s`` counts their seconds where the journal has them
    resumed: Journaled | None = None
    threshold: float = RULER_THRESHOLD

    def to_dict(self) -> NeedleJSON:
        """Return a JSON-serialisable dict (:meth:`GridResult.grid_dict`, plus ``task`` and ``metric``)."""
        return {
            "task": self.task,
            "metric": TASKS[self.task].metric if self.task in TASKS else None,
            **self.grid_dict(),
        }


@torch.inference_mode()
def run_needle(
    model: Any,
    tokenizer: Any,
    task: str,
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    seed: int = 0,
    haystack: Any = None,
    max_new_tokens: int | None = None,
    progress: bool = True,
    add_bos: bool | None = None,
    batch_size: int = 1,
    journal: PromptJournal | None = None,
    jitter: float = 0.0,
) -> NeedleResult:
    """Run a needle task over a grid of prompt lengths and needle depths.

    Every (length, depth) cell runs ``trials`` prompts (:func:`build_needle_prompt` with trial
    indices 0..trials-1); the model decodes greedily with its KV cache
    (:func:`~ropescale.evals.tasks.generation.greedy_generate`) and each output is scored with the task's
    metric.

    Args:
        model: a ``*ForCausalLM`` in eval mode.
        tokenizer: its tokenizer.
        task: a name from :data:`TASKS`.
        lengths: prompt lengths in tokens (BOS included), distinct.
        depths: depths in [0, 1] of the needle at depth, distinct.
        trials: prompts per cell.
        seed: seed of keys, values, haystack starts and needle places.
        haystack: None (the Austen corpus), a text, or a list of texts.
        max_new_tokens: tokens to generate per prompt; None takes the task's default.
        progress: show a tqdm bar over prompts.
        add_bos: as in :func:`build_needle_prompt`.
        batch_size: prompts of one length generated together (same length, no padding); 1
            reproduces single-prompt numerics exactly.
        journal: records each prompt's text as it finishes and skips the prompts it holds
            (:class:`~ropescale.evals.tasks.generation.PromptJournal`; the suite runner keeps one per cell).
        jitter: half-width of the band of depths a cell's trials spread over, the passkey's rule
            (:func:`~ropescale.evals.tasks.passkey.placed_depth`, a stream of the needle's own): each trial's
            needle at depth goes near a depth drawn uniformly from ``[depth - jitter, depth + jitter]``
            cut to [0, 1]; 0 (the default here) places every trial at ``depth``, as before jitter.
            Records keep the nominal depth; ``actual_depth`` says where each needle went.

    Returns:
        A :class:`NeedleResult`.

    Raises:
        ValueError: unknown task, empty or duplicate lengths/depths, bad depth, non-positive
            trials/max_new_tokens/batch_size, jitter outside [0, 0.5], a length too short for the
            prompt, or haystack texts too short for a length. All prompts are built before the first generation.
    """
    spec = get_task(task)
    lengths, depths = check_grid(lengths, depths)
    check_positive_int("trials", trials)
    if max_new_tokens is None:
        max_new_tokens = spec.max_new_tokens
    check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("batch_size", batch_size)
    jitter = check_jitter(jitter)
    score = METRICS[spec.metric]

    builder = _PromptBuilder(tokenizer, haystack, add_bos)
    jobs = grid_jobs(lengths, depths, trials)  # trial by trial; the records are sorted back below
    prompts = [builder.build(spec, n, placed_depth(seed, n, d, t, jitter, "needle"), seed, t) for n, d, t in jobs]

    result = NeedleResult(spec.name, lengths, depths, trials, seed, max_new_tokens)
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
        desc=spec.name,
        journal=journal,
    )
    for (n, d, t), p, text in zip(jobs, prompts, texts):
        s = score(text, p.expected)
        distractors = sorted({x.key for x in p.needles if not x.queried})
        result.records.append(
            NeedleTrial(
                n,
                d,
                t,
                list(p.query_keys),
                list(p.expected),
                distractors,
                text,
                s,
                s == 1.0,
                p.needle_start,
                p.actual_depth,
                p.document,
                p.start_char,
            )
        )
    result.sort_records()
    result.elapsed_s = time.perf_counter() - start + ((result.resumed or {}).get("seconds") or 0.0)
    return result


def plot_needle_heatmap(result: NeedleResult, path: str | Path, title: str | None = None) -> Path:
    """Draw mean score per (length, depth) as a heatmap (as the passkey's) and write it atomically.

    The title's second line gives the :attr:`~NeedleResult.effective_context` and its threshold.

    Args:
        result: a :class:`NeedleResult`.
        path: output file; the format follows its suffix (png if none).
        title: first title line (default "RULER <task>").

    Returns:
        The written path.
    """
    label = f"effective context (≥ {result.threshold:g})"
    return plot_accuracy_heatmap(result, path, title=title or f"RULER {result.task}", context_label=label)
