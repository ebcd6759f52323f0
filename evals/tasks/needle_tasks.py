"""The RULER needle tasks (Hsieh et al., arXiv 2404.06654): their wording, keys and scoring.

=================  ====================================================================  ======
task               needles                                                               asks
=================  ====================================================================  ======
niah_single        1 key, 1 value                                                        1 value
niah_multikey      4 keys, 1 value each; 3 are distractors                               1 value
niah_multivalue    1 key, 4 values                                                       4 values
niah_multiquery    4 keys, 1 value each                                                  4 values
=================  ====================================================================  ======

(RULER's ``niah_single_1`` uses a repeated-filler haystack: that is :mod:`ropescale.evals.tasks.passkey`;
its ``_3`` variants with UUID values and ``niah_multikey_2/3`` with needle haystacks are left out.)

The needle, intro, question and answer-prefix wording is RULER's, singular when one value is
asked for (``niah_single``, ``niah_multikey``), as RULER's generator rewrites it. Keys are two
random words ("quiet-lantern"), values 7-digit numbers.

Scoring (RULER's ``string_match_all``): the fraction of expected values that occur in the output,
case-insensitively, as substrings; the cell accuracy is the mean score, and the effective context
is the largest length whose mean over depths is at least 0.856 (RULER's threshold, 85.6 / 100,
the score of Llama-2-7B at 4k).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
