"""What every task runner's results folder promises, for the runners with their own layout
(``ropescale eval ruler``, ``ropescale eval longppl``) as for the suite's (:mod:`.cell_keys`).

* A cell is keyed like a suite's cell: besides its file name (the scaling's label, task, length) its
  file records the model's name *and content* (:func:`ropescale.models.identity.model_identity`),
  the data it read by content, and its protocol (seed, samples, settings). A model or data is compared
  by its content where the cell recorded it, its name being incidental (:func:`by_content`: a checkout at
  another root resumes). A cell at the path this run would write that measured something else stops the
  run with the first difference named
  (:func:`difference`, the suite's wording), before anything is written: replacing it would lose what it
  measured, reusing it would report it under the new name. The same model name with other content
  anywhere in the folder stops it too (the report compares the folder's cells with each other).
* A key a cell written before it was recorded lacks counts as matching (it cannot be checked): the
  shipped cells (``evals/measured/ruler/``) and a measurement in progress under the old keys are
  read, counted and resumed.
* A file this runner does not write is never rewritten: a ``results.json`` or a cell of another task
  (a perplexity suite's folder), or of a newer version of the runner's own schema, stops the run in
  one line naming the file and its schema (:func:`check_folder`).

The one writer per folder is :func:`ropescale._lock.output_lock`, held by each runner.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TypedDict

from ropescale.errors import RopescaleError

REMEDY = "give another --output, or remove that cell to measure it again"

#: a value of JSON as a cell file holds it (what :func:`legacy` walks, whatever its depth)
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
#: a value of a task's settings as a suite file writes it (a number, a name, a list of lengths or depths)
SettingValue = float | int | str | bool | list[int] | list[float] | list[str] | None
#: a task's settings by name (its row's fields: each task has its own), as a suite file and a cell's
#: ``protocol`` hold them
Settings = dict[str, SettingValue]


class Fingerprint(TypedDict, total=False):
    """A model's or data's name as given and its content fingerprint (:mod:`ropescale.models.identity`);
    a corpus or hub data names no fingerprint."""

    name: str | None
    fingerprint: str


class MeasuredJSON(TypedDict, total=False):
    """A cell's ``measured`` key (:func:`.cell_keys.measured`, the RULER and LongPPL runners' alike): the
    model, the data (null: the task reads none of the suite's) and the protocol; a cell written before a
    key was recorded lacks it (:func:`legacy`)."""

    model: Fingerprint
    data: Fingerprint | None
    protocol: Settings


#: the sections of a ``measured`` key that name an input (a model, the data it read) rather than a setting
INPUTS = ("model", "data")


def _content(section: Any) -> str | None:
    return (section.get("fingerprint") or None) if isinstance(section, dict) else None


def by_content(measured: Any) -> Any:
    """A ``measured`` key as runs compare it: its model and data by their content fingerprint where they
    record one, by name where they record none (a corpus, a cell written before fingerprints). A local
    folder or file is itself wherever it lies and however its path was written: a checkout at another
    root, a relative path given where an absolute one was, a checkpoint folder moved. Its name stays in
    the cell, for the report; the protocol is compared key by key."""
    if not isinstance(measured, dict):
        return measured
    return {k: {"fingerprint": _content(v)} if k in INPUTS and _content(v) else v for k, v in measured.items()}


def matches(recorded: MeasuredJSON | None, ours: MeasuredJSON) -> bool:
    """Whether a cell that recorded ``recorded`` measured what this run would (``ours``): compared
    :func:`by_content`, a key ``recorded`` lacks counting as ours (:func:`legacy`). A model or data
    recorded without a fingerprint (a cell written before the content was recorded) matches by name:
    the fingerprint :func:`legacy` lends it must not stand in for a name it does not share."""
    old = legacy(recorded, ours)
    if isinstance(recorded, dict) and isinstance(old, dict) and isinstance(ours, dict):
        for key in INPUTS:
            if isinstance(recorded.get(key), dict) and not _content(recorded[key]) and old.get(key) != ours.get(key):
                return False
    return by_content(old) == by_content(ours)


def model_content(model: str) -> str | None:
    """The content fingerprint of a ``--model`` value (config and weight files, not its path:
    :func:`~ropescale.models.identity.model_identity`); None where it cannot be read here (a report of
    a folder copied without its model)."""
    from ropescale.models.identity import model_identity

    try:
        return model_identity(model)["fingerprint"]
    except RopescaleError:
        return None


def text_fingerprint(value: Any) -> str:
    """A short sha256 of JSON-able content (the texts a cell read, a haystack)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def schema_of(path: Path) -> tuple[bool, Any]:
    """(readable as a JSON object, its ``schema`` or None) of a result file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, None
    return isinstance(data, dict), data.get("schema") if isinstance(data, dict) else None


def refuse_other(path: Path, named: Any, ours: str, command: str, output: Path) -> None:
    """Refuse ``path`` (schema ``named``, not ``ours``) in one line: a newer version of ours, or another task's."""
    family = ours.rsplit("/", 1)[0]
    if isinstance(named, str) and named.startswith(family + "/"):
        what = "results file" if path.name == "results.json" else "cell file"
        raise RopescaleError(
            f"{what} '{path}' has schema {named!r}; this ropescale writes {ours} (written by a newer ropescale? "
            "upgrade it, or give another --output): it is left as it is"
        )
    what = f"schema {named!r}" if named is not None else "no schema: a suite's"
    raise RopescaleError(
        f"results folder '{output}' holds another task's {path.name} ({what}); {command} writes its own "
        "there: give another --output"
    )


def check_results(output: str | Path, results_schema: str, command: str) -> None:
    """Stop before anything is written where ``output`` holds a ``results.json`` of another task or of a
    newer version of ``results_schema`` (:func:`refuse_other` names it); one that is not JSON is left to
    the writer, which replaces it."""
    output = Path(output)
    results = output / "results.json"
    if results.is_file():
        readable, named = schema_of(results)
        if readable and named != results_schema:
            refuse_other(results, named, results_schema, command, output)


def check_folder(output: str | Path, cell_schema: str, results_schema: str, command: str) -> None:
    """Stop before anything is written where ``output`` holds what this runner would overwrite and did
    not write: a ``results.json`` or a cell (``cells/*.json``) of another task, or of a newer version of
    its own schema. A file that is not JSON is left to the runner (a cell at its own path is
    recomputed; readers skip it, naming it).

    Raises:
        RopescaleError: ``results folder 'o' holds another task's results.json (schema
            'ropescale.results/2'); ropescale eval ruler writes its own there: give another --output``, or
            ``cell file 'o/cells/x.json' has schema 'ropescale.ruler.cell/2'; this ropescale writes
            ropescale.ruler.cell/1 (written by a newer ropescale? ...)``.
    """
    output = Path(output)
    check_results(output, results_schema, command)
    for path in sorted((output / "cells").glob("*.json")):
        readable, named = schema_of(path)
        if readable and named != cell_schema:
            refuse_other(path, named, cell_schema, command, output)


def compare(path: Path, recorded: MeasuredJSON, ours: MeasuredJSON, output: Path) -> None:
    """Stop where a cell at ``path`` measured something else than this run would (``recorded``,
    ``ours``: :func:`.cell_keys.measured`-shaped ``{"model": {"name", "fingerprint"}, "data",
    "protocol"}``); a key ``recorded`` lacks (a cell written before it was recorded) counts as ours.

    Raises:
        RopescaleError: ``results folder 'o' holds none__vt__4096.json, measured with a different
            protocol.seed: 0 -> 1; give another --output, or remove that cell to measure it again``.
    """
    if not matches(recorded, ours):
        old = legacy(recorded, ours)
        raise RopescaleError(
            f"results folder '{output}' holds {path.name}, measured with a different {difference(old, ours)}; {REMEDY}"
        )


def difference(old: MeasuredJSON, new: MeasuredJSON) -> str:
    """The first difference between two ``measured`` keys, named as a user knows it: the model or
    data by name (by fingerprint where only the content changed), the protocol by its key."""
    from ropescale.training.checkpoints import first_difference  # not at import: training's world

    for section in ("model", "data", "protocol"):
        a, b = old.get(section), new.get(section)
        if a == b or (section in INPUTS and _content(a) and _content(a) == _content(b)):
            continue  # the same content under another name is the same model or data (:func:`by_content`)
        if section != "protocol" and isinstance(a, dict) and isinstance(b, dict):
            if a.get("name") != b.get("name"):
                return f"{section}: {a.get('name')!r} -> {b.get('name')!r}"
            short = lambda v: str(v)[:12] if v else v  # noqa: E731
            return (
                f"{section} content: {a.get('name')!r} had fingerprint {short(a.get('fingerprint'))}, "
                f"now {short(b.get('fingerprint'))}"
            )
        return first_difference(a, b, f"{section}.")
    return first_difference(old, new)


def legacy(recorded: MeasuredJSON | None, ours: MeasuredJSON) -> MeasuredJSON:
    """``recorded`` with the keys it does not record taken from ``ours``: a cell written before a key
    existed counts as matching on it (a key recorded as null stays null)."""
    return _fill(recorded, ours)


def _fill(recorded: JSONValue, ours: JSONValue) -> JSONValue:
    """:func:`legacy` at any depth: a section, then the keys inside it."""
    if not isinstance(recorded, dict) or not isinstance(ours, dict):
        return ours if recorded is None else recorded
    out = dict(recorded)
    for key, value in ours.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _fill(out[key], value)
    return out


def check_model_content(output: Path, cells: list[tuple[Path, str, str | None]], model: str, content: str | None):
    """Stop where a cell of the same model name (``cells``: (path, model name, content or None)) recorded
    other content: the report would compare two models' cells under one name.

    Raises:
        RopescaleError: ``results folder 'o' holds none__vt__4096.json, measured with a different model
            content: 'm' had fingerprint 1a2b..., now 3c4d...; ...``.
    """
    for path, name, recorded in cells:
        if name == str(model) and recorded is not None and content is not None and recorded != content:
            old: MeasuredJSON = {"model": {"name": name, "fingerprint": recorded}}
            compare(path, old, {"model": {"name": name, "fingerprint": content}}, output)


__all__ = [
    "INPUTS",
    "REMEDY",
    "Fingerprint",
    "JSONValue",
    "MeasuredJSON",
    "SettingValue",
    "Settings",
    "refuse_other",
    "schema_of",
    "check_folder",
    "check_results",
    "check_model_content",
    "compare",
    "difference",
    "by_content",
    "legacy",
    "matches",
    "model_content",
    "text_fingerprint",
]
