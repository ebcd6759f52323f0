"""The records a search keeps, by name: candidates, the keyword arguments they patch with, trials,
settings, held-out cells and the report.

They are ``TypedDict``s, not dataclasses: each is written to a JSON file as it is (``history.json``,
``heldout.json``, ``best.json``, ``report.json``) and read back from one to resume, so a record is the
JSON object itself and its keys, their order and their values stay what earlier versions wrote.
"""

from __future__ import annotations

from typing import TypedDict

from ..interop.config_json import RopeDict

#: a method parameter as JSON holds it (a scaling read back from a model may be any method's)
ParamValue = float | int | str | bool | list[float] | None


class LongRopeCandidate(TypedDict):
    """A point of :class:`~ropescale.search.space.LongRopeSpace`: λ_i per rotary pair and the attention factor."""

    long_factor: list[float]
    attention_factor: float


class YarnCandidate(TypedDict):
    """A point of :class:`~ropescale.search.space.YarnSpace`."""

    beta_fast: float
    beta_slow: float
    attention_factor: float


class GridCandidate(TypedDict, total=False):
    """A point of :class:`~ropescale.search.grid.AttentionSpace`: the keys of its method's grid
    (Self-Extend: group_size, window; DCA: chunk_size, local_window; STRING: shift, local_window,
    frequencies; all three: logn)."""

    group_size: int
    window: int
    chunk_size: int
    local_window: int
    shift: int
    frequencies: str
    logn: bool


#: a candidate of any space (the engine moves them without looking inside)
Candidate = LongRopeCandidate | YarnCandidate | GridCandidate


class MethodParams(TypedDict, total=False):
    """A candidate as keyword arguments of ``ropescale.patch`` (``factor`` included): a space's
    ``method_params``, ``best.json``'s ``params``, a held-out cell's ``params``."""

    factor: float
    long_factor: list[float]
    short_factor: list[float]
    attention_factor: float
    beta_fast: float
    beta_slow: float
    group_size: int
    window: int
    chunk_size: int
    local_window: int
    shift: int
    frequencies: str
    logn: bool


class PatchKwargs(MethodParams, total=False):
    """:meth:`ropescale.search.artifacts.SearchResult.patch_kwargs`: the method's name with its parameters."""

    method: str


class ScoreParts(TypedDict, total=False):
    """Per-objective details of a score (needle: each prompt's mean answer NLL and depth; mixed: both scores)."""

    answer_nll: list[float]
    depths: list[float]
    perplexity: float
    needle: float
    weight: float


class _ScoreRecord(TypedDict):
    ppl: float
    nll: float
    tokens: int
    seconds: float
    objective: str


class ScoreRecord(_ScoreRecord, total=False):
    """:meth:`ropescale.search.objective.Score.to_dict`: what a trial records of its score."""

    parts: ScoreParts


class _Trial(TypedDict):
    index: int
    origin: str
    params: Candidate
    score: ScoreRecord


class Trial(_Trial, total=False):
    """One evaluated candidate of ``history.json``: its number, where it came from (``seed:yarn``,
    ``mutate(3:tilt)``, ...), its parameters and score, and a note when a seed was projected."""

    note: str


class SpaceSettings(TypedDict, total=False):
    """The LongRoPE space's options a search records (empty for the other spaces)."""

    max_ratio: float
    floor: bool
    attention: str | float
    short: str


class TextSettings(TypedDict):
    """Which calibration text a search scored, and a fingerprint of the tokens it used."""

    title: str
    source: str
    tokens: int
    sha256: str


class NeedleRecord(TypedDict, total=False):
    """The needle prompts of a ``needle`` or ``mixed`` search
    (:meth:`ropescale.search.needles.NeedleSettings.as_dict`, with the haystack's fingerprint)."""

    prompts: int
    depths: list[float]
    length: int
    seed: int
    template: str
    haystack_sha256: str
    weight: float


class _SearchSettings(TypedDict):
    model: str
    method: str
    target_length: int
    factor: float
    original_max_position_embeddings: int
    eval_length: int
    windows: int
    layout: str
    chunks: int | None
    seed: int
    dtype: str
    bos_token_id: int | None
    space: SpaceSettings
    calibration: TextSettings


class SearchSettings(_SearchSettings, total=False):
    """What identifies a search: a history with other settings is refused, not resumed. ``objective``
    and ``needle`` only for needle and mixed searches (a perplexity search's settings stay those of
    the versions before objectives)."""

    objective: str
    needle: NeedleRecord


class HistoryFile(TypedDict, total=False):
    """``history.json`` (``format`` is absent in the first version's files)."""

    format: int
    settings: SearchSettings
    candidates: list[Trial]


class ScalingRan(TypedDict, total=False):
    """What a model ran, read back from it (:func:`ropescale.patching.readback.scaling_of`); its
    ``params`` are any method's, a saved checkpoint's included."""

    method: str
    factor: float | None
    params: dict[str, ParamValue]
    attention_factor: float


class _HeldoutCell(TypedDict):
    label: str
    method: str
    params: MethodParams
    protocol: str
    ppl: float
    tokens: int
    seconds: float


class HeldoutCell(_HeldoutCell, total=False):
    """One held-out measurement of ``heldout.json``: a label's method and parameters under a protocol
    (``calibration-protocol`` or ``contiguous-N``), and the scaling read back from the model that ran
    (:func:`ropescale.patching.readback.scaling_of`)."""

    scaling: ScalingRan


class Column(TypedDict):
    """A column of the search report: its key (``calibration``, ``calibration-protocol``, ``contiguous-N``)."""

    key: str
    title: str
    tokens: int | None


class Row(TypedDict):
    """A row of the search report: a method's label and its value in each column (None: not measured)."""

    label: str
    values: dict[str, float | None]


class TextNote(TypedDict):
    """Which text a report's calibration or held-out column used."""

    title: str
    source: str
    note: str


class BestRecord(TypedDict):
    """The best candidate as the report names it."""

    index: int
    origin: str
    ppl: float
    params: Candidate


class _SearchReport(TypedDict):
    settings: SearchSettings
    options: dict[str, ParamValue | list[str] | list[int]]
    calibration_text: TextNote
    heldout_text: TextNote
    calibration_tokens: int
    evaluated: int
    search_seconds: float
    best: BestRecord
    columns: list[Column]
    rows: list[Row]
    heldout_cells: dict[str, HeldoutCell]


class SearchReport(_SearchReport, total=False):
    """``report.json`` (:func:`ropescale.search.artifacts.build_report`): ``carries`` names a scaled
    checkpoint's own scaling; ``wall_seconds_this_run`` is added by the run that wrote it."""

    carries: str
    wall_seconds_this_run: float


class CalibrationScore(TypedDict):
    """The best candidate's calibration score in ``best.json``."""

    ppl: float
    tokens: int


class BestFile(TypedDict):
    """``best.json``: the best candidate as ``ropescale.patch`` arguments and the config it patches to."""

    method: str
    params: MethodParams
    model: str
    candidate: int
    origin: str
    objective: str
    calibration: CalibrationScore
    rope_parameters: RopeDict
    max_position_embeddings: int


class SuiteEntry(TypedDict):
    """A ``methods:`` entry of an evaluation suite (:meth:`ropescale.search.artifacts.SearchResult.suite_entry`)."""

    label: str
    method: str
    factor: float
    params: MethodParams


__all__ = [
    "BestFile",
    "BestRecord",
    "CalibrationScore",
    "Candidate",
    "Column",
    "GridCandidate",
    "HeldoutCell",
    "HistoryFile",
    "LongRopeCandidate",
    "MethodParams",
    "NeedleRecord",
    "PatchKwargs",
    "ParamValue",
    "Row",
    "ScalingRan",
    "ScoreParts",
    "ScoreRecord",
    "SearchReport",
    "SearchSettings",
    "SpaceSettings",
    "SuiteEntry",
    "TextNote",
    "TextSettings",
    "Trial",
    "YarnCandidate",
]
