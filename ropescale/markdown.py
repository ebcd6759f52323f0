"""Markdown tables, the one way every report, plan and benchmark prints one.

``tabulate``'s ``pipe`` format: GitHub-flavoured pipe tables with each column padded to its widest
cell, so a table reads as a table on a terminal too, and with ``:--``/``--:`` markers for alignment.
Cells are shown as given: number parsing is off, so ``1.000`` stays ``1.000`` and ``10`` keeps its
place in a left-aligned column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

_ALIGN = {"l": "left", "r": "right", "c": "center"}


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: str | None = None) -> str:
    """A markdown pipe table (no trailing newline).

    Args:
        headers: the column titles.
        rows: the cells, one sequence per row (None is an empty cell; a row may be shorter).
        align: one letter per column, ``l``/``r``/``c`` (left, right, centre); all left when None.

    Example:
        ``table(["length", "fits"], [[4096, "yes"]], align="rl")`` is
        ``"|   length | fits   |\\n|---------:|:-------|\\n|     4096 | yes    |"``.
    """
    from tabulate import tabulate

    if align is not None and len(align) != len(headers):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(headers)} columns")
    colalign = tuple(_ALIGN[a] for a in (align or "l" * len(headers)))
    width = len(headers)
    return tabulate(
        [[*r, *[None] * (width - len(r))] for r in rows],  # tabulate drops columns a short row lacks
        headers=list(headers),
        tablefmt="pipe",
        colalign=colalign,
        disable_numparse=True,
        missingval="",
    )


__all__ = ["table"]
