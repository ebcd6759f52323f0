"""Documents from the unpacked source packages: Gutenberg text cleaning, Austen's novels, the KJV."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from .corpus_types import CorpusInstallError, Document
from .debian import read_lazyload_db

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
