"""Reading a training source as a run reads it, refused in one line when it cannot be: the
preflight's data check (:mod:`ropescale.training.preflight`).

Two kinds of failure differ: data that is here and cannot be used (an empty folder, a FIFO, a
malformed JSONL line, a source with no document) is a plain :class:`~ropescale.errors.RopescaleError`;
data that is not on this machine (a path not here, a corpus not installed, a ``hub:`` dataset offline
and not cached) is :class:`NotHere`, which a dry run planning a run for another machine says and goes on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import RopescaleError


class NotHere(RopescaleError):
    """Data this machine cannot read (absent, offline): a run stops, a dry run says it and goes on."""


def _offline() -> str | None:
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off"):
            return name
    return None


def read_source(source: str, text_field: str = "text", dry_run: bool = False) -> list[tuple[str, Any]]:
    """A source's documents ``[(title, text or messages), ...]`` as the run reads them, refused in one
    line when it cannot be read or holds none.

    Raises:
        NotHere: the source is not on this machine (a path, a corpus not installed, a ``hub:`` dataset
            offline and not cached; a dry run downloads nothing).
        RopescaleError: it is here and unreadable or empty.
    """
    from .corpus import CORPORA, INSTALL_COMMAND, CorpusNotInstalledError, corpus_manifest
    from .sources import PYTHON_PREFIX, python_documents

    if source.startswith(PYTHON_PREFIX):
        if source[len(PYTHON_PREFIX) :] not in ("stdlib", "packages"):
            root = Path(source[len(PYTHON_PREFIX) :]).expanduser()
            if not root.exists():
                raise NotHere(f"data source '{source}': '{root}' not found here")
        docs = python_documents(source)[0]
        if not docs:
            raise RopescaleError(f"data source '{source}' holds no readable .py file")
        return docs
    if source in CORPORA:
        try:
            corpus_manifest(source)
        except CorpusNotInstalledError:
            raise NotHere(f"data '{source}' is not installed here: {INSTALL_COMMAND} --name {source}") from None
    elif source.startswith("hub:"):
        offline = _offline()
        if dry_run and not offline:
            raise NotHere(f"data '{source}' not read: the dry run downloads nothing (it is read when training)")
        try:
            return _read(source, text_field)
        except RopescaleError as exc:
            if offline:
                raise NotHere(
                    f"data '{source}' cannot be read here: {offline}={os.environ[offline]} and it is not in the "
                    "datasets cache "
                    f"({exc}); unset {offline} or give data.source a local path"
                ) from None
            raise
    else:
        path = Path(source).expanduser()
        if not os.path.lexists(path):
            raise NotHere(f"data '{source}' not found here: not a file, a folder, hub:org/name or a corpus")
    return _read(source, text_field)


def _read(source: str, text_field: str) -> list[tuple[str, Any]]:
    from .documents import load_documents

    try:
        docs = load_documents(source, text_field=text_field)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RopescaleError(f"data '{source}' cannot be read: {why} ({exc.filename or source})") from None
    if not docs:
        raise RopescaleError(f"data '{source}' holds no document (every row empty?)")
    return docs
