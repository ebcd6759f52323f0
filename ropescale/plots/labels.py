"""Labels beside points that do not cover each other, placed with the renderer's own text sizes.

A fixed offset (say 6 points right, 5 up) is fine until two points sit close: then their labels
print over each other, or over a neighbour's marker or error bar. Here each label tries a short list
of offsets around its point and keeps the first whose box, as the Agg renderer measures it, stays
inside the axes and clear of the labels placed before it, of every point's marker and of the
artists named in ``avoid``. Where no offset is clear it keeps the one that covers least, so a label
is never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: (dx, dy) in points, horizontal and vertical alignment: beside the point first, then farther away
_NEAR = [
    ((6, 3), "left", "bottom"),
    ((6, -3), "left", "top"),
    ((-6, 3), "right", "bottom"),
    ((-6, -3), "right", "top"),
    ((7, 0), "left", "center"),
    ((-7, 0), "right", "center"),
    ((0, 7), "center", "bottom"),
    ((0, -7), "center", "top"),
]
_FAR = [
    ((dx, dy), "left" if dx > 0 else "right", "bottom" if dy > 0 else "top")
    for step in (13, 21, 29, 37)
    for dy in (step, -step)
    for dx in (8, -8)
]
CANDIDATES = _NEAR + _FAR


def _overlap(a: Any, b: Any) -> float:
    """Area (pixels²) shared by two display-space Bboxes."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _outside(box: Any, frame: Any) -> float:
    """Area (pixels²) of ``box`` outside ``frame``."""
    return box.width * box.height - _overlap(box, frame)


def _extent(artist: Any, renderer: Any) -> Any:
    """An artist's box in pixels; a line collection's (error bars) from its segments, since its own
    ``get_window_extent`` may come back empty (infinite) for collections drawn in data space."""
    from matplotlib.transforms import Bbox

    if hasattr(artist, "get_segments") and artist.get_segments():
        xy = [artist.get_transform().transform(seg) for seg in artist.get_segments()]
        return Bbox.union([Bbox.from_extents(*p.min(axis=0), *p.max(axis=0)).padded(1) for p in xy])
    return artist.get_window_extent(renderer)


def _leader(mark: Any, box: Any, ha: str, va: str) -> list[tuple[float, float]]:
    """Points along the leader from the text's corner nearest its point to the point (display space)."""
    x1 = box.x0 if ha == "left" else box.x1
    y1 = box.y0 if va == "bottom" else box.y1
    x0, y0 = mark
    return [(x0 + (x1 - x0) * t / 10, y0 + (y1 - y0) * t / 10) for t in range(2, 11)]


def place_labels(
    ax: Any,
    points: Sequence[tuple[float, float]],
    texts: Sequence[str],
    *,
    fontsize: float = 8,
    avoid: Iterable[Any] = (),
    **text_kwargs: Any,
) -> list[Any]:
    """Annotate each data point ``(x, y)`` with its text where it covers nothing (see the module).

    Call after the axes' scales and limits are final: positions are measured on a drawn canvas.

    Args:
        ax: the axes (of a figure from :func:`ropescale.plots.figure`).
        points: data coordinates, one per text.
        texts: the labels.
        fontsize: text size in points.
        avoid: artists (error bars, say) the labels should not cover, besides the points' markers.
        text_kwargs: passed to ``ax.annotate`` (``color``, say).

    Returns:
        The annotations, in the order of ``points``.
    """
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()  # final limits and layout: the transforms below are the ones saved
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    r = 4.0 * fig.dpi / 72  # about a default marker's half width, in pixels
    marks = [ax.transData.transform(p) for p in points]
    taken = [Bbox.from_extents(x - r, y - r, x + r, y + r) for x, y in marks]
    soft = [_extent(a, renderer) for a in avoid]
    placed = []
    for i, (point, text) in enumerate(zip(points, texts, strict=True)):
        ann = ax.annotate(text, point, xytext=(0, 0), textcoords="offset points", fontsize=fontsize, **text_kwargs)
        others = taken[:i] + taken[i + 1 :]  # its own marker is where a leader starts
        best = None
        for offset, ha, va in CANDIDATES:
            ann.xyann = offset
            ann.set_horizontalalignment(ha)
            ann.set_verticalalignment(va)
            box = ann.get_window_extent(renderer).padded(1)
            far = abs(offset[1]) > 10
            trail = _leader(marks[i], box, ha, va) if far else []
            cost = sum(a + 200 for a in (_overlap(box, t) for t in taken) if a) + 4 * _outside(box, frame)
            cost += sum(a + 30 for a in (_overlap(box, t) for t in soft) if a)
            cost += sum(20.0 for p in trail for t in others if t.contains(*p))  # a leader across a label
            if best is None or cost < best[0]:
                best = (cost, offset, ha, va, box, trail)
            if cost == 0:
                break
        _, offset, ha, va, box, trail = best
        ann.remove()  # drawn again at its place, with a thin leader when it stands away from its point
        leader = None
        if trail:
            corner = (0.0 if ha == "left" else 1.0, 0.0 if va == "bottom" else 1.0)
            leader = {"arrowstyle": "-", "lw": 0.5, "color": "0.5", "shrinkA": 0, "shrinkB": 3, "relpos": corner}
        ann = ax.annotate(
            text, point, xytext=offset, textcoords="offset points", fontsize=fontsize, ha=ha, va=va,
            arrowprops=leader, **text_kwargs,
        )  # fmt: skip
        taken.append(box)
        taken += [Bbox.from_extents(x - 1, y - 1, x + 1, y + 1) for x, y in trail]  # no later label on a leader
        placed.append(ann)
    return placed


__all__ = ["CANDIDATES", "place_labels"]
