"""Training data as a weighted mix of sources (``data.sources``), each document kept whole.

A recipe may train on several sources at once::

    data:
      sources:
        - {source: austen, weight: 0.3}            # an embedded corpus (Emma always held out)
        - {source: kjv, weight: 0.2}               # the King James Bible (Debian bible-kjv-text)
        - {source: "python:stdlib", weight: 0.3}   # the standard library's source, one package = one document
        - {source: "python:packages", weight: 0.2, max_tokens: 20000000}
        - {source: ./my_books, weight: 0.5}        # any data.source value: folder, text, JSONL, Parquet

Every source is tokenized into its own stream of whole documents; each training window comes
from one source, drawn with probability proportional to its weight (:mod:`ropescale.training.mixing`).

* **Code as long documents.** ProLong (arXiv 2410.02660) finds code repositories — one repository
  as one document, its files concatenated — and books the best long-context data. Every machine
  here holds such text offline: the Python standard library's source (``python:stdlib``, ~30 MB of
  ``.py``) and the installed packages' (``python:packages``, the environment's site-packages, a few
  hundred MB), or any tree (``python:DIR``). Each top-level package is one document: its ``.py``
  files in path order, each headed ``# file: <path>``; a tree's top-level modules form one more.
  Files that are not UTF-8 are left out and counted (``ropescale data list`` shows how many).
* **Held out.** ``data.holdout`` titles are removed from whichever source holds them, and the
  titles in :data:`ALWAYS_HELD_OUT` (Emma, the evaluation text of the Austen experiments) from
  every mix, named or not, so no mix ever trains on the text it is judged on.
"""

from __future__ import annotations

import math
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ..errors import RopescaleError

PYTHON_PREFIX = "python:"
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", ".git"}
ALWAYS_HELD_OUT = {"austen": ("Emma",)}  # a corpus's documents no mix trains on (its evaluation text)
SOURCE_KEYS = ("source", "weight", "max_tokens", "name")


@dataclass(frozen=True)
class SourceSpec:
    """One entry of ``data.sources``."""

    source: str  # any data.source value, or python:stdlib | python:packages | python:DIR
    weight: float = 1.0
    max_tokens: int | None = None  # tokens taken from this source (whole documents until then, the last cut)
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.source


def parse_sources(raw: Any) -> list[SourceSpec]:
    """``data.sources`` validated into specs; one line naming the entry and key that is wrong."""
    if not isinstance(raw, list):
        raise RopescaleError(f"data.sources must be a list of {{source, weight}} entries, got {raw!r}")
    specs = []
    for i, entry in enumerate(raw):
        where = f"data.sources[{i}]"
        if isinstance(entry, str):
            entry = {"source": entry}
        if not isinstance(entry, dict):
            raise RopescaleError(f"{where} must be a mapping with source and weight, got {entry!r}")
        unknown = sorted(set(entry) - set(SOURCE_KEYS))
        if unknown:
            raise RopescaleError(f"{where}: unknown key '{unknown[0]}'; known: {', '.join(SOURCE_KEYS)}")
        source, weight, cap = entry.get("source"), entry.get("weight", 1.0), entry.get("max_tokens")
        if not isinstance(source, str) or not source:
            raise RopescaleError(f"{where}.source is required: a corpus name, a path, or python:stdlib|packages|DIR")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise RopescaleError(f"{where}.weight must be a positive number, got {weight!r}")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
            raise RopescaleError(f"{where}.max_tokens must be a positive integer, got {cap!r}")
        specs.append(SourceSpec(source, float(weight), cap, str(entry.get("name") or "")))
    if not math.isfinite(sum(s.weight for s in specs)):  # every share would read 0 % and the mix draw one source
        weights = " + ".join(f"{s.weight:g}" for s in specs)
        raise RopescaleError(
            f"data.sources weights sum past the largest float ({weights}); only their ratios count: scale them down"
        )
    labels = [s.label for s in specs]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise RopescaleError(f"data.sources names '{twice[0]}' twice; give one of them a name")
    return specs


def python_root(source: str) -> Path:
    """The folder a ``python:`` source reads (stdlib, packages or a given directory)."""
    what = source[len(PYTHON_PREFIX) :]
    paths = sysconfig.get_paths()
    root = Path({"stdlib": paths["stdlib"], "packages": paths["purelib"]}.get(what, what)).expanduser()
    if not root.is_dir():
        raise RopescaleError(f"data source '{source}': '{root}' is not a directory (python:stdlib|packages|DIR)")
    return root


def _python_files(root: Path) -> dict[str, list[Path]]:
    """``{document title: its .py files in path order}``: one per top-level package, one for the
    top-level modules."""
    groups: dict[str, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith((".dist-info", ".egg-info")))
        rel = Path(dirpath).relative_to(root)
        title = rel.parts[0] if rel.parts else f"{root.name} (modules)"
        for name in sorted(filenames):
            # is_file: a symlink loop or a dangling link named *.py is no file to read (stat would raise)
            if name.endswith(".py") and (Path(dirpath) / name).is_file():
                groups.setdefault(title, []).append(Path(dirpath) / name)
    return dict(sorted(groups.items()))


def python_documents(source: str) -> tuple[list[tuple[str, str]], int]:
    """``([(package, its files' text with path headers), ...], files left out as not UTF-8)``."""
    root = python_root(source)
    docs, skipped = [], 0
    for title, files in _python_files(root).items():
        parts = []
        for path in files:
            try:
                text = path.read_bytes().decode("utf-8")
            except (UnicodeDecodeError, OSError):
                skipped += 1
                continue
            if "\x00" in text:
                skipped += 1
                continue
            parts.append(f"# file: {path.relative_to(root).as_posix()}\n{text.rstrip()}\n")
        if parts:
            docs.append((title, "\n".join(parts)))
    return docs, skipped


def source_documents(spec: SourceSpec, text_field: str = "text") -> list[tuple[str, Any]]:
    """The source's documents ``[(title, text or chat messages), ...]``."""
    if spec.source.startswith(PYTHON_PREFIX):
        return python_documents(spec.source)[0]
    from .documents import load_documents

    return load_documents(spec.source, text_field=text_field)


def split_source(spec: SourceSpec, docs: list[tuple[str, Any]], holdout: list[str]) -> tuple[list, list]:
    """(training documents, held-out documents) of one source: ``holdout`` titles and the source's
    :data:`ALWAYS_HELD_OUT` titles are held out."""
    wanted = {str(t).strip().lower() for t in holdout} | {t.lower() for t in ALWAYS_HELD_OUT.get(spec.source, ())}
    train = [d for d in docs if d[0].lower() not in wanted]
    if not train:
        raise RopescaleError(f"data source '{spec.label}' has no training documents left after data.holdout")
    return train, [d for d in docs if d[0].lower() in wanted]


def mix_documents(
    specs: list[SourceSpec], holdout: Any, text_field: str = "text"
) -> list[tuple[SourceSpec, list, list]]:
    """``[(spec, training documents, held-out documents), ...]``; every ``holdout`` title must be found."""
    if isinstance(holdout, int) and not isinstance(holdout, bool) and holdout:
        raise RopescaleError("with data.sources, data.holdout must list document titles (a count names no source)")
    titles = [] if isinstance(holdout, int) else list(holdout)
    out = [(spec, *split_source(spec, source_documents(spec, text_field), titles)) for spec in specs]
    found = {d[0].lower() for _, _, held in out for d in held}
    missing = [t for t in titles if str(t).strip().lower() not in found]
    if missing:
        raise RopescaleError(f"data.holdout title '{missing[0]}' is in none of data.sources")
    return out


class SourceSummary(TypedDict):
    """A source as ``ropescale data list`` prints it: documents and bytes (None: unknown) and a note."""

    documents: int | None
    bytes: int | None
    note: str


def describe_source(spec: SourceSpec) -> SourceSummary:
    """What ``ropescale data list`` prints about a source, from the files' sizes (nothing tokenized):
    ``{documents, bytes, note}``."""
    s = spec.source
    if s.startswith(PYTHON_PREFIX):
        groups = _python_files(python_root(s))
        size = sum(p.stat().st_size for files in groups.values() for p in files)
        return {"documents": len(groups), "bytes": size, "note": str(python_root(s))}
    from .corpus import CORPORA, INSTALL_COMMAND, CorpusNotInstalledError, corpus_manifest

    if s in CORPORA:
        held = ", ".join(ALWAYS_HELD_OUT.get(s, ()))
        try:
            docs = corpus_manifest(s)["documents"]
        except CorpusNotInstalledError:
            return {"documents": None, "bytes": None, "note": f"not installed: {INSTALL_COMMAND} --name {s}"}
        note = "Debian " + "+".join(CORPORA[s].packages) + (f"; {held} always held out" if held else "")
        return {"documents": len(docs), "bytes": sum(int(d.get("bytes", 0)) for d in docs), "note": note}
    path = Path(s).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        return {"documents": len(files), "bytes": sum(p.stat().st_size for p in files), "note": "folder of .txt"}
    if path.is_file():
        return {"documents": None, "bytes": path.stat().st_size, "note": path.suffix.lstrip(".") or "text"}
    return {"documents": None, "bytes": None, "note": "not found here (a hub: source is read when training)"}


def local_sources(data: Any) -> list[str]:
    """Every ``data.source`` value a recipe's data section reads: its mix's sources in order, or its one
    source. What ``--overwrite`` must never delete and what a resume fingerprints."""
    return [s.source for s in parse_sources(data.sources)] if getattr(data, "sources", None) else [data.source]
