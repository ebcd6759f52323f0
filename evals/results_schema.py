"""The version of ropescale's result files: ``results.json`` of a suite and the evidence files
(``evals/measured/*.json``) read by ``recommend`` and the frontier.

A file carries ``"schema": "ropescale.results/N"``. A file without it is version 1 (every file
written before the field existed: ``results.json`` and the shipped evidence alike) and reads as it
always did; version 2 adds the field and the task table's tasks (RULER) to ``results.json``. A file
naming a version this ropescale does not know (a newer one wrote it, or it is not a results file) is
refused in one line naming the file and the version, rather than read as if it were the old shape.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError

NAME = "ropescale.results"
#: the version this ropescale writes
VERSION = 2
#: the versions it reads
READS = (1, 2)


def stamp() -> dict[str, str]:
    """The ``schema`` field of a file written now."""
    return {"schema": f"{NAME}/{VERSION}"}


def version(data: Any, path: str | Path, what: str = "results file") -> int:
    """The schema version of a loaded result file (1 where it names none).

    Raises:
        RopescaleError: ``results file 'P' has schema 'ropescale.results/9'; this ropescale reads
            ropescale.results/1 to /2 (written by a newer ropescale? upgrade it)``.
    """
    if not isinstance(data, dict) or "schema" not in data:
        return 1
    named = data["schema"]
    found = re.fullmatch(rf"{re.escape(NAME)}/(\d+)", named) if isinstance(named, str) else None
    if found is None or int(found.group(1)) not in READS:
        raise RopescaleError(
            f"{what} '{path}' has schema {named!r}; this ropescale reads {NAME}/{READS[0]} to /{READS[-1]} "
            "(written by a newer ropescale? upgrade it)"
        )
    return int(found.group(1))


__all__ = ["NAME", "READS", "VERSION", "stamp", "version"]
