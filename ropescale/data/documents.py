"""Evaluation text: where ``--data`` comes from, and its tokenization.

``--data`` accepts: the name of an embedded corpus (``austen`` — the default — or ``kjv``, see
:mod:`ropescale.data.corpus`), a text file, a folder of ``.txt`` files, a JSONL/JSON/Parquet file
with a text field (read with the ``datasets`` library from local files; rows with ``messages``
instead are conversations, see :mod:`ropescale.data.chat`), or ``hub:org/name`` for a Hub
dataset where the Hub is reachable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import RopescaleError

TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_documents(
    data: str | os.PathLike | None = None, text_field: str = "text", split: str = "train"
) -> list[tuple[str, str]]:
    """``[(title, text), ...]`` from any ``--data`` value (see the module docstring)."""
    from .corpus import CORPORA, DEFAULT_CORPUS, load_corpus

    source = str(data) if data is not None else DEFAULT_CORPUS
    if source in CORPORA:
        return [(doc.title, doc.text) for doc in load_corpus(source)]
    if source.startswith("hub:"):
        return _from_datasets(source[4:], None, text_field, split)
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise RopescaleError(f"data folder '{source}' has no .txt files")
        return [(p.stem, read_text_file(p)) for p in files]
    if path.is_file():
        if path.suffix in TABLE_SUFFIXES:
            return _from_datasets(TABLE_SUFFIXES[path.suffix], str(path), text_field, split)
        return [(path.stem, read_text_file(path))]
    if os.path.lexists(path):  # a FIFO, socket, device or dangling link: there, but nothing to read text from
        raise RopescaleError(
            f"data '{source}' is not a regular file or folder (a FIFO, socket, device or broken link); "
            "give a text file, a folder of .txt files or a JSONL/Parquet file"
        )
    names = ", ".join(sorted(CORPORA))
    raise RopescaleError(f"data '{source}' not found: not a file, a folder, hub:org/name or a corpus ({names})")


def read_text_file(path: Path) -> str:
    """A data file's text, strictly UTF-8: a binary or otherwise undecodable file is refused, naming
    the file and the byte offset, instead of being scored as replacement characters.

    Raises:
        RopescaleError: ``data file 'F' is not UTF-8 text (byte 0x9c at offset 17); ...``, or a NUL
            byte (UTF-8, but binary: ``data file 'F' holds a NUL byte at offset 0 (a binary file?)``).
    """
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RopescaleError(
            f"data file '{path}' is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "give a text file, a folder of .txt files or a JSONL/Parquet file"
        ) from None
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise RopescaleError(f"data file '{path}' holds a NUL byte at offset {nul} (a binary file?); give a text file")
    return text


def check_text_source(data: str | os.PathLike | None) -> None:
    """Read a local text ``--data`` (a file, or a folder's .txt files) strictly, so that a binary one
    is refused (:func:`read_text_file`) before a caller loads weights; other sources pass."""
    path = Path(str(data)).expanduser() if data is not None else None
    if path is not None and path.is_file() and path.suffix not in TABLE_SUFFIXES:
        read_text_file(path)
    elif path is not None and path.is_dir():
        for file in sorted(p for p in path.rglob("*.txt") if p.is_file()):
            read_text_file(file)


def _from_datasets(name: str, data_files: str | None, text_field: str, split: str) -> list[tuple[str, str]]:
    try:
        import datasets
    except ImportError:
        raise RopescaleError(
            "reading JSONL/Parquet/Hub data needs the datasets package: pip install 'ropescale[eval]'"
        ) from None
    try:
        ds = datasets.load_dataset(name, data_files=data_files, split=split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for missing/offline data
        bad = bad_json_line(Path(data_files)) if data_files and data_files.endswith(".jsonl") else None
        if bad:  # datasets says only "An error occurred while generating the dataset"
            raise RopescaleError(bad) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RopescaleError(f"could not load data '{data_files or name}': {first}") from None
    text, chat = text_field in ds.column_names, "messages" in ds.column_names
    if not (text or chat):
        raise RopescaleError(
            f"data '{data_files or name}' has no field '{text_field}' (fields: {', '.join(ds.column_names)})"
        )
    # Each row is text or a conversation (rendered at tokenization): a file may hold both kinds, and a
    # row of one kind reads None in the other's column, so neither kind may be dropped for it.
    stem, docs = Path(data_files or name).stem, []
    for i, row in enumerate(ds):
        if text and row[text_field]:
            docs.append((f"{stem}[{i}]", row[text_field]))
        elif chat and row["messages"]:
            docs.append((f"{stem}[{i}]", row["messages"]))
    return docs


def bad_json_line(path: Path) -> str | None:
    """The first line of a JSONL file that is not a JSON object, as one error line naming the file and
    the line number; None when every non-blank line is one (or the file cannot be read: datasets says why)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                    return (
                        f"data '{path}' line {number} is not valid JSON ({reason}); each line must be one JSON object"
                    )
                if not isinstance(row, dict):
                    return f"data '{path}' line {number} is not a JSON object ({type(row).__name__}); each line must be one"
    except (OSError, UnicodeDecodeError):
        return None
    return None


def tokenize_documents(
    tokenizer: Any, documents: list[tuple[str, str]], max_tokens: int | None = None, min_tokens: int = 0
) -> list[list[int]]:
    """Token ids of each document without special tokens, longest documents first.

    Args:
        tokenizer: a transformers tokenizer.
        documents: ``[(title, text), ...]``.
        max_tokens: stop once this many tokens are collected (the last document is cut).
        min_tokens: drop documents shorter than this (e.g. the evaluation window).
    """
    from .chat import chat_text

    out: list[list[int]] = []
    total = 0
    for title, text in documents:
        if not isinstance(text, str):  # a conversation (chat JSONL): as its chat template writes it
            text = chat_text(tokenizer, text, title)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < min_tokens:
            continue
        if max_tokens is not None:
            ids = ids[: max(0, max_tokens - total)]
        if ids:
            out.append(ids)
            total += len(ids)
        if max_tokens is not None and total >= max_tokens:
            break
    return out


def tokens_after_sentence(tokenizer: Any, text: str) -> list[int]:
    """Tokens of ``text`` as it reads after a sentence end (". text"), leading space included: a
    byte-level BPE's " The", a SentencePiece "▁The". Where the tokenizer merges across the boundary,
    the tokens of ``text`` alone."""
    head = tokenizer.encode(".", add_special_tokens=False)
    both = tokenizer.encode(". " + text, add_special_tokens=False)
    if both[: len(head)] == head and len(both) > len(head):
        return list(both[len(head) :])
    return list(tokenizer.encode(text, add_special_tokens=False))
