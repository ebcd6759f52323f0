"""The records advice reads and writes, by name: the shipped evidence files, a RULER battery's summary
and the ``recommend --json`` battery record, and the suite ``ropescale eval frontier`` runs.

They are ``TypedDict``s, not dataclasses, for the reason of :mod:`ropescale.search.records`: each is the
JSON object a file holds (``evals/measured/*.json``, ``recommend --json``, the frontier's ``suite.yaml``)
or one built for it, so its keys, their order and their values stay what
earlier versions wrote. What advice computes in between is a dataclass (:class:`~.evidence.Measured`,
:class:`~.battery_evidence.Folder`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ropescale.evals.report.records import Params

if TYPE_CHECKING:  # RULER's summary types, one definition (its report's)
    from ropescale.evals.tasks.ruler.report import ScoreEntry, TaskMeasures


# evals/measured/*.json (evidence.py's module docstring)
class MeasuredEntry(TypedDict, total=False):
    """One ``measured`` entry of a shipped row: the command and what it printed, by length (as text)."""

    command: str
    ppl: dict[str, float]
    passkey: dict[str, float]
    passkey_trials: dict[str, int]


class ShippedRow(TypedDict):
    """A method at a factor with its parameters, and the entries its numbers come from."""

    label: str
    method: str
    factor: float | None
    params: Params
    measured: list[MeasuredEntry]


class ShippedFile(TypedDict, total=False):
    """A shipped measurements file (:func:`~.evidence.shipped_dict` writes its keys in this order)."""

    model: str
    original_context: int
    budget: str
    note: str
    runtime: dict[str, str]
    passkey_jitter: float
    status: str
    retrieval: str
    rows: list[ShippedRow]


# a RULER battery: the record recommend --json prints (the summary's types are RULER's report's)
class Comparison(TypedDict):
    """One length past L where two or more methods have cells (:func:`~.battery_evidence.holds`)."""

    length: int
    tasks: list[str]
    worst: dict[str, float]
    holds: list[str]
    incomplete: dict[str, int]


class RowRecord(TypedDict):
    """A battery row in the ``--json`` record: the row's fields with its scores (lengths as text)."""

    label: str
    title: str
    kind: str
    method: str | None
    factor: float | None
    params: Params
    checkpoint: str | None
    tasks: dict[str, dict[str, ScoreEntry]]
    measures: dict[str, TaskMeasures]


class BaseScore(TypedDict):
    """A task's unscaled base (0-100) and the lengths ≤ L it is the mean of."""

    score: float
    lengths: list[int]


class FolderRecord(TypedDict):
    """A battery folder in the ``--json`` record."""

    source: str
    original_context: int | None
    base: dict[str, BaseScore]
    beyond_the_model: list[str]
    rows: list[RowRecord]
    holds: list[Comparison]
    skipped: list[str]


class BatteryRecord(TypedDict):
    """``recommend --json``'s ``battery``: the whole line (``--verbose``), the short answer's (the recommended
    method's row and its folder), what holds, and each folder."""

    line: str
    short: str
    holds: list[Comparison]
    folders: list[FolderRecord]


# the suite ropescale eval frontier runs (printed by --dry-run, parsed by the suite runner)
class SuiteEntry(TypedDict, total=False):
    """One ``methods`` entry of a suite: a scaling, its label, and the tasks it is limited to."""

    method: str
    factor: float
    params: Params
    label: str
    only: dict[str, list[int]]


class PerplexityBlock(TypedDict):
    lengths: list[int]
    mode: str
    max_tokens: int


class PasskeyBlock(TypedDict):
    lengths: list[int]
    depths: list[float]
    trials: int
    jitter: float


class FrontierSuite(TypedDict):
    """:func:`~.frontier.frontier_suite`: a suite file's keys, in the order ``--dry-run`` prints them."""

    name: str
    model: str
    data: str
    seed: int
    methods: list[SuiteEntry]
    perplexity: PerplexityBlock
    passkey: PasskeyBlock


__all__ = [
    "BaseScore",
    "BatteryRecord",
    "Comparison",
    "FolderRecord",
    "FrontierSuite",
    "MeasuredEntry",
    "Params",
    "PasskeyBlock",
    "PerplexityBlock",
    "RowRecord",
    "ShippedFile",
    "ShippedRow",
    "SuiteEntry",
]
