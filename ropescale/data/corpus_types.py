"""The corpus's errors and document type, shared by its modules (:mod:`ropescale.data.corpus`)."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import RopescaleError


class CorpusError(RopescaleError):
    """Base class of the corpus errors (one-line messages)."""


class CorpusNotInstalledError(CorpusError, RuntimeError):
    """The corpus is not in the cache (or its files do not match the manifest)."""


class CorpusInstallError(CorpusError, RuntimeError):
    """Fetching, unpacking or parsing the source package failed."""


class Document(NamedTuple):
    title: str
    text: str
