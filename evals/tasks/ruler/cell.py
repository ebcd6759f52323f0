"""One RULER cell: a task at one length, ``samples`` prompts decoded greedily and scored as lm-eval does.

Generation is ropescale's (:func:`ropescale.evals.tasks.generation.greedy_generate`) on the model as it
is patched, so every scaling method — attention-level ones included — runs the same prompts; an
interrupted cell resumes at its first undecoded prompt through a
:class:`~ropescale.evals.tasks.generation.PromptJournal`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, NotRequired, TypedDict

from ropescale.evals.tasks.generation import (
    Journaled,
    PromptJournal,
    bos_prefix,
    check_positive_int,
    encode,
    greedy_generate,
)
from ropescale.evals.tasks.proportions import wilson_interval
from ropescale.evals.tasks.ruler.prompt import chat_text, check_prompt, starts_with_bos, template_tokens
from ropescale.evals.tasks.ruler.tasks import RulerDoc, RulerTask, generate_samples, prompt_text, score
from ropescale.models.runtime import load_average

#: fewest samples a cell should have for its interval to mean something (the issue's floor)
MIN_SAMPLES = 30


@dataclass
class RulerRecord:
    """One prompt: lm-eval's sample index, its length in tokens, what was expected, what came out."""

    index: int
    prompt_tokens: int
    outputs: list[str]
    prediction: str
    score: float


class RulerRecordJSON(TypedDict):
    """A :class:`RulerRecord` as a cell file holds it (``asdict``)."""

    index: int
    prompt_tokens: int
    outputs: list[str]
    prediction: str
    score: float


class RulerCellJSON(TypedDict):
    """A :class:`RulerCell` as a cell file holds it (:meth:`RulerCell.to_dict`): its fields, then the
    score, its interval and the metric; ``prompt`` and ``load_avg`` only where the cell has them, ``stop``
    absent from files written before it."""

    task: str
    length: int
    samples: int
    seed: int
    max_new_tokens: int
    lm_eval_task: str
    haystack: str
    records: list[RulerRecordJSON]
    elapsed_s: float
    stop: NotRequired[str]
    prompt: NotRequired[str]
    load_avg: NotRequired[list[float | None]]
    resumed: NotRequired[Journaled]
    score: float
    interval: list[float]
    metric: str


@dataclass
class RulerCell:
    """A task at one length: the mean score (0-1), its 95% Wilson interval (partial credit counted as
    a fraction of a success, as :func:`~ropescale.evals.tasks.proportions.wilson_interval` allows) and
    every record."""

    task: str
    length: int
    samples: int
    seed: int
    max_new_tokens: int
    lm_eval_task: str
    haystack: str
    records: list[RulerRecord] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: when decoding stopped: "answered" (at the first token after which every expected string was
    #: in the output: the score cannot change after it) or "max_new_tokens" (cells before the rule)
    stop: str = "answered"
    #: how the prompts reached the model (:mod:`.prompt`): "plain" (lm-eval's text) or "chat" (the
    #: tokenizer's chat template); a plain cell's file leaves the key out, as files before it did
    prompt: str = "plain"
    #: the machine's 1-minute load average when the cell started and when it ended
    #: (:func:`~ropescale.models.runtime.load_average`): a cell timed beside another job says so.
    #: Files before it lack the key
    load_avg: list[float | None] | None = None
    #: the prompts taken from the journal of an earlier, interrupted run (:meth:`~ropescale.evals.tasks.
    #: generation.PromptJournal.journaled`): how many, their decoding seconds and load averages. Then
    #: ``elapsed_s`` is this run's time plus theirs, and ``load_avg`` this run's, where the journal has
    #: their seconds; where it does not (a journal written before them), ``elapsed_s`` is this run's
    #: alone and the key says so (``seconds: null``). Absent from cells measured in one run
    resumed: Journaled | None = None

    @property
    def score(self) -> float:
        return sum(r.score for r in self.records) / len(self.records) if self.records else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(sum(r.score for r in self.records), len(self.records))

    def to_dict(self) -> RulerCellJSON:
        out = asdict(self)
        out.update(score=self.score, interval=list(self.interval), metric="string_match_all")
        out["records"] = [asdict(r) for r in self.records]
        if self.prompt == "plain":
            del out["prompt"]
        if self.load_avg is None:
            del out["load_avg"]
        if self.resumed is None:
            del out["resumed"]
        return out

    @classmethod
    def from_dict(cls, data: RulerCellJSON) -> RulerCell:
        keys = {f for f in cls.__dataclass_fields__ if f not in ("records", "stop", "prompt", "load_avg", "resumed")}
        cell = cls(
            **{k: data[k] for k in keys},
            stop=data.get("stop", "max_new_tokens"),
            prompt=data.get("prompt", "plain"),
            load_avg=data.get("load_avg"),
            resumed=data.get("resumed"),
        )
        cell.records = [RulerRecord(**r) for r in data["records"]]
        return cell


def cell_docs(
    task: RulerTask,
    tokenizer: Any,
    length: int,
    samples: int,
    seed: int = 0,
    essay: list[str] | None = None,
    prompt: str = "plain",
) -> list[RulerDoc]:
    """The cell's samples as lm-eval generates them (:func:`.tasks.generate_samples`; with ``chat`` the
    template's tokens come off the length). The tokenizer alone makes them, so a runner calls this
    before the weights load.

    Raises:
        ValueError: lm-eval's generator fitted fewer samples than asked (it skips, saying so on stderr,
            a sample whose prompt plus answer does not fit): a cell of n = 1 where 30 were asked would
            be reported with its interval and counted done. Refused, naming the task, the length and
            the count, rather than stored short.
    """
    chat = prompt == "chat"
    docs = generate_samples(task, tokenizer, length - (template_tokens(tokenizer) if chat else 0), samples, seed, essay)
    if len(docs) < samples:
        raise ValueError(
            f"RULER task {task.name} at {length} tokens: lm-eval's generator fits {len(docs)} of the {samples} "
            f"samples asked with this tokenizer (each prompt and its {task.max_new_tokens} answer tokens must "
            "fit); use a longer length"
        )
    return docs


def _answered(text: str, outputs: list[str]) -> bool:
    return score(text, outputs) == 1.0


def run_ruler_cell(
    model: Any,
    tokenizer: Any,
    task: RulerTask,
    length: int,
    samples: int,
    seed: int = 0,
    essay: list[str] | None = None,
    journal: PromptJournal | None = None,
    progress: bool = False,
    add_bos: bool | None = None,
    prompt: str = "plain",
    docs: list[RulerDoc] | None = None,
) -> RulerCell:
    """Generate ``samples`` prompts of ``task`` at ``length`` (lm-eval's generator, :mod:`.tasks`),
    decode each greedily for the task's ``max_new_tokens`` (or until every expected string is in
    its output, after which the score cannot change) and score it.

    Args:
        model: a ``*ForCausalLM`` in eval mode, patched as it should run.
        tokenizer: its tokenizer (the prompts are sized with it).
        task: a row of :data:`~ropescale.evals.tasks.ruler.tasks.TASKS`.
        length: prompt plus generated tokens, as lm-eval's ``max_seq_length``.
        samples: prompts in the cell.
        seed: seed of the generator.
        essay: the prose haystack's words, for the essay variants.
        journal: where decoded prompts are kept until the cell is written (resuming).
        progress: show a bar.
        add_bos: prepend BOS; None follows the tokenizer (and, with ``chat``, never a second one after
            a template that writes its own).
        prompt: ``plain`` (lm-eval's text) or ``chat`` (the tokenizer's chat template, :mod:`.prompt`:
            its tokens come off the length the generator fills, so prompt plus answer still fit).
        docs: the samples, where :func:`cell_docs` made them already (before the weights loaded).

    Raises:
        ValueError: lm-eval's generator fits fewer samples than asked (:func:`cell_docs`).
    """
    check_positive_int("length", length)
    check_positive_int("samples", samples)
    check_prompt(prompt, tokenizer)
    start, load = time.time(), load_average()
    chat = prompt == "chat"
    if docs is None:
        docs = cell_docs(task, tokenizer, length, samples, seed, essay, prompt)
    contexts = [chat_text(tokenizer, d["input"], d["gen_prefix"]) if chat else prompt_text(task, d) for d in docs]
    own_bos = chat and add_bos is None and starts_with_bos(tokenizer, contexts[0])
    head = [] if own_bos else bos_prefix(tokenizer, add_bos)
    prompts = [head + encode(tokenizer, text) for text in contexts]
    # Decoding stops once every expected string is in the output: string_match_all cannot change
    # after that (more text only adds matches), so the score is the one of decoding all
    # max_new_tokens, for a fraction of the tokens on the prompts the model answers.
    answered = [partial(_answered, outputs=[str(o) for o in d["outputs"]]) for d in docs]
    resumed = journal.journaled(prompts, task.max_new_tokens) if journal is not None else None
    texts = greedy_generate(
        model,
        tokenizer,
        prompts,
        task.max_new_tokens,
        progress=progress,
        desc=f"{task.name} {length}",
        journal=journal,
        finished=answered,
    )
    cell = RulerCell(
        task.name, length, len(docs), seed, task.max_new_tokens, task.lm_eval_task, task.haystack, prompt=prompt
    )
    cell.load_avg = [load, load_average()]
    for doc, ids, text in zip(docs, prompts, texts):
        outputs = [str(o) for o in doc["outputs"]]
        cell.records.append(RulerRecord(int(doc["index"]), len(ids), outputs, text, score(text, outputs)))
    cell.elapsed_s = time.time() - start + ((resumed or {}).get("seconds") or 0.0)
    cell.resumed = resumed
    return cell


__all__ = ["MIN_SAMPLES", "RulerCell", "RulerRecord", "cell_docs", "run_ruler_cell"]
