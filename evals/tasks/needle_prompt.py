"""Needle prompts of an exact length in tokens: a real-text haystack, needles between sentences.

The haystack is consecutive text from a real document (by default the embedded Jane Austen
corpus, see :mod:`ropescale.data.corpus`) instead of RULER's Paul Graham essays; the tasks and
their wording are :mod:`ropescale.evals.tasks.needle_tasks`'.

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
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ropescale.data.corpus import load_corpus
from ropescale.evals.tasks.generation import bos_prefix, check_depth, check_positive_int, encode
from ropescale.evals.tasks.needle_tasks import (
    ADJECTIVES,
    ANSWER_PREFIX,
    INTRO,
    NEEDLE,
    NOUNS,
    QUESTION,
    NeedleTask,
    get_task,
)

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
        head = encode(tokenizer, head_text)
        joined = tokenizer([head_text + texts[i] for i in todo], add_special_tokens=False)["input_ids"]
        for i, ids in zip(todo, joined):
            if list(ids[: len(head)]) == head and len(ids) > len(head):
                out[i] = list(ids[len(head) :])
    return [ids if ids is not None else encode(tokenizer, text) for ids, text in zip(out, texts)]


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
        self.prefix = bos_prefix(tokenizer, add_bos)
        self.sources = _haystack_documents(haystack)
        self._docs: list[_Document] | None = None
        self._intro = {one: encode(tokenizer, INTRO[one]) for one in (False, True)}

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
