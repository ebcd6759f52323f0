"""A RULER cell file as one typed record: what ``ropescale eval ruler`` writes and every reader reads.

the earlier layout's runner (``benchmarks/ruler_run.py``) writes one :class:`CellRecord` per cell (:meth:`CellRecord.to_json`, schema
:data:`SCHEMA`); :func:`read_cells` reads them back, skipping with its reason any file that is not one
(not JSON, another schema, a key missing or of the wrong type). The report (:mod:`.aggregate`),
``recommend``'s battery line (:mod:`ropescale.evals.advice.battery_evidence`) and the extension experiment
(benchmarks/extension_ruler.py) read the record's attributes, never the file's keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from ropescale.evals.tasks.json_fields import only_known, take
from ropescale.evals.tasks.ruler.cell import RulerCell, RulerCellJSON
from ropescale.evals.tasks.run_folder import MeasuredJSON
from ropescale.interop.config_json import ProvenanceBlock, RopeDict
from ropescale.scaling import Scaling, ScalingRequest

#: version of a cell file's layout
SCHEMA = "ropescale.ruler.cell/1"


class CellFileError(ValueError):
    """A file that is not a :data:`SCHEMA` cell file this ropescale reads; the message says why."""


def _take(data: Any, key: str, kinds: tuple[type, ...], what: str, where: str = "") -> Any:
    return take(data, key, kinds, what, where, error=CellFileError)


def _keys(data: dict[str, Any], known: list[str], where: str) -> None:
    only_known(data, known, SCHEMA, where, error=CellFileError)


class FingerprintJSON(TypedDict):
    """A RULER cell's ``fingerprint`` (:meth:`CellFingerprint.to_json`): a key left out is what files
    written before it hold."""

    model: str
    model_content: NotRequired[str]
    scaling_requested: ScalingRequest
    task: str
    length: int
    samples: int
    seed: int
    runtime: dict[str, str]
    prompt: NotRequired[str]
    haystack: NotRequired[str]


@dataclass(frozen=True)
class CellFingerprint:
    """What a cell's file must record for the cell to count as done (:meth:`~.earlier.EarlierCells.is_done`):
    the model by name and by content (``model_content``: :func:`ropescale.models.identity.model_identity`'s
    fingerprint; the path alone would let new weights in the same folder reuse the old cell), the
    scaling asked for, the cell, the runtime's settings (all but its attention kernel, which the record's
    ``runtime`` adds), the prompt format (:mod:`.prompt`) and, for the essay variants, the haystack's
    text by content. A key left out (a plain prompt, no content known, no essay) is what the files
    written before it hold, so those still count as done (:func:`ropescale.evals.tasks.run_folder.legacy`)."""

    model: str
    scaling_requested: Scaling
    task: str
    length: int
    samples: int
    seed: int
    runtime: dict[str, str]
    prompt: str = "plain"
    model_content: str | None = None
    haystack: str | None = None

    def to_json(self) -> FingerprintJSON:
        return {
            "model": self.model,
            **({} if self.model_content is None else {"model_content": self.model_content}),
            "scaling_requested": self.scaling_requested.request(),
            "task": self.task,
            "length": self.length,
            "samples": self.samples,
            "seed": self.seed,
            "runtime": self.runtime,
            **({} if self.prompt == "plain" else {"prompt": self.prompt}),
            **({} if self.haystack is None else {"haystack": self.haystack}),
        }

    def journal_json(self) -> dict[str, Any]:
        """The key of a prompt journal of this cell: :meth:`to_json` without the model's path where its
        content is known, so that a journal resumes with the model folder moved or named by another path
        (a checkout at another root; :func:`ropescale.evals.tasks.run_folder.by_content`)."""
        data = dict(self.to_json())
        if self.model_content is not None:
            data.pop("model")
        return data

    def journals(self) -> list[dict[str, Any]]:
        """Every key a journal of this cell may hold and still resume: :meth:`journal_json` first (what a
        new journal is written under), then the keys journals were written under before (the model's
        path, then neither its content nor the haystack)."""
        return [self.journal_json(), dict(self.to_json()), dict(self.legacy_json())]

    def legacy_json(self) -> FingerprintJSON:
        """The fingerprint as ropescale wrote it before cells recorded the model's content and the
        haystack: what a prompt journal of a cell in progress then holds (resumed, not set aside)."""
        return cast(
            FingerprintJSON, {k: v for k, v in self.to_json().items() if k not in ("model_content", "haystack")}
        )

    def measured(self) -> MeasuredJSON:
        """What the cell measured, in the suite's shape (:func:`.cell_keys.measured`): the model (name,
        content where recorded), the haystack's text where recorded (``data``) and the protocol; the
        runtime is not in it (a cell of another runtime is recomputed, as a suite's is)."""
        out: MeasuredJSON = {
            "model": {
                "name": self.model,
                **({} if self.model_content is None else {"fingerprint": self.model_content}),
            },
            "protocol": {
                "scaling_requested": self.scaling_requested.request(),
                "task": self.task,
                "length": self.length,
                "samples": self.samples,
                "seed": self.seed,
                "prompt": self.prompt,
            },
        }
        if self.haystack is not None:
            out["data"] = {"name": "the essay haystack", "fingerprint": self.haystack}
        return json.loads(json.dumps(out))

    @classmethod
    def from_json(cls, data: Any) -> CellFingerprint:
        if not isinstance(data, dict):
            raise CellFileError(f"fingerprint = {data!r}: must be an object")
        _keys(data, list(cls.__dataclass_fields__), "fingerprint.")
        asked = _take(data, "scaling_requested", (dict,), "an object", "fingerprint.")
        _keys(asked, ["method", "factor", "params"], "fingerprint.scaling_requested.")
        where = "fingerprint.scaling_requested."
        method = _take(asked, "method", (str, type(None)), "a method name or null", where)
        factor = _take(asked, "factor", (int, float, type(None)), "a number or null", where)
        scaling = Scaling.from_request(method, factor, _take(asked, "params", (dict,), "an object", where))
        return cls(
            _take(data, "model", (str,), "a string", "fingerprint."),
            scaling,
            _take(data, "task", (str,), "a string", "fingerprint."),
            _take(data, "length", (int,), "an integer", "fingerprint."),
            _take(data, "samples", (int,), "an integer", "fingerprint."),
            _take(data, "seed", (int,), "an integer", "fingerprint."),
            _take(data, "runtime", (dict,), "an object", "fingerprint."),
            _prompt(data.get("prompt", "plain")),
            _take(data, "model_content", (str,), "a string", "fingerprint.") if "model_content" in data else None,
            _take(data, "haystack", (str,), "a string", "fingerprint.") if "haystack" in data else None,
        )


def _prompt(value: Any) -> str:
    from ropescale.evals.tasks.ruler.prompt import PROMPTS

    if value not in PROMPTS:
        raise CellFileError(f"fingerprint.prompt = {value!r}: must be one of {', '.join(PROMPTS)}")
    return value


class CellFileJSON(TypedDict):
    """A RULER cell file (:meth:`CellRecord.to_json`), its keys in the order they are written."""

    schema: str
    fingerprint: FingerprintJSON
    label: str
    unscaled: bool
    scaling: ProvenanceBlock
    rope_parameters: RopeDict | None
    lm_eval_version: str
    runtime: dict[str, str]
    original_context: int
    cell: RulerCellJSON


#: a cell file's keys, in the order they are described
_KEYS = [
    "schema",
    "fingerprint",
    "label",
    "unscaled",
    "scaling",
    "rope_parameters",
    "lm_eval_version",
    "runtime",
    "original_context",
    "cell",
]


@dataclass(frozen=True)
class CellRecord:
    """One cell file: its fingerprint, the scaling's label, whether it is the unscaled model, what the
    loaded model ran (``scaling``: :func:`~ropescale.patching.model.describe`; ``rope_parameters``: as its
    config holds them), lm-eval's version, the runtime (with its attention kernel), the trained context L
    and the cell itself (``result``). ``path``: the file it was read from (None: built in memory)."""

    fingerprint: CellFingerprint
    label: str
    unscaled: bool
    scaling: ProvenanceBlock
    rope_parameters: RopeDict | None
    lm_eval_version: str
    runtime: dict[str, str]
    original_context: int
    result: RulerCell
    path: Path | None = None
    #: the cell as its file holds it, written back as it was (cells written before RulerCell's ``stop``
    #: lack it, and ``RulerCell.to_dict`` would add it); None for a record built in memory
    cell_json: RulerCellJSON | None = field(default=None, repr=False, compare=False)

    @property
    def model(self) -> str:
        return self.fingerprint.model

    @property
    def task(self) -> str:
        return self.result.task

    @property
    def prompt(self) -> str:
        """How the prompts reached the model: ``plain`` or ``chat`` (:mod:`.prompt`)."""
        return self.fingerprint.prompt

    @property
    def length(self) -> int:
        return self.result.length

    @property
    def score(self) -> float:
        """The cell's mean score, 0-1."""
        return self.result.score

    @property
    def short(self) -> bool:
        """Fewer samples than asked (lm-eval's generator could not fit them all at this length: a cell
        written before such a cell was refused): said by the report, never counted done."""
        return self.result.samples < self.fingerprint.samples

    @property
    def complete(self) -> bool:
        """Every sample asked decoded and scored."""
        return bool(self.result.records) and len(self.result.records) == self.result.samples and not self.short

    def to_json(self) -> CellFileJSON:
        """The JSON object of the cell's file, as the earlier layout's runner (``benchmarks/ruler_run.py``) writes it."""
        return {
            "schema": SCHEMA,
            "fingerprint": self.fingerprint.to_json(),
            "label": self.label,
            "unscaled": self.unscaled,
            "scaling": self.scaling,
            "rope_parameters": self.rope_parameters,
            "lm_eval_version": self.lm_eval_version,
            "runtime": self.runtime,
            "original_context": self.original_context,
            "cell": self.result.to_dict() if self.cell_json is None else self.cell_json,
        }

    @classmethod
    def from_json(cls, data: Any, path: str | Path | None = None) -> CellRecord:
        """The record of a cell file's JSON object; :class:`CellFileError` (why) for anything else: another
        schema, a key missing, unknown or of the wrong type, a cell that is not complete."""
        named = data.get("schema") if isinstance(data, dict) else None
        if named != SCHEMA:
            why = (
                "not a RULER cell file" if not str(named or "").startswith("ropescale.ruler.cell/") else "a newer one?"
            )
            raise CellFileError(f"schema {named!r}, this ropescale reads {SCHEMA} ({why})")
        _keys(data, _KEYS, "")
        raw = _take(data, "cell", (dict,), "an object")
        try:
            result = RulerCell.from_dict(raw)
        except (KeyError, TypeError, AttributeError) as exc:
            raise CellFileError(f"a {SCHEMA} file without a complete cell ({exc})") from None
        return cls(
            CellFingerprint.from_json(data.get("fingerprint")),
            _take(data, "label", (str,), "a string"),
            _take(data, "unscaled", (bool,), "true or false"),
            _take(data, "scaling", (dict,), "an object"),
            _take(data, "rope_parameters", (dict, type(None)), "an object or null"),
            _take(data, "lm_eval_version", (str,), "a string"),
            _take(data, "runtime", (dict,), "an object"),
            _take(data, "original_context", (int,), "an integer"),
            result,
            None if path is None else Path(path),
            raw,
        )


def read_cells(paths: list[Path]) -> tuple[list[CellRecord], list[str]]:
    """The cell files among ``paths`` as records and, for every other file, one line saying why it was
    skipped: not JSON, not a cell, a cell of a schema this ropescale does not read (a newer one wrote
    it), or a key missing or of the wrong type."""
    out, skipped = [], []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            skipped.append(f"{path}: not readable as JSON ({exc.__class__.__name__})")
            continue
        try:
            out.append(CellRecord.from_json(data, path))
        except CellFileError as exc:
            skipped.append(f"{path}: {exc}")
    return out, skipped


def cell_files(folder: str | Path) -> list[Path]:
    """The cell files of a run's folder (``FOLDER/cells/*.json``) or of a shipped one (``FOLDER/*.json``,
    as in ``evals/measured/ruler/``)."""
    inner = Path(folder) / "cells"
    return sorted((inner if inner.is_dir() else Path(folder)).glob("*.json"))


def load_cells(output: str | Path) -> list[CellRecord]:
    """Every cell file of ``output`` (any scaling; a run's folder or a shipped one), as records."""
    return read_cells(cell_files(output))[0]


__all__ = [
    "SCHEMA",
    "CellFileError",
    "cell_files",
    "CellFingerprint",
    "CellRecord",
    "Scaling",
    "load_cells",
    "read_cells",
]
