"""The JSON records the task rows read and write, with their keys named (issue 53: typed inside, JSON a
dict only at the file boundary): a retrieval trial, LongPPL's evaluator,
fingerprint, cells and results.

Nothing here imports torch: the rows (:mod:`.task_table`) and the reports name these types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

# JSON's values (a method's parameters, the keys of a result another version wrote that this one does not
# name) and a cell's measured key are run_folder's, which every runner's cell check shares
from ropescale.evals.tasks.run_folder import Fingerprint, JSONValue, MeasuredJSON

if TYPE_CHECKING:
    from ropescale.evals.tasks.longppl import LongPPLTotals
    from ropescale.interop.config_json import ProvenanceBlock
    from ropescale.scaling import ScalingRequest


class TrialJSON(TypedDict, total=False):
    """One retrieval record as a cell keeps it (``asdict`` of a passkey or needle trial: the keys both
    have, then each one's own), read back from cell files of any version."""

    length: int
    depth: float
    trial: int
    output: str
    correct: bool
    needle_start: int
    key: int  # passkey
    query_keys: list[str]  # needle
    expected: list[str]
    distractor_keys: list[str]
    score: float
    actual_depth: float
    document: str


class EvaluatorJSON(TypedDict):
    """Who chose LongPPL's key tokens and by which rule (:func:`.longppl_run.evaluator_record`),
    recorded with every LongPPL cell."""

    model: str
    scaling: ScalingRequest
    #: the evaluated model itself, unscaled
    default: bool
    trunc_len: int
    internal: int
    alpha: float
    beta: float


class LongPPLFingerprint(TypedDict):
    """What a LongPPL cell of ``ropescale eval longppl`` records and must match to count as done
    (:class:`.longppl_run.CellKeys`); a key a cell written before it lacks is absent."""

    model: str
    model_content: NotRequired[str]
    scaling_requested: ScalingRequest
    length: int
    evaluator: EvaluatorJSON
    documents: int
    data: NotRequired[Fingerprint]


class LongPPLCellFile(TypedDict):
    """A cell of ``ropescale eval longppl`` as ``results.json`` lists it: a file of the layout before the
    command ran through the suite runner (``schema``), or a suite's cell in that shape (no ``schema``)."""

    schema: NotRequired[str]
    fingerprint: LongPPLFingerprint
    label: str
    scaling: ProvenanceBlock
    length: int
    result: LongPPLTotals


class LongPPLResults(TypedDict):
    """``results.json`` of ``ropescale eval longppl``: the evaluator and every cell it scored."""

    schema: str
    evaluator: EvaluatorJSON
    cells: list[LongPPLCellFile]


class LongPPLSummary(LongPPLResults):
    """What :func:`.longppl_run.run_longppl` returns: ``results.json``, the report's text and its path."""

    markdown: str
    report: str


__all__ = [
    "EvaluatorJSON",
    "JSONValue",
    "LongPPLCellFile",
    "LongPPLFingerprint",
    "LongPPLResults",
    "LongPPLSummary",
    "MeasuredJSON",
    "TrialJSON",
]
