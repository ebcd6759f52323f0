"""RULER-style needle-in-a-haystack retrieval (Hsieh et al., arXiv 2404.06654) on real prose.

Four of RULER's synthetic tasks, with its needle, question and answer-prefix wording, keys made of
two random words ("quiet-lantern") and 7-digit values, scored by string match. The haystack is
consecutive text from a real document (by default the embedded Jane Austen corpus, see
:mod:`ropescale.data.corpus`) instead of RULER's Paul Graham essays.

=================  ====================================================================  ======
task               needles                                                               asks
=================  ====================================================================  ======
niah_single        1 key, 1 value                                                        1 value
niah_multikey      4 keys, 1 value each; 3 are distractors                               1 value
niah_multivalue    1 key, 4 values                                                       4 values
niah_multiquery    4 keys, 1 value each                                                  4 values
=================  ====================================================================  ======

(RULER's ``niah_single_1`` uses a repeated-filler haystack: that is :mod:`ropescale.evals.passkey`;
its ``_3`` variants with UUID values and ``niah_multikey_2/3`` with needle haystacks are left out.)

Prompt layout, in tokens (each part tokenized once, then concatenated as token ids)::

    [BOS] intro | hay[:b1] | needle | hay[b1:b2] | needle | ... | hay[..n] | "\\n" question " " answer prefix

* The prompt has **exactly** ``length`` tokens, BOS included when one is added: the ``n`` haystack
  tokens are whatever the fixed parts (BOS, intro, needles, question) leave. The haystack starts at
  a paragraph start of the document (chosen by the seed) and is cut after ``n`` tokens, possibly
  inside a word; needles and question are never cut.
* The haystack is split into sentences (a ``.``/``!``/``?`` and closing quotes, followed by
  whitespace and not by a lower-case word, and not after "Mr."/"Mrs."...; every line end is a
  boundary too). Each sentence is tokenized with its leading whitespace, as it reads after a
  sentence end, so needles are only ever inserted **between whole sentences**. (Tokenizers that
  merge a full stop with the next newline, Llama 3's and Qwen2's ``".\n\n"``, see ``"." "\n\n"``
  at paragraph ends instead: the same text, not quite their own tokenization of it.)
* **Depth**: the needle *at depth* goes to the sentence boundary nearest to ``depth · n`` haystack
  tokens (the start and the cut end of the haystack count as boundaries): depth 0 puts it right
  after the intro, depth 1 right before the question. :attr:`NeedlePrompt.actual_depth` is the
  fraction actually used. In the multi-needle tasks the needle at depth is one of the queried ones
  (the first value of the first queried key); every other needle (distractors in
  ``niah_multikey``, the other values or keys otherwise) goes to a different boundary drawn
  uniformly at random (shared only when the haystack has too few sentences). RULER places all
  needles at random depths; fixing one makes the depth axis mean something.
* Keys are distinct; values are distinct and occur in no haystack text.
* **Seeds**: keys, values and the haystack's start depend on ``(seed, length, trial)`` only, so the
  cells of one trial at different depths share the same text and needles and differ only in where
  the needles are; the other needles' boundaries also depend on the depth.
* The instructions and question are RULER's, singular when one value is asked for
  (``niah_single``, ``niah_multikey``), as RULER's generator rewrites them.

Scoring (RULER's ``string_match_all``): the fraction of expected values that occur in the output,
case-insensitively, as substrings; the cell accuracy is the mean score, and the effective context
is the largest length whose mean over depths is at least 0.856 (RULER's threshold, 85.6 / 100,
the score of Llama-2-7B at 4k).
"""

from __future__ import annotations

import difflib
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ropescale.data.corpus import load_corpus
from ropescale.evals.generation import GridResult, check_depth, check_grid, check_positive_int, greedy_generate
from ropescale.evals.passkey import plot_passkey_heatmap, tokenizer_adds_bos

NEEDLE = "One of the special magic numbers for {key} is: {value}."
INTRO = {
    False: "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.",
    True: "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards.",
}  # keyed by "one value asked for"
QUESTION = {
    False: "What are all the special magic numbers for {query} mentioned in the provided text?",
    True: "What is the special magic number for {query} mentioned in the provided text?",
}
ANSWER_PREFIX = {
    False: "The special magic numbers for {query} mentioned in the provided text are",
    True: "The special magic number for {query} mentioned in the provided text is",
}
RULER_THRESHOLD = 0.856  # RULER: effective length = largest length scoring above 85.6 (of 100)

# Keys are "adjective-noun" pairs like RULER's (wonderwords): 48 x 48 = 2304 keys.
ADJECTIVES = (
    "amber ancient bitter brave bright calm clever crimson curious distant dusty eager early "
    "faded "
    "fierce gentle golden hidden hollow humble icy jolly lively lonely loud lucky misty modest "
    "narrow noble odd pale patient proud quiet rapid rusty silent silver sleepy smooth steady "
    "sturdy sunny swift tender velvet wild"
).split()
NOUNS = (
    "anchor apple badger basket beacon bottle bridge candle canyon castle cedar comet compass "
    "cottage falcon feather garden glacier harbor hazel island kettle ladder lantern lemon "
    "marble meadow mirror needle orchard otter pebble pepper pillow puzzle quarry raven ribbon "
    "saddle sparrow spindle teapot thimble tulip valley violin walnut willow"
).split()


@dataclass(frozen=True)
class NeedleTask:
    """One task of the suite.

    Attributes:
        name: registry name.
        num_keys: keys hidden in the haystack.
        num_values: values (needles) per key.
        num_queries: keys asked for (the first ``num_queries`` of them); the rest are distractors.
        max_new_tokens: default generation budget (7-digit values take 7-10 tokens each).
        metric: ``"all"`` (:func:`string_match_all`) or ``"part"`` (:func:`string_match_part`).
    """

    name: str
    num_keys: int
    num_values: int
    num_queries: int
    max_new_tokens: int
    metric: str = "all"

    @property
    def num_needles(self) -> int:
        return self.num_keys * self.num_values

    @property
    def num_expected(self) -> int:
        return self.num_queries * self.num_values


# RULER scores all NIAH tasks, multi-query included, with string_match_all.
TASKS: dict[str, NeedleTask] = {
    t.name: t
    for t in (
        NeedleTask("niah_single", num_keys=1, num_values=1, num_queries=1, max_new_tokens=32),
        NeedleTask("niah_multikey", num_keys=4, num_values=1, num_queries=1, max_new_tokens=32),
        NeedleTask("niah_multivalue", num_keys=1, num_values=4, num_queries=1, max_new_tokens=64),
        NeedleTask("niah_multiquery", num_keys=4, num_values=1, num_queries=4, max_new_tokens=64),
    )
}


def get_task(name: str) -> NeedleTask:
    """The :class:`NeedleTask` called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones and a close match).
    """
    if isinstance(name, str) and name in TASKS:
        return TASKS[name]
    close = difflib.get_close_matches(str(name), TASKS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown needle task {name!r}{hint}; known tasks: {', '.join(TASKS)}")


# ------------------------------------------------------------------------------------- scoring


def _check_expected(expected: Sequence[str]) -> list[str]:
    if isinstance(expected, str) or not expected or not all(isinstance(e, str) and e for e in expected):
        raise ValueError(f"expected must be a non-empty list of non-empty strings, got {expected!r}")
    return list(expected)


def string_match_all(output: str, expected: Sequence[str]) -> float:
    """RULER's ``string_match_all`` for one sample: the fraction of ``expected`` found in ``output``.

    Each expected string counts if it occurs anywhere in the output, case-insensitively (a
    substring test, as in RULER: "x1234567y" contains 1234567). Order and repetitions do not matter.

    Args:
        output: the model's continuation.
        expected: the values to find.

    Returns:
        A score in [0, 1].
    """
    expected = _check_expected(expected)
    text = output.lower()
    return sum(e.lower() in text for e in expected) / len(expected)


def string_match_part(output: str, expected: Sequence[str]) -> float:
    """RULER's ``string_match_part`` for one sample: 1.0 if any of ``expected`` is in ``output``, else 0.0.

    RULER uses it for its QA tasks (several acceptable answers); no NIAH task here uses it.
    """
    expected = _check_expected(expected)
    text = output.lower()
    return float(any(e.lower() in text for e in expected))


METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {"all": string_match_all, "part": string_match_part}


# ----------------------------------------------------------------------------- haystack & prompt

_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s)")
_LINE_END = re.compile(r"(?<=\S)(?=[ \t]*\n)")
_NEXT_WORD = re.compile(r"\s*(\S)")
_WORD_BEFORE = re.compile(r"(\w+)$")
_ABBREVIATIONS = frozenset("mr mrs ms dr st messrs mme mlle col capt gen lt rev esq jr sr no vs".split())


def sentence_boundaries(text: str) -> list[int]:
    """Character offsets where the sentences of ``text`` start, leading whitespace included.

    A sentence ends at ``.``, ``!`` or ``?`` (with any closing quotes or brackets) followed by
    whitespace, unless the next word starts in lower case (``"Oh!" said she``) or the word before
    the full stop is a title or a single capital (``Mr. Knightley``, ``J. Smith``); every line end
    is a boundary too. Offset 0 is always the first; the text's trailing whitespace is no sentence.

    Args:
        text: any text.

    Returns:
        Sorted offsets; ``text[b[k]:b[k+1]]`` is the k-th sentence with its leading whitespace.
    """
    cuts = {0}
    for m in _SENTENCE_END.finditer(text):
        nxt = _NEXT_WORD.match(text, m.end())
        if nxt is None or nxt.group(1).islower():
            continue
        if text[m.start()] == ".":
            match = _WORD_BEFORE.search(text, max(0, m.start() - 16), m.start())
            word = match.group(1) if match else ""
            if word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()):
                continue
        cuts.add(m.end())
    cuts.update(m.end() for m in _LINE_END.finditer(text))
    end = len(text.rstrip())
    return sorted(c for c in cuts if c < end)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _encode_continuations(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Tokens of each text as it reads right after a full stop (its own leading whitespace kept).

    Each text is tokenized as ``"." + text`` and the full stop's tokens removed, so byte-level BPE
    tokenizers keep their leading-space tokens and SentencePiece ones their word starts. Where the
    tokenizer merges the full stop with the text (Llama 3 and Qwen2 have ``".\\n\\n"`` tokens), the
    head ``"a"`` is tried, then plain tokenization (which may add a SentencePiece word start).
    """
    out: list[list[int] | None] = [None] * len(texts)
    for head_text in (".", "a"):
        todo = [i for i, ids in enumerate(out) if ids is None]
        if not todo:
            break
        head = _encode(tokenizer, head_text)
        joined = tokenizer([head_text + texts[i] for i in todo], add_special_tokens=False)["input_ids"]
        for i, ids in zip(todo, joined):
            if list(ids[: len(head)]) == head and len(ids) > len(head):
                out[i] = list(ids[len(head) :])
    return [ids if ids is not None else _encode(tokenizer, text) for ids, text in zip(out, texts)]


@dataclass
class _Document:
    """A haystack text split into sentences, each tokenized in context."""

    title: str
    text: str
    starts: list[int]  # character offset of each sentence (leading whitespace included)
    ids: list[list[int]]  # tokens of each sentence
    suffix: list[int]  # suffix[k] = tokens in sentences k..end
    paragraph_starts: list[int]  # sentence indices a haystack may start at

    @classmethod
    def build(cls, tokenizer: Any, title: str, text: str) -> _Document:
        starts = sentence_boundaries(text)
        ends = starts[1:] + [len(text.rstrip())]
        sentences = [text[a:b] for a, b in zip(starts, ends)]
        # The haystack follows the intro's full stop as a new paragraph; the document's first
        # sentence gets that paragraph break, the others keep their own leading whitespace.
        if sentences:
            sentences[0] = "\n\n" + sentences[0].lstrip()
        ids = _encode_continuations(tokenizer, sentences)
        suffix = [0] * (len(ids) + 1)
        for k in range(len(ids) - 1, -1, -1):
            suffix[k] = suffix[k + 1] + len(ids[k])
        paragraph_starts = [k for k, s in enumerate(sentences) if "\n" in s[: len(s) - len(s.lstrip())]]
        return cls(title, text, starts, ids, suffix, paragraph_starts)

    @property
    def n_tokens(self) -> int:
        return self.suffix[0]


def _haystack_documents(haystack: Any) -> list[tuple[str, str]]:
    """(title, text) pairs from ``haystack``: None (the Austen corpus), a text, or a list of texts."""
    if haystack is None:
        return [(doc.title, doc.text) for doc in load_corpus("austen")]
    if isinstance(haystack, str):
        haystack = [haystack]
    try:
        texts = list(haystack)
    except TypeError:
        raise ValueError(f"haystack must be a list of texts, got {type(haystack).__name__}") from None
    if not texts:
        raise ValueError("haystack must contain at least one text")
    docs = []
    for i, item in enumerate(texts):
        title, text = item if isinstance(item, tuple) and len(item) == 2 else (f"haystack[{i}]", item)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"haystack[{i}] must be a non-empty string, got {text!r:.60}")
        docs.append((str(title), text))
    return docs


@dataclass(frozen=True)
class Needle:
    """One needle sentence in a prompt: ``NEEDLE.format(key=key, value=value)`` at ``[start, end)``."""

    key: str
    value: str
    start: int
    end: int
    queried: bool


@dataclass(frozen=True)
class NeedlePrompt:
    """A tokenized needle prompt and where its parts lie.

    Attributes:
        input_ids: the prompt's token ids (BOS included when added); exactly the requested length.
        task: task name.
        depth: the requested depth in [0, 1].
        query_keys: the keys the question asks for, in question order.
        expected: the values a perfect answer contains.
        needles: every needle, in prompt order (``queried`` is False for distractors).
        needle_start: token offset of the needle at depth.
        haystack_start: offset of the first haystack token (after BOS and intro).
        question_start: offset of the question (end of the haystack region).
        n_haystack: number of haystack tokens, needles excluded.
        haystack_before: haystack tokens before the needle at depth (a sentence boundary).
        document: title of the haystack text.
        start_char: character offset in that text where the haystack starts.
    """

    input_ids: list[int]
    task: str
    depth: float
    query_keys: tuple[str, ...]
    expected: tuple[str, ...]
    needles: tuple[Needle, ...]
    needle_start: int
    haystack_start: int
    question_start: int
    n_haystack: int
    haystack_before: int
    document: str
    start_char: int

    @property
    def length(self) -> int:
        """Number of tokens in the prompt."""
        return len(self.input_ids)

    @property
    def actual_depth(self) -> float:
        """Fraction of the haystack tokens before the needle at depth (after snapping to a sentence)."""
        return self.haystack_before / self.n_haystack if self.n_haystack else self.depth


def _query_text(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]  # RULER's wording


class _PromptBuilder:
    """Tokenizes the haystack texts once, then assembles prompts."""

    def __init__(self, tokenizer: Any, haystack: Any = None, add_bos: bool | None = None) -> None:
        self.tokenizer = tokenizer
        if add_bos is None:
            add_bos = tokenizer_adds_bos(tokenizer)
        if add_bos and getattr(tokenizer, "bos_token_id", None) is None:
            raise ValueError("add_bos=True but the tokenizer has no BOS token")
        self.prefix = [tokenizer.bos_token_id] if add_bos else []
        self.sources = _haystack_documents(haystack)
        self._docs: list[_Document] | None = None
        self._intro = {one: _encode(tokenizer, INTRO[one]) for one in (False, True)}

    @property
    def docs(self) -> list[_Document]:
        if self._docs is None:
            self._docs = [_Document.build(self.tokenizer, title, text) for title, text in self.sources]
        return self._docs

    def _draw_needles(self, rng: random.Random, task: NeedleTask) -> tuple[list[str], list[list[str]]]:
        """Distinct keys and distinct 7-digit values that occur in no haystack text."""
        n_nouns = len(NOUNS)
        picks = rng.sample(range(len(ADJECTIVES) * n_nouns), task.num_keys)
        keys = [f"{ADJECTIVES[i // n_nouns]}-{NOUNS[i % n_nouns]}" for i in picks]
        values: list[str] = []
        while len(values) < task.num_needles:
            v = str(rng.randint(10**6, 10**7 - 1))
            if v not in values and not any(v in text for _, text in self.sources):
                values.append(v)
        per_key = [values[i * task.num_values : (i + 1) * task.num_values] for i in range(task.num_keys)]
        return keys, per_key

    def build(self, task: str | NeedleTask, length: int, depth: float, seed: int = 0, trial: int = 0) -> NeedlePrompt:
        spec = task if isinstance(task, NeedleTask) else get_task(task)
        check_positive_int("length", length)
        depth = check_depth(depth)
        if isinstance(seed, bool) or not isinstance(seed, int) or isinstance(trial, bool) or not isinstance(trial, int):
            raise ValueError(f"seed and trial must be integers, got {seed!r} and {trial!r}")
        rng = random.Random(f"needle:{seed}:{length}:{trial}")
        keys, values = self._draw_needles(rng, spec)
        one = spec.num_expected == 1
        query = _query_text(keys[: spec.num_queries])
        # needle order: the needle at depth first (value 0 of key 0), then the others.
        pairs = [(k, v, i < spec.num_queries) for i, k in enumerate(keys) for v in values[i]]
        needle_ids = _encode_continuations(self.tokenizer, [" " + NEEDLE.format(key=k, value=v) for k, v, _ in pairs])
        question = _encode_continuations(
            self.tokenizer, ["\n" + QUESTION[one].format(query=query) + " " + ANSWER_PREFIX[one].format(query=query)]
        )[0]
        intro = self._intro[one]
        fixed = len(self.prefix) + len(intro) + sum(map(len, needle_ids)) + len(question)
        if length < fixed:
            needles = f"{len(pairs)} needle{'s' if len(pairs) > 1 else ''}"
            raise ValueError(
                f"length {length} is too short for {spec.name}: "
                f"{'BOS, ' if self.prefix else ''}instructions, {needles} and question take {fixed} tokens"
            )
        n_hay = length - fixed

        # Haystack: a seeded document and paragraph start with at least n_hay tokens after it.
        docs = self.docs
        eligible = [d for d in docs if d.n_tokens >= n_hay]
        if not eligible:
            longest = max(docs, key=lambda d: d.n_tokens)
            raise ValueError(
                f"haystack too short: length {length} needs {n_hay} haystack tokens for {spec.name}, "
                f"but the longest haystack text ({longest.title}) has only {longest.n_tokens} tokens"
            )
        doc = eligible[rng.randrange(len(eligible))]
        starts = [k for k in doc.paragraph_starts if doc.suffix[k] >= n_hay]  # sentence 0 always qualifies
        first = starts[rng.randrange(len(starts))]
        hay: list[int] = []
        boundaries = [0]
        k = first
        while len(hay) < n_hay:
            hay += doc.ids[k]
            boundaries.append(min(len(hay), n_hay))
            k += 1
        hay = hay[:n_hay]
        boundaries = sorted(set(boundaries))

        target = depth * n_hay
        at_depth = min(boundaries, key=lambda b: (abs(b - target), b))
        others = [b for b in boundaries if b != at_depth]
        place = random.Random(f"needle:{seed}:{length}:{trial}:{depth!r}")
        n_other = len(pairs) - 1
        if len(others) >= n_other:
            positions = [at_depth] + place.sample(others, n_other)
        else:  # too few sentences: needles share boundaries (they then follow one another)
            positions = [at_depth] + [place.choice(boundaries) for _ in range(n_other)]

        ids = self.prefix + intro
        haystack_start, cursor = len(ids), 0
        needles: list[Needle] = []
        needle_start = -1
        for pos, i in sorted((p, i) for i, p in enumerate(positions)):
            ids += hay[cursor:pos]
            cursor = pos
            if i == 0:
                needle_start = len(ids)
            key, value, queried = pairs[i]
            needles.append(Needle(key, value, len(ids), len(ids) + len(needle_ids[i]), queried))
            ids += needle_ids[i]
        ids += hay[cursor:]
        question_start = len(ids)
        ids += question
        assert len(ids) == length, (len(ids), length)  # internal invariant, not user input
        return NeedlePrompt(
            input_ids=ids,
            task=spec.name,
            depth=depth,
            query_keys=tuple(keys[: spec.num_queries]),
            expected=tuple(v for vs in values[: spec.num_queries] for v in vs),
            needles=tuple(needles),
            needle_start=needle_start,
            haystack_start=haystack_start,
            question_start=question_start,
            n_haystack=n_hay,
            haystack_before=at_depth,
            document=doc.title,
            start_char=doc.starts[first] if doc.starts else 0,
        )


def build_needle_prompt(
    tokenizer: Any,
    task: str,
    length: int,
    depth: float,
    seed: int = 0,
    trial: int = 0,
    haystack: Any = None,
    add_bos: bool | None = None,
) -> NeedlePrompt:
    """Build one needle prompt of exactly ``length`` tokens (see the module doc for the layout).

    Every call tokenizes the whole haystack; :func:`run_needle` does it once per run.

    Args:
        tokenizer: a transformers tokenizer.
        task: a name from :data:`TASKS`.
        length: total prompt length in tokens, BOS included when added.
        depth: where the needle at depth goes, as a fraction in [0, 1] of the haystack tokens.
        seed, trial: select keys, values and the haystack's start (and the other needles' places).
        haystack: None for the embedded Austen corpus, a text, or a list of texts (or of
            ``(title, text)`` pairs).
        add_bos: prepend the tokenizer's BOS; None follows the tokenizer.

    Returns:
        A :class:`NeedlePrompt`.

    Raises:
        ValueError: unknown task, bad length/depth, a length too short for the instructions,
            needles and question, or haystack texts too short for the length.
        CorpusNotInstalledError: ``haystack=None`` and the Austen corpus is not installed.
    """
    return _PromptBuilder(tokenizer, haystack, add_bos).build(task, length, depth, seed, trial)


# ---------------------------------------------------------------------------------- run & result


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


@dataclass
class NeedleResult(GridResult):
    """Outcome of :func:`run_needle`; the same shape as :class:`~ropescale.evals.passkey.PasskeyResult`.

    Attributes:
        task: task name.
        lengths, depths: the grid, in the order given.
        trials: trials per (length, depth) cell.
        seed: run seed.
        max_new_tokens: tokens generated per trial.
        records: every trial, in run order.
        elapsed_s: wall-clock seconds spent generating.
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
    threshold: float = RULER_THRESHOLD

    def to_dict(self) -> dict[str, Any]:
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
) -> NeedleResult:
    """Run a needle task over a grid of prompt lengths and needle depths.

    Every (length, depth) cell runs ``trials`` prompts (:func:`build_needle_prompt` with trial
    indices 0..trials-1); the model decodes greedily with its KV cache
    (:func:`~ropescale.evals.generation.greedy_generate`) and each output is scored with the task's
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

    Returns:
        A :class:`NeedleResult`.

    Raises:
        ValueError: unknown task, empty or duplicate lengths/depths, bad depth, non-positive
            trials/max_new_tokens/batch_size, a length too short for the prompt, or haystack
            texts too short for a length. All prompts are built before the first generation.
    """
    spec = get_task(task)
    lengths, depths = check_grid(lengths, depths)
    check_positive_int("trials", trials)
    if max_new_tokens is None:
        max_new_tokens = spec.max_new_tokens
    check_positive_int("max_new_tokens", max_new_tokens)
    check_positive_int("batch_size", batch_size)
    score = METRICS[spec.metric]

    builder = _PromptBuilder(tokenizer, haystack, add_bos)
    jobs = [(n, d, t) for n in lengths for d in depths for t in range(trials)]
    prompts = [builder.build(spec, n, d, seed, t) for n, d, t in jobs]

    result = NeedleResult(spec.name, lengths, depths, trials, seed, max_new_tokens)
    start = time.perf_counter()
    # Prompts of one length have exactly that many tokens, so batches never need padding.
    texts = greedy_generate(
        model, tokenizer, [p.input_ids for p in prompts], max_new_tokens, batch_size, progress, desc=spec.name
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
    result.elapsed_s = time.perf_counter() - start
    return result


def plot_needle_heatmap(result: NeedleResult, path: str | Path, title: str | None = None) -> Path:
    """Draw mean score per (length, depth) as a heatmap (the passkey plot) and write it atomically.

    The title's second line gives the :attr:`~NeedleResult.effective_context` and its threshold.

    Args:
        result: a :class:`NeedleResult`.
        path: output file; the format follows its suffix (png if none).
        title: first title line (default "RULER <task>").

    Returns:
        The written path.
    """
    label = f"effective context (≥ {result.threshold:g})"
    return plot_passkey_heatmap(result, path, title=title or f"RULER {result.task}", context_label=label)
