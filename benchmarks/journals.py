"""Commit a measurement's prompt journals between sittings, and put them back: resumed, never restarted.

A retrieval cell (RULER, needles, passkey) keeps each decoded prompt in a journal beside its cell
(``*.partial.jsonl``, :class:`ropescale.evals.tasks.generation.PromptJournal`) until the cell is written.
The journal lives in the run's folder (``runs/``, not committed), and a sitting may end with a fresh
checkout: the run's folder is then gone, and with it up to hours of 32k-token prompts. So:

    python benchmarks/journals.py save runs/battery-x4-32k-yarn evals/in-progress/battery-x4-32k-yarn
    git add evals/in-progress && git commit ...          # as the run goes, and before a sitting ends
    python benchmarks/journals.py restore evals/in-progress/battery-x4-32k-yarn runs/battery-x4-32k-yarn
    ropescale eval ruler ... --output runs/battery-x4-32k-yarn   # the same command: resumes at its journals

A journal names what decoded it (model name and content, scaling, runtime) on its first line; one that
does not match the run resuming it is set aside by the runner, never mixed in. So a fine-tune retrained
in a later sitting resumes its journals only when its weights came out identical
(``cpu_finetune_x2.py`` retrains with the same seed). ``save`` copies the journals of ``RUN/cells`` into
``COMMITTED`` (replacing an older copy) and removes from ``COMMITTED`` the journals whose cell is now
written; ``restore`` copies the committed journals that the run's folder lacks (a journal there is never
overwritten: it holds at least what was committed). Only journals move: complete cells are shipped where
the evidence lives (``evals/measured/...``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: a prompt journal's suffix (a cell's is ``.json``; one set aside under another fingerprint, ``.stale``)
JOURNAL = ".partial.jsonl"


def journals(folder: Path) -> list[Path]:
    """The prompt journals in ``folder`` (not recursive), by name."""
    return sorted(p for p in folder.glob(f"*{JOURNAL}") if p.is_file()) if folder.is_dir() else []


def cell_written(journal_name: str, cells: Path) -> bool:
    """Whether ``cells`` holds the cell a journal was kept for: ``<cell>.partial.jsonl`` (one cell per
    task) or ``<cell>.<task>.partial.jsonl`` (a suite's cell of several tasks) beside ``<cell>.json``."""
    return any(journal_name.startswith(cell.stem + ".") for cell in cells.glob("*.json"))


def copy_changed(files: list[Path], folder: Path) -> list[Path]:
    """Copy ``files`` into ``folder`` where the copy is missing or differs (atomically); the copies written."""
    from ropescale._io import atomic_write_bytes

    written = []
    for src in files:
        dst, data = folder / src.name, src.read_bytes()
        if not dst.is_file() or dst.read_bytes() != data:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dst, data)
            written.append(dst)
    return written


def save(cells: Path, committed: Path) -> tuple[list[Path], list[Path]]:
    """Copy the journals of ``cells`` into ``committed`` where new or changed; remove the committed ones
    whose cell ``cells`` now holds. Returns (written, removed)."""
    written, removed = copy_changed(journals(cells), committed), []
    for dst in journals(committed):
        if not (cells / dst.name).is_file() and cell_written(dst.name, cells):
            dst.unlink()  # this tool wrote it; its cell is written and shipped with the evidence
            removed.append(dst)
    if committed.is_dir() and not any(committed.iterdir()):
        committed.rmdir()
    return written, removed


def restore(committed: Path, cells: Path) -> list[Path]:
    """Copy the committed journals that ``cells`` lacks, and whose cell it does not hold, into it."""
    from ropescale._io import atomic_write_bytes

    copied = []
    for src in journals(committed):
        dst = cells / src.name
        if not dst.exists() and not cell_written(src.name, cells):
            cells.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dst, src.read_bytes())
            copied.append(dst)
    return copied


def cells_of(run: Path) -> Path:
    """A run's cell folder: ``RUN/cells`` (every runner's layout), or ``RUN`` where it is that folder."""
    return run if run.name == "cells" else run / "cells"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    s = sub.add_parser("save", help="the run's journals into the committed folder")
    s.add_argument("run", help="the run's folder (its cells/ holds the journals)")
    s.add_argument("committed", help="a folder in the repository, committed between sittings")
    r = sub.add_parser("restore", help="the committed journals back into the run's folder")
    r.add_argument("committed")
    r.add_argument("run")
    args = ap.parse_args(argv)
    if args.action == "save":
        written, removed = save(cells_of(Path(args.run)), Path(args.committed))
        held = len(journals(Path(args.committed)))
        print(
            f"{args.committed}: {held} journals ({len(written)} written, {len(removed)} removed as their cell is written)"
        )
    else:
        if not Path(args.committed).is_dir():
            print(f"journals.py: {args.committed}: no such folder", file=sys.stderr)
            return 2
        copied = restore(Path(args.committed), cells_of(Path(args.run)))
        print(f"{cells_of(Path(args.run))}: {len(copied)} journals restored from {args.committed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
