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
import bz2
import datetime as _dt
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from .._io import atomic_directory, cache_root
from ..errors import MissingDependencyError, RopescaleError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
DEFAULT_CORPUS = "austen"
INSTALL_COMMAND = "python -m ropescale.data.corpus install"


# --------------------------------------------------------------------------------------- errors


class CorpusError(RopescaleError):
    """Base class of the corpus errors (one-line messages)."""


class CorpusNotInstalledError(CorpusError, RuntimeError):
    """The corpus is not in the cache (or its files do not match the manifest)."""


class CorpusInstallError(CorpusError, RuntimeError):
    """Fetching, unpacking or parsing the source package failed."""


class Document(NamedTuple):
    title: str
    text: str


# ------------------------------------------------------------------------------------ locations


def corpus_dir(name: str = DEFAULT_CORPUS, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of corpus ``name``: ``cache_dir`` itself when given, else the default cache."""
    _spec(name)
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return cache_root() / "corpora" / name


# -------------------------------------------------------------------------------- text cleaning

_ITALIC_RE = re.compile(r"(?<![A-Za-z0-9])_([^_\n]+?)_(?![A-Za-z0-9])")
_SPACES_RE = re.compile(r"[ \t\u00a0]+")
_EDITORIAL_RE = re.compile(r"\[[^\[\]]*\]")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_verse_block(block: Sequence[str]) -> bool:
    """An indented block that is not hard-wrapped prose: a poem or a letter's signature.

    Hard-wrapped prose (a letter quoted in the text) is indented evenly and has lines that
    start in lower case; verse has every line capitalised or uneven indentation.
    """
    if len(block) < 2 or not all(line[:1].isspace() for line in block):
        return False
    if len({_indent(line) for line in block}) > 1:
        return True
    heads = [line.strip().lstrip("\"'(`") for line in block]
    return all(head and (head[0].isupper() or head[0].isdigit()) for head in heads)


def clean_gutenberg_lines(lines: Iterable[object]) -> str:
    """Turn hard-wrapped Gutenberg lines into paragraphs separated by one blank line.

    Lines of a paragraph are joined with spaces; runs of empty lines become one paragraph
    break; headings (``CHAPTER I``, ``VOLUME II``, the title) stay as their own paragraphs;
    indented poems keep their line breaks; ``_italic_`` markers are dropped, and so are
    paragraphs that are only a bracketed editorial note (``[End volume one of this edition.]``).
    Non-strings (R's ``NA``) count as empty lines.
    """
    blocks: list[list[str]] = []
    current: list[str] = []
    for raw in lines:
        line = raw.rstrip() if isinstance(raw, str) else ""
        if line.strip():
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)

    paragraphs = []
    for block in blocks:
        if _is_verse_block(block):
            para = "\n".join(_SPACES_RE.sub(" ", line.strip()) for line in block)
        else:
            para = _SPACES_RE.sub(" ", " ".join(line.strip() for line in block))
        para = _ITALIC_RE.sub(r"\1", para)
        if _EDITORIAL_RE.fullmatch(para):
            continue
        paragraphs.append(para)
    return "\n\n".join(paragraphs) + "\n" if paragraphs else ""


# ------------------------------------------------------------------- R lazy-load DB (janeaustenr)


def _decompress_any(data: bytes) -> bytes:
    """Undo gzip/bzip2/xz by magic number; anything else is returned as is."""
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:3] == b"BZh":
        return bz2.decompress(data)
    if data[:6] == b"\xfd7zXZ\x00":
        return lzma.decompress(data)
    return data


def _rdata():
    try:
        import rdata  # noqa: PLC0415
    except ImportError as exc:
        raise MissingDependencyError(
            "reading the Austen corpus needs the PyPI package rdata: pip install 'rdata>=0.11'"
        ) from exc
    return rdata


def _unserialize(data: bytes):
    """Parse one R-serialized object (``X\\n`` XDR format, version 2 or 3) into Python."""
    rdata = _rdata()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS" for bare streams
        return rdata.conversion.convert(rdata.parser.parse_data(data))


def _decompress_rdb_entry(blob: bytes, compressed: object) -> bytes:
    """One value of a lazy-load ``.rdb``: 4-byte big-endian length, then the compressed stream.

    ``compressed`` is the ``.rdx`` flag: TRUE/1 zlib; 2 bzip2 and 3 xz carry a type byte after
    the length ('2' bzip2, 'Z' xz, '0' stored); FALSE/0 stored.
    """
    if len(blob) < 4:
        raise CorpusInstallError("truncated entry in the R lazy-load database")
    expected = int.from_bytes(blob[:4], "big")
    kind = int(compressed)
    if kind == 0:
        out = blob[4:]
    elif kind == 1:
        out = zlib.decompress(blob[4:])
    else:
        tag, body = blob[4:5], blob[5:]
        if tag == b"Z":
            out = lzma.decompress(body)
        elif tag == b"2":
            out = bz2.decompress(body)
        elif tag == b"0":
            out = body
        else:
            raise CorpusInstallError(f"unknown compression tag {tag!r} in the R lazy-load database")
    if len(out) != expected:
        raise CorpusInstallError(f"R lazy-load entry is {len(out)} bytes, its header says {expected}")
    return out


def read_lazyload_db(base: str | os.PathLike) -> dict[str, object]:
    """All values of the R lazy-load database ``base.rdx``/``base.rdb``, by variable name."""
    base = Path(base)
    rdx, rdb = base.with_name(base.name + ".rdx"), base.with_name(base.name + ".rdb")
    if not rdx.is_file() or not rdb.is_file():
        raise CorpusInstallError(f"no R lazy-load database at {base}.rdx/.rdb")
    index = _unserialize(_decompress_any(rdx.read_bytes()))
    try:
        variables = index["variables"]
        flag = index.get("compressed", True)
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorpusInstallError(f"{rdx} is not a lazy-load index") from exc
    flag = flag[0] if hasattr(flag, "__len__") else flag
    payload = rdb.read_bytes()
    values = {}
    for key, pos in variables.items():
        offset, length = int(pos[0]), int(pos[1])
        blob = payload[offset : offset + length]
        values[str(key)] = _unserialize(_decompress_rdb_entry(blob, flag))
    return values


AUSTEN_R_LIBRARY = "usr/lib/R/site-library/janeaustenr"
AUSTEN_TITLES = {
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}


def austen_documents(root: str | os.PathLike) -> list[Document]:
    """The six novels from an extracted (or installed, ``root="/"``) r-cran-janeaustenr."""
    values = read_lazyload_db(Path(root) / AUSTEN_R_LIBRARY / "data" / "Rdata")
    docs = []
    for key, title in AUSTEN_TITLES.items():
        if key not in values:
            raise CorpusInstallError(f"janeaustenr data has no '{key}' ({title})")
        lines = list(values[key])
        if not all(isinstance(x, str) or x is None or x != x for x in lines):  # x != x: NaN (NA)
            raise CorpusInstallError(f"janeaustenr '{key}' is not a character vector")
        text = clean_gutenberg_lines(lines)
        # Northanger Abbey ends with the (Signet Classic) editor's note on the text: not Austen.
        cut = text.find("\n\nA NOTE ON THE TEXT\n\n")
        if cut >= 0 and cut > len(text) * 0.9:
            text = text[: cut + 1]
        docs.append(Document(title, text))
    return docs


# ------------------------------------------------------------------------ King James Bible (kjv)

# (abbreviation printed by `bible`, book name); the first 39 are the Old Testament.
KJV_BOOKS: tuple[tuple[str, str], ...] = (
    ("Ge", "Genesis"),
    ("Exo", "Exodus"),
    ("Lev", "Leviticus"),
    ("Num", "Numbers"),
    ("Deu", "Deuteronomy"),
    ("Josh", "Joshua"),
    ("Jdgs", "Judges"),
    ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"),
    ("2Sm", "2 Samuel"),
    ("1Ki", "1 Kings"),
    ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"),
    ("2Chr", "2 Chronicles"),
    ("Ezra", "Ezra"),
    ("Neh", "Nehemiah"),
    ("Est", "Esther"),
    ("Job", "Job"),
    ("Psa", "Psalms"),
    ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"),
    ("SSol", "Song of Solomon"),
    ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"),
    ("Eze", "Ezekiel"),
    ("Dan", "Daniel"),
    ("Hos", "Hosea"),
    ("Joel", "Joel"),
    ("Amos", "Amos"),
    ("Obad", "Obadiah"),
    ("Jonah", "Jonah"),
    ("Mic", "Micah"),
    ("Nahum", "Nahum"),
    ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"),
    ("Hag", "Haggai"),
    ("Zec", "Zechariah"),
    ("Mal", "Malachi"),
    ("Mat", "Matthew"),
    ("Mark", "Mark"),
    ("Luke", "Luke"),
    ("John", "John"),
    ("Acts", "Acts"),
    ("Rom", "Romans"),
    ("1Cor", "1 Corinthians"),
    ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"),
    ("Eph", "Ephesians"),
    ("Phi", "Philippians"),
    ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"),
    ("2Th", "2 Thessalonians"),
    ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"),
    ("Titus", "Titus"),
    ("Phmn", "Philemon"),
    ("Heb", "Hebrews"),
    ("Jas", "James"),
    ("1Pet", "1 Peter"),
    ("2Pet", "2 Peter"),
    ("1Jn", "1 John"),
    ("2Jn", "2 John"),
    ("3Jn", "3 John"),
    ("Jude", "Jude"),
    ("Rev", "Revelation"),
)
KJV_OLD_TESTAMENT_BOOKS = 39
KJV_TITLES = ("The Old Testament (King James Version)", "The New Testament (King James Version)")
_KJV_INDEX = {abbr: i for i, (abbr, _) in enumerate(KJV_BOOKS)}
_VERSE_RE = re.compile(r"([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)")


def kjv_documents_from_listing(listing: str) -> list[Document]:
    """Old and New Testament documents from ``bible -f`` output (``Ge1:1 In the beginning...``).

    Verse numbers are dropped, one verse a line; each book starts with its name and each
    chapter with ``Chapter N`` (``Psalm N`` in Psalms), separated by blank lines.
    """
    parts: list[list[str]] = [[], []]
    book = chapter = None
    for line in listing.splitlines():
        if not line.strip():
            continue
        m = _VERSE_RE.fullmatch(line.strip())
        if not m or m.group(1) not in _KJV_INDEX:
            raise CorpusInstallError(f"unexpected line in the bible listing: {line[:60]!r}")
        abbr, chap, text = m.group(1), int(m.group(2)), _SPACES_RE.sub(" ", m.group(4).strip())
        index = _KJV_INDEX[abbr]
        out = parts[0 if index < KJV_OLD_TESTAMENT_BOOKS else 1]
        if abbr != book:
            book, chapter = abbr, None
            out.append(("\n\n" if out else "") + KJV_BOOKS[index][1])
        if chap != chapter:
            chapter = chap
            out.append(f"\n\n{'Psalm' if abbr == 'Psa' else 'Chapter'} {chap}\n")
        out.append("\n" + text)
    docs = [Document(title, "".join(chunks) + "\n") for title, chunks in zip(KJV_TITLES, parts) if chunks]
    if not docs:
        raise CorpusInstallError("the bible listing is empty")
    return docs


def kjv_documents(root: str | os.PathLike) -> list[Document]:
    """Run the extracted ``bible`` program of bible-kjv on the extracted bible-kjv-text data."""
    root = Path(root)
    program, data_dir = root / "usr/bin/bible", root / "usr/lib"
    if not program.is_file() or not (data_dir / "bible.data").is_file():
        raise CorpusInstallError(f"no usr/bin/bible and usr/lib/bible.data under {root}")
    # -f turns pretty-printing off: one "Ge1:1 text" line a verse; -p: where bible.data is.
    cmd = [str(program), "-f", "-p", str(data_dir), "Gen1:1-Rev22:21"]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    except OSError as exc:
        raise CorpusInstallError(f"cannot run the bible program ({exc.strerror}); is it for this machine?") from exc
    except subprocess.TimeoutExpired as exc:
        raise CorpusInstallError("the bible program did not finish in 300 s") from exc
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = (proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise CorpusInstallError(f"the bible program failed (exit {proc.returncode}): {tail}")
    return kjv_documents_from_listing(proc.stdout.decode("utf-8", "replace"))


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


# --------------------------------------------------------------------------- fetching packages


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise CorpusInstallError(
            f"{cmd[0]} not found: corpora are installed from Debian's package archive "
            "(elsewhere, unpack the .deb yourself and pass --from DIR)"
        ) from exc


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no output"])[-1]


def _apt_download(package: str, dest: Path) -> Path:
    """``apt-get download`` into ``dest`` (works without root); one ``apt-get update`` retry as root."""
    proc = _run(["apt-get", "download", package], cwd=dest)
    if proc.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        _run(["apt-get", "update", "-q"])
        proc = _run(["apt-get", "download", package], cwd=dest)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not debs:
        hint = " (the package lists may be missing: run `apt-get update` as root)" if "locate" in proc.stderr else ""
        raise CorpusInstallError(f"apt-get download {package} failed: {_last_line(proc.stderr)}{hint}")
    return debs[-1]


def _deb_version(deb: Path) -> str:
    proc = _run(["dpkg-deb", "-f", str(deb), "Version"])
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def _extract_deb(deb: Path, root: Path) -> None:
    proc = _run(["dpkg-deb", "-x", str(deb), str(root)])
    if proc.returncode != 0:
        raise CorpusInstallError(f"dpkg-deb -x {deb.name} failed: {_last_line(proc.stderr)}")


def _installed_version(package: str) -> str | None:
    """Version of a system-installed Debian package, or None."""
    if shutil.which("dpkg-query") is None:
        return None
    proc = _run(["dpkg-query", "-W", "-f", "${Status}\t${Version}", package])
    status, _, version = proc.stdout.partition("\t")
    return version if proc.returncode == 0 and status.endswith(" installed") else None


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
                "sha256": _sha256(path),
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
    path = directory / MANIFEST
    if not path.is_file():
        raise _Invalid("missing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Invalid(f"unreadable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
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
        if file.stat().st_size != size or (check_hashes and _sha256(file) != digest):
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
