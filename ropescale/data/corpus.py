"""The embedded long-text corpus for perplexity and needle evaluation.

Long, coherent, public-domain English prose, installed once, offline afterwards, from Debian's
package archive (nothing is committed to the repository and no data hub is needed):

* ``austen`` (default): Jane Austen's six completed novels, from the Debian package
  ``r-cran-janeaustenr`` (the R package *janeaustenr*: Project Gutenberg texts stored as
  character vectors in an R lazy-load database, ``data/Rdata.rdb``/``.rdx``, parsed here with
  the PyPI package ``rdata``). Six documents of 98k-207k tokens, 0.92M tokens in all
  (SmolLM2's 49k-vocabulary BPE tokenizer).
* ``kjv``: the King James Bible from ``bible-kjv-text`` (a compressed verse database that only
  the ``bible`` program of the package ``bible-kjv`` can read; that program is extracted and
  run, it is not installed). Two documents, the Old and the New Testament, one verse a line
  without verse numbers, book and chapter headings kept; 798k + 234k tokens.

Install (no root needed: ``apt-get download`` works for any user, the ``.deb`` is unpacked
with ``dpkg-deb -x`` into a temporary directory; only a missing ``apt-get update`` needs root,
and it is run automatically when the installer is root)::

    python -m ropescale.data.corpus install [--name austen|kjv] [--cache-dir DIR] [--force]
    python -m ropescale.data.corpus list [--name ...]

Each corpus lives in ``$ROPESCALE_CACHE/corpora/<name>`` (``ROPESCALE_CACHE`` defaults to
``~/.cache/ropescale``): one UTF-8 text file per document and a ``manifest.json`` (source
package and version, license note, titles, character counts, sha256 of every file). The
directory is written into a temporary sibling and renamed into place, so an interrupted
install leaves nothing behind; installing again is a no-op while the manifest is valid.

``load_corpus()`` returns ``[(title, text), ...]`` longest document first.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_directory, cache_root, recover_directory, sha256_file
from ..errors import RopescaleError

# The pieces live in their own modules; their names stay importable from here.
from .corpus_types import CorpusError, CorpusInstallError, CorpusNotInstalledError, Document  # noqa: F401
from .debian import (  # noqa: F401
    _apt_download,
    _deb_version,
    _decompress_any,
    _decompress_rdb_entry,
    _extract_deb,
    _installed_version,
    _last_line,
    _run,
    _unserialize,
    read_lazyload_db,
)
from .texts import (  # noqa: F401
    AUSTEN_R_LIBRARY,
    AUSTEN_TITLES,
    KJV_BOOKS,
    KJV_OLD_TESTAMENT_BOOKS,
    KJV_TITLES,
    austen_documents,
    clean_gutenberg_lines,
    kjv_documents,
    kjv_documents_from_listing,
)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
DEFAULT_CORPUS = "austen"
INSTALL_COMMAND = "python -m ropescale.data.corpus install"

# ------------------------------------------------------------------------------------ locations


def corpus_dir(name: str = DEFAULT_CORPUS, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of corpus ``name``: ``cache_dir`` itself when given, else the default cache."""
    _spec(name)
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return cache_root() / "corpora" / name


# ----------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class CorpusSpec:
    name: str
    description: str
    packages: tuple[str, ...]  # Debian packages to fetch; the first one is the data's source
    license: str
    origin: str
    build: Callable[[Path], list[Document]]


CORPORA: dict[str, CorpusSpec] = {
    "austen": CorpusSpec(
        name="austen",
        description="Jane Austen's six completed novels",
        packages=("r-cran-janeaustenr",),
        license=(
            "Public domain: the novels were published 1811-1818 (texts from Project Gutenberg "
            "via the R package janeaustenr, whose packaging is MIT-licensed)."
        ),
        origin="Debian package r-cran-janeaustenr, R lazy-load database data/Rdata.rdb/.rdx",
        build=austen_documents,
    ),
    "kjv": CorpusSpec(
        name="kjv",
        description="The King James Bible (Old and New Testament)",
        packages=("bible-kjv-text", "bible-kjv"),
        license=(
            "Public domain (translation of 1611) everywhere except the United Kingdom, where "
            "the King James Version is under perpetual Crown copyright (Letters Patent)."
        ),
        origin="Debian package bible-kjv-text (bible.data), decoded by the bible program of bible-kjv",
        build=kjv_documents,
    ),
}


def _spec(name: str) -> CorpusSpec:
    try:
        return CORPORA[name]
    except KeyError:
        raise ValueError(f"unknown corpus {name!r}; choose one of: {', '.join(CORPORA)}") from None


def _obtain_packages(spec: CorpusSpec, work: Path, source: str | os.PathLike | None) -> tuple[Path, list[dict]]:
    """Root of the unpacked package files, and [{"name", "version"}] of the packages used."""
    if source is not None:
        root = Path(source).expanduser()
        if not root.is_dir():
            raise CorpusInstallError(f"--from {root}: not a directory")
        versions = [{"name": p, "version": "unknown (from a local directory)"} for p in spec.packages]
        return root, versions
    debs_dir, root = work / "debs", work / "root"
    debs_dir.mkdir()
    root.mkdir()
    versions = []
    try:
        for package in spec.packages:
            deb = _apt_download(package, debs_dir)
            versions.append({"name": package, "version": _deb_version(deb), "file": deb.name})
            _extract_deb(deb, root)
    except CorpusInstallError:
        # The same files from a system-wide installation, if there is one.
        installed = {p: _installed_version(p) for p in spec.packages}
        if all(installed.values()):
            return Path("/"), [{"name": p, "version": v, "file": "installed"} for p, v in installed.items()]
        raise
    return root, versions


# --------------------------------------------------------------------------- manifest & install


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "document"


def _write_text(path: Path, text: str) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _write_corpus(directory: Path, spec: CorpusSpec, packages: list[dict], documents: list[Document]) -> dict:
    docs = sorted(documents, key=lambda d: (-len(d.text), d.title))
    entries, used = [], set()
    for i, doc in enumerate(docs, 1):
        filename = f"{i:02d}-{_slug(doc.title)}.txt"
        if filename in used:  # pragma: no cover - index prefix keeps them distinct
            raise CorpusInstallError(f"duplicate document file name {filename}")
        used.add(filename)
        path = directory / filename
        _write_text(path, doc.text)
        entries.append(
            {
                "title": doc.title,
                "file": filename,
                "chars": len(doc.text),
                "words": len(doc.text.split()),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        )
    manifest = {
        "format": FORMAT_VERSION,
        "name": spec.name,
        "description": spec.description,
        "source": {"packages": packages, "origin": spec.origin},
        "license": spec.license,
        "order": "longest document first (by characters)",
        "documents": entries,
        "total_chars": sum(e["chars"] for e in entries),
        "total_words": sum(e["words"] for e in entries),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    _write_text(directory / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


class _Invalid(Exception):
    pass


def _validate(directory: Path, name: str, check_hashes: bool = True) -> dict:
    """The manifest of a complete install, or :class:`_Invalid` with the reason."""
    recover_directory(directory)  # a reinstall interrupted between its renames left the old one aside
    path = directory / MANIFEST
    if not path.is_file():
        raise _Invalid("missing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Invalid(f"unreadable {MANIFEST}: {exc}") from None
    version = manifest.get("format") if isinstance(manifest, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:  # refused, never replaced by an older layout
        raise CorpusInstallError(
            f"corpus '{path}' was written by a newer ropescale (format {version}, this one reads {FORMAT_VERSION}); "
            "it is not replaced: use that version or another --cache-dir"
        )
    if not isinstance(manifest, dict) or version != FORMAT_VERSION:
        raise _Invalid(f"{MANIFEST} has an unknown format")
    if manifest.get("name") != name:
        raise _Invalid(f"{MANIFEST} is for corpus {manifest.get('name')!r}, not {name!r}")
    docs = manifest.get("documents")
    if not isinstance(docs, list) or not docs:
        raise _Invalid(f"{MANIFEST} lists no documents")
    for entry in docs:
        try:
            file, size, digest = directory / entry["file"], entry["bytes"], entry["sha256"]
            _ = (entry["title"], entry["chars"])
        except (KeyError, TypeError):
            raise _Invalid(f"{MANIFEST} has a malformed document entry") from None
        if Path(entry["file"]).name != entry["file"] or not file.is_file():
            raise _Invalid(f"missing document file {entry['file']}")
        if file.stat().st_size != size or (check_hashes and sha256_file(file) != digest):
            raise _Invalid(f"{entry['file']} does not match its sha256 in {MANIFEST}")
    return manifest


def _install_hint(name: str, cache_dir, force: bool = False) -> str:
    cmd = INSTALL_COMMAND
    if name != DEFAULT_CORPUS:
        cmd += f" --name {name}"
    if cache_dir is not None:
        cmd += f" --cache-dir {cache_dir}"
    if force:
        cmd += " --force"
    return cmd + ("" if name != DEFAULT_CORPUS or cache_dir is not None or force else " (or: make setup)")


def install_corpus(
    name: str = DEFAULT_CORPUS,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    *,
    source: str | os.PathLike | None = None,
) -> Path:
    """Install corpus ``name`` into its cache directory and return that directory.

    Fetches the Debian package(s) with ``apt-get download``, unpacks them with ``dpkg-deb -x``
    into a temporary directory (nothing is installed system-wide), builds the documents and
    writes them with ``manifest.json`` into a temporary sibling of the target that is renamed
    into place. A no-op when a valid install is already there, unless ``force``. ``source``: an
    already-unpacked package tree (``/`` for system-installed packages) instead of apt.
    """
    spec = _spec(name)
    target = corpus_dir(name, cache_dir)
    if not force:
        try:
            _validate(target, name)
            return target
        except _Invalid:
            pass
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / MANIFEST).exists())):
        raise CorpusInstallError(
            f"refusing to replace {target}: it is not a ropescale corpus (no {MANIFEST}); "
            "remove it or choose another --cache-dir"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"ropescale-{name}-") as work:
        root, packages = _obtain_packages(spec, Path(work), source)
        documents = spec.build(root)
        if not documents or not all(doc.text.strip() for doc in documents):
            raise CorpusInstallError(f"corpus {name!r}: the source package produced an empty document")
        with atomic_directory(target, overwrite=True) as tmp:
            _write_corpus(tmp, spec, packages, documents)
            _validate(tmp, name)
    return target


def corpus_manifest(name: str = DEFAULT_CORPUS, cache_dir: str | os.PathLike | None = None) -> dict:
    """The manifest of an installed corpus (raises :class:`CorpusNotInstalledError`)."""
    directory = corpus_dir(name, cache_dir)
    try:
        return _validate(directory, name, check_hashes=False)
    except _Invalid as exc:
        raise _not_installed(name, cache_dir, directory, str(exc)) from None


def _not_installed(name, cache_dir, directory: Path, reason: str) -> CorpusNotInstalledError:
    if reason == "missing":
        return CorpusNotInstalledError(
            f"corpus {name!r} is not installed (no {directory / MANIFEST}); "
            f"install it with: {_install_hint(name, cache_dir)}"
        )
    return CorpusNotInstalledError(
        f"corpus {name!r} in {directory} is incomplete or damaged ({reason}); "
        f"reinstall it with: {_install_hint(name, cache_dir, force=True)}"
    )


def load_corpus(name: str = DEFAULT_CORPUS, cache_dir: str | os.PathLike | None = None) -> list[Document]:
    """The documents of an installed corpus as ``(title, text)`` tuples, longest first.

    Every file is checked against the sha256 in the manifest. Raises
    :class:`CorpusNotInstalledError` (a ``RuntimeError``) with the install command otherwise.
    """
    directory = corpus_dir(name, cache_dir)
    try:
        manifest = _validate(directory, name)
    except _Invalid as exc:
        raise _not_installed(name, cache_dir, directory, str(exc)) from None
    return [
        Document(entry["title"], (directory / entry["file"]).read_text(encoding="utf-8"))
        for entry in manifest["documents"]
    ]


# ------------------------------------------------------------------------------------------ CLI


def _print_documents(manifest: dict) -> None:
    for entry in manifest["documents"]:
        print(f"{entry['chars']:>10,d} chars  {entry['words']:>8,d} words  {entry['title']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropescale.data.corpus",
        description="Install or list the long-text evaluation corpora (from Debian packages).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("install", "fetch the Debian package and write the corpus into the cache"),
        ("list", "print the documents of an installed corpus"),
        ("path", "print the directory of a corpus"),
    ):
        p = sub.add_parser(command, help=help_text)
        p.add_argument("--name", default=DEFAULT_CORPUS, choices=sorted(CORPORA), help="corpus (default: %(default)s)")
        p.add_argument("--cache-dir", default=None, help="corpus directory (default: $ROPESCALE_CACHE/corpora/NAME)")
        if command == "install":
            p.add_argument("--force", action="store_true", help="reinstall even if a valid install is present")
            p.add_argument(
                "--from",
                dest="source",
                default=None,
                metavar="DIR",
                help="use already-unpacked package files under DIR (/ for installed packages)",
            )
    args = parser.parse_args(argv)
    try:
        if args.command == "path":
            print(corpus_dir(args.name, args.cache_dir))
            return 0
        if args.command == "install":
            directory = corpus_dir(args.name, args.cache_dir)
            fresh = args.force
            if not fresh:
                try:
                    _validate(directory, args.name)
                except _Invalid:
                    fresh = True
            if fresh:
                print(f"installing corpus {args.name!r} into {directory} ...", file=sys.stderr, flush=True)
            install_corpus(args.name, args.cache_dir, force=args.force, source=args.source)
            manifest = corpus_manifest(args.name, args.cache_dir)
            packages = ", ".join(f"{p['name']} {p['version']}" for p in manifest["source"]["packages"])
            state = "installed" if fresh else "already installed"
            print(f"corpus {args.name!r} {state} in {directory} (from {packages})", file=sys.stderr)
        else:
            manifest = corpus_manifest(args.name, args.cache_dir)
        _print_documents(manifest)
        return 0
    except (RopescaleError, ValueError, OSError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
