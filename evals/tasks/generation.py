"""What the retrieval evals share: argument checks, prompt-token helpers, greedy generation, the
accuracy bookkeeping of a (length, depth) grid and its heatmap.

:mod:`ropescale.evals.tasks.passkey` and :mod:`ropescale.evals.tasks.needle` build exact-length prompts and
score what the model writes; the decoding between the two, and how a run's accuracy is counted and
drawn, live here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import torch
from tqdm.auto import tqdm

from ropescale.evals.tasks.proportions import wilson_interval
from ropescale.evals.tasks.records import TrialJSON
from ropescale.models.runtime import load_average
from ropescale.scoring.nll import model_device


def check_depth(depth: Any) -> float:
    """Return ``depth`` as a float, checking that it is a number in [0, 1].

    Raises:
        ValueError: a bool, a non-number, or a number outside [0, 1].
    """
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be a number in [0, 1], got {depth!r}")
    return float(depth)


def check_positive_int(name: str, value: Any) -> int:
    """Return ``value``, checking that it is a positive ``int`` (bools are refused).

    Raises:
        ValueError: naming ``name``, if it is not.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_grid(lengths: Sequence[int], depths: Sequence[float]) -> tuple[list[int], list[float]]:
    """Check a (length, depth) grid: non-empty, distinct, positive lengths and depths in [0, 1].

    Returns:
        The lengths and the depths (as floats) as lists, in the order given.

    Raises:
        ValueError: an empty or repeating axis, a bad length or a bad depth.
    """
    lengths = [check_positive_int("length", n) for n in lengths]
    depths = [check_depth(d) for d in depths]
    for name, values in (("lengths", lengths), ("depths", depths)):
        if not values:
            raise ValueError(f"{name} must not be empty")
        if len(set(values)) != len(values):
            raise ValueError(f"{name} must be distinct, got {values}")
    return lengths, depths


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (no BOS), as a list."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokenizer_adds_bos(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` prepends its BOS when encoding with special tokens.

    Args:
        tokenizer: a transformers tokenizer.

    Returns:
        True if it has a BOS id and ``tokenizer("a")`` starts with it.
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer.encode("a", add_special_tokens=True)
    return len(ids) > 0 and ids[0] == bos


def bos_prefix(tokenizer: Any, add_bos: bool | None) -> list[int]:
    """The token ids a prompt starts with: ``[BOS]`` or nothing.

    Args:
        tokenizer: a transformers tokenizer.
        add_bos: prepend its BOS; None follows the tokenizer (:func:`tokenizer_adds_bos`).

    Raises:
        ValueError: ``add_bos=True`` with a tokenizer without BOS.
    """
    if add_bos is None:
        add_bos = tokenizer_adds_bos(tokenizer)
    if add_bos and getattr(tokenizer, "bos_token_id", None) is None:
        raise ValueError("add_bos=True but the tokenizer has no BOS token")
    return [tokenizer.bos_token_id] if add_bos else []


@torch.inference_mode()
def greedy_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 1,
    progress: bool = False,
    desc: str = "generate",
    journal: PromptJournal | None = None,
    finished: Sequence[Callable[[str], bool]] | None = None,
) -> list[str]:
    """Decode each prompt greedily with the model's KV cache and return the new text.

    Consecutive prompts of the same length are generated together, up to ``batch_size`` at a time,
    so no padding is ever needed (the retrieval evals order their prompts by length); with
    ``batch_size=1`` every prompt is decoded alone, reproducing single-prompt numerics exactly.

    Args:
        model: a ``*ForCausalLM`` in eval mode (anything with ``generate`` and ``parameters``).
        tokenizer: its tokenizer; its pad id (or EOS id) fills rows that stop early.
        prompts: token ids of each prompt, BOS included where wanted.
        max_new_tokens: tokens to generate per prompt.
        batch_size: most prompts per ``generate`` call.
        progress: show a tqdm bar over prompts.
        desc: the bar's label.
        journal: where each prompt's text is recorded as soon as it is decoded, and read back:
            a prompt the journal already holds is not decoded again (an interrupted run resumes).
        finished: one test per prompt, or None: a prompt's decoding stops at the first token after
            which its text (decoded so far) passes its test. For a score that more text cannot
            change (RULER's ``string_match_all`` once every expected string is found), this is the
            same score for less decoding; the text returned is then the shorter one.

    Returns:
        One string per prompt, in order: the generated tokens decoded with special tokens skipped.

    Raises:
        ValueError: non-positive ``max_new_tokens`` or ``batch_size``, or an empty prompt.
    """
    check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("batch_size", batch_size)
    prompts = [list(p) for p in prompts]
    if any(not p for p in prompts):
        raise ValueError("prompts must not be empty")
    if finished is not None and len(finished) != len(prompts):
        raise ValueError(f"finished needs one test per prompt: {len(finished)} for {len(prompts)} prompts")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(tokenizer, "eos_token_id", None)
    device = model_device(model)

    done = journal.texts(prompts, max_new_tokens) if journal is not None else [None] * len(prompts)
    todo = [i for i, text in enumerate(done) if text is None]
    texts: list[str | None] = list(done)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc=desc, disable=not progress, unit="prompt")
    k = 0
    while k < len(todo):
        batch = [todo[k]]  # a batch holds prompts of the same length, consecutive among those left
        while k + len(batch) < len(todo) and len(batch) < batch_size:
            nxt = todo[k + len(batch)]
            if len(prompts[nxt]) != len(prompts[batch[0]]):
                break
            batch.append(nxt)
        input_ids = torch.tensor([prompts[i] for i in batch], dtype=torch.long, device=device)  # [b, L]
        stop = {}
        if finished is not None:
            from transformers import StoppingCriteriaList

            tests = [finished[i] for i in batch]
            stop["stopping_criteria"] = StoppingCriteriaList([_text_test(tokenizer, input_ids.shape[1], tests)])
        began = time.perf_counter()
        with _beyond_context_allowed():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
                **stop,
            )  # [b, L + new]
        seconds = (time.perf_counter() - began) / len(batch)  # a batch's prompts share its time
        for i, new in zip(batch, out[:, input_ids.shape[1] :]):
            texts[i] = tokenizer.decode(new.tolist(), skip_special_tokens=True)
            if journal is not None:
                journal.record(prompts[i], max_new_tokens, texts[i], seconds, load_average())
        bar.update(len(batch))
        k += len(batch)
    bar.close()
    return [t for t in texts if t is not None]


class _NoContextReminder(logging.Filter):
    """Drops transformers' "friendly reminder" that generation has exceeded max_position_embeddings:
    an unscaled baseline evaluated past its context does so on purpose, and the report says how it did."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "exceeded the model's predefined maximum length" not in record.getMessage()


@contextlib.contextmanager
def _beyond_context_allowed():
    logger = logging.getLogger("transformers.generation.stopping_criteria")
    quiet = _NoContextReminder()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _text_test(tokenizer: Any, prompt_length: int, tests: Sequence[Callable[[str], bool]]) -> Any:
    """A transformers stopping criterion: row ``b`` is done once its new tokens, decoded, pass
    ``tests[b]`` (called after every generated token; decoding a few hundred tokens is cheap beside
    a forward pass over a long prompt)."""
    from transformers import StoppingCriteria

    class TextTest(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            new = input_ids[:, prompt_length:].tolist()
            done = [bool(test(tokenizer.decode(ids, skip_special_tokens=True))) for ids, test in zip(new, tests)]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return TextTest()


class JournalLine(TypedDict, total=False):
    """One decoded prompt of a :class:`PromptJournal` (``seconds`` and ``load`` in lines written since issue 54)."""

    prompt: str
    max_new_tokens: int
    text: str
    seconds: float
    load: float


class Journaled(TypedDict):
    """What a cell's prompts taken from a journal cost when they were decoded (:meth:`PromptJournal.journaled`)."""

    prompts: int
    seconds: float | None
    load_avg: list[float] | None


class PromptJournal:
    """The texts a retrieval run has decoded so far, one JSON line per prompt, so that an
    interrupted run resumes at the first prompt it had not finished (a 32k-token prompt costs
    minutes on a CPU; a cell of 25 of them, hours).

    The first line holds a fingerprint of what decoded them (model, method settings, runtime):
    a journal written under another fingerprint is set aside (renamed ``*.stale``), never mixed
    in. Each later line is ``{"prompt": sha256 of the token ids, "max_new_tokens", "text"}``, and
    since issue 54 ``"seconds"`` (the prompt's decoding time) and ``"load"`` (the 1-minute load average
    when it finished), appended and flushed to disk as the prompt finishes; a torn last line (a crash
    mid-write) is ignored. A cell resumed from the journal reports what its journaled prompts cost
    (:meth:`journaled`) rather than only the run that finished it. The caller removes the journal once
    the run's result is written.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict[str, Any], also: Sequence[dict[str, Any]] = ()):
        """``also``: older fingerprints of the same work (what a journal written before a key was added
        holds), accepted as this one: a measurement in progress resumes under the new keys."""
        self.path = Path(path)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True))  # as it reads back
        self.also = [json.loads(json.dumps(f, sort_keys=True)) for f in also]

    @staticmethod
    def digest(prompt: Sequence[int]) -> str:
        """sha256 of a prompt's token ids."""
        return hashlib.sha256(",".join(str(int(t)) for t in prompt).encode()).hexdigest()

    def _read(self, write: bool = True) -> dict[tuple[str, int], str]:
        return {key: str(row["text"]) for key, row in self._rows(write).items()}

    def _rows(self, write: bool = True) -> dict[tuple[str, int], JournalLine]:
        if not self.path.is_file():
            return {}
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except ValueError:
            head = None
        if not isinstance(head, dict) or (head.get("fingerprint") not in (self.fingerprint, *self.also)):
            if write:
                self.path.replace(self.path.with_name(self.path.name + ".stale"))
            return {}
        if write and not text.endswith("\n"):  # a torn last line: the next record starts on a line of its own
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("\n")
        found = {}
        for line in lines[1:]:
            try:
                row = json.loads(line)
                found[(row["prompt"], row["max_new_tokens"])] = {**row, "text": str(row["text"])}
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from an interrupted write
        return found

    def texts(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[str | None]:
        """Each prompt's recorded text, or None where it has none; starts the file if absent."""
        found = self._read()
        if not self.path.is_file():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"fingerprint": self.fingerprint})
        return [found.get((self.digest(p), max_new_tokens)) for p in prompts]

    def peek(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[str | None]:
        """As :meth:`texts`, without touching the file (a run may be writing it): for reports."""
        found = self._read(write=False)
        return [found.get((self.digest(p), max_new_tokens)) for p in prompts]

    def journaled(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> Journaled | None:
        """What the prompts the journal already holds cost when they were decoded, or None where it
        holds none of them (read without touching the file): how many, their decoding seconds (None where
        a line lacks them: a journal written before the key) and the range of the load averages they
        finished under (None where no line has one)."""
        found = self._rows(write=False)
        rows = [found[key] for p in prompts if (key := (self.digest(p), max_new_tokens)) in found]
        if not rows:
            return None

        def number(x: Any) -> bool:  # a damaged line's value is unknown, never a crash or a made-up time
            return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0

        seconds = [r.get("seconds") for r in rows]
        loads = [r["load"] for r in rows if number(r.get("load"))]
        return {
            "prompts": len(rows),
            "seconds": float(sum(seconds)) if all(number(x) for x in seconds) else None,
            "load_avg": [min(loads), max(loads)] if loads else None,
        }

    def record(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        text: str,
        seconds: float | None = None,
        load: float | None = None,
    ) -> None:
        """Append one finished prompt's text, with its decoding time and load average where given."""
        row: JournalLine = {"prompt": self.digest(prompt), "max_new_tokens": max_new_tokens, "text": text}
        if seconds is not None:
            row["seconds"] = round(seconds, 3)
        if load is not None:
            row["load"] = load
        self._append(row)

    def _append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def carry(self, other: PromptJournal) -> int:
        """Append the prompts ``other`` holds under its own fingerprint (the same work journaled in another
        layout: a RULER cell in progress before eval ruler ran through the suite runner), so that this
        journal resumes where that one stopped; ``other`` is read, never changed. Returns how many."""
        found = other._rows(write=False)
        if not found:
            return 0
        self.texts([], 0)  # starts the file under this fingerprint (a stale one is set aside)
        have = self._read(write=False)
        for key, row in found.items():
            if key not in have:  # the whole line: its text, and its cost where the other journal kept it
                self._append({k: row[k] for k in ("prompt", "max_new_tokens", "text", "seconds", "load") if k in row})
        return len(found)

    def remove(self) -> None:
        """Delete the journal (the run's result has been written)."""
        self.path.unlink(missing_ok=True)


__all__ = [
    "GridResult",
    "Journaled",
    "bos_prefix",
    "check_depth",
    "check_grid",
    "check_positive_int",
    "encode",
    "greedy_generate",
    "model_device",
    "plot_accuracy_heatmap",
    "tokenizer_adds_bos",
]


def grid_jobs(lengths: Sequence[int], depths: Sequence[float], trials: int) -> list[tuple[int, float, int]]:
    """A retrieval grid's ``(length, depth, trial)`` jobs in the order they are decoded: per length,
    trial by trial (every depth once, then again), so that a cell cut short has sampled every depth
    alike. :meth:`GridResult.sort_records` puts the records back in (length, depth, trial) order."""
    return [(n, d, t) for n in lengths for t in range(trials) for d in depths]


class GridJSON(TypedDict):
    """The JSON fields the passkey and needle results share (:meth:`GridResult.grid_dict`)."""

    lengths: list[int]
    depths: list[float]
    trials: int
    seed: int
    max_new_tokens: int
    threshold: float
    #: rows = lengths, columns = depths
    accuracy: list[list[float]]
    #: keys are strings (JSON's)
    length_accuracy: dict[str, float]
    cell_trials: list[list[int]]
    interval: list[list[list[float]]]
    length_trials: dict[str, int]
    length_interval: dict[str, list[float]]
    effective_context: int | None
    elapsed_s: float
    resumed: NotRequired[Journaled]
    records: list[TrialJSON]


class GridResult:
    """Accuracy bookkeeping shared by the passkey and needle results (both dataclasses with
    ``lengths``, ``depths``, ``records`` and ``threshold``; each record has ``length``, ``depth``
    and a score from :meth:`score_of`)."""

    def sort_records(self) -> None:
        """Order the records by (length, depth) as the grid lists them, then by trial."""
        grid = {(n, d): (i, j) for i, n in enumerate(self.lengths) for j, d in enumerate(self.depths)}
        self.records.sort(key=lambda r: (*grid[(r.length, r.depth)], r.trial))

    @staticmethod
    def score_of(record: Any) -> float:
        return float(record.score)

    def scores(self, length: int, depth: float | None = None) -> list[float]:
        """Every trial's score at ``length`` (and ``depth``, or over all depths if None)."""
        scores = [self.score_of(r) for r in self.records if r.length == length and (depth is None or r.depth == depth)]
        if not scores:
            raise ValueError(f"no trials at length {length}" + ("" if depth is None else f", depth {depth}"))
        return scores

    def accuracy(self, length: int, depth: float | None = None) -> float:
        """Mean score at ``length`` (and ``depth``, or over all depths if None)."""
        scores = self.scores(length, depth)
        return sum(scores) / len(scores)

    def interval(self, length: int, depth: float | None = None) -> tuple[float, float]:
        """95% Wilson interval of the accuracy at ``length`` (and ``depth``), from its trials."""
        scores = self.scores(length, depth)
        return wilson_interval(sum(scores), len(scores))

    @property
    def accuracy_grid(self) -> list[list[float]]:
        """Mean score per cell, ``grid[i][j]`` for ``lengths[i]`` and ``depths[j]``."""
        return [[self.accuracy(n, d) for d in self.depths] for n in self.lengths]

    @property
    def length_accuracy(self) -> dict[int, float]:
        """Mean score per length, over all depths and trials."""
        return {n: self.accuracy(n) for n in self.lengths}

    @property
    def effective_context(self) -> int | None:
        """Largest length whose mean score is >= ``threshold`` (None if none is); shorter lengths
        need not pass, as in RULER."""
        passing = [n for n, acc in self.length_accuracy.items() if acc >= self.threshold]
        return max(passing) if passing else None

    def grid_dict(self) -> GridJSON:
        """The JSON fields both results share: settings, ``accuracy`` grid (rows = lengths),
        per-length accuracy (keys are strings), the number of trials and the 95% Wilson interval
        of every cell and length, ``effective_context``, timing (``resumed`` where prompts came from an
        interrupted run's journal, as a RULER cell says it) and the records."""
        return {
            "lengths": list(self.lengths),
            "depths": list(self.depths),
            "trials": self.trials,
            "seed": self.seed,
            "max_new_tokens": self.max_new_tokens,
            "threshold": self.threshold,
            "accuracy": self.accuracy_grid,
            "length_accuracy": {str(n): acc for n, acc in self.length_accuracy.items()},
            "cell_trials": [[len(self.scores(n, d)) for d in self.depths] for n in self.lengths],
            "interval": [[list(self.interval(n, d)) for d in self.depths] for n in self.lengths],
            "length_trials": {str(n): len(self.scores(n)) for n in self.lengths},
            "length_interval": {str(n): list(self.interval(n)) for n in self.lengths},
            "effective_context": self.effective_context,
            "elapsed_s": self.elapsed_s,
            **({"resumed": self.resumed} if getattr(self, "resumed", None) else {}),
            "records": [asdict(r) for r in self.records],
        }


def plot_accuracy_heatmap(result: GridResult, path: str | os.PathLike, title: str, context_label: str) -> Path:
    """Draw mean score per (length, depth) as a heatmap and write it atomically.

    Lengths run along x and depths down y, both sorted (:func:`ropescale.plots.grids.plot_accuracy_grid`).

    Args:
        result: a passkey or needle result, or anything with ``lengths``, ``depths``, ``trials``,
            ``accuracy(length, depth)`` and ``effective_context``.
        path: output file; the format follows its suffix (png if none).
        title: first title line; a second line gives trials per cell and ``effective_context``.
        context_label: what the second line calls that context.

    Returns:
        The written path.
    """
    from ropescale.plots import length_label
    from ropescale.plots.grids import plot_accuracy_grid

    lengths, depths = sorted(result.lengths), sorted(result.depths)
    grid = [[result.accuracy(n, d) for n in lengths] for d in depths]  # [depth][length]
    context = result.effective_context
    title = (
        f"{title}\n{result.trials} trial{'s' if result.trials > 1 else ''}/cell, "
        f"{context_label}: {length_label(context) if context else 'none'}"
    )
    return plot_accuracy_grid(lengths, depths, grid, path, title)
