"""The one room for pictures: every PNG ropescale writes is drawn and saved here.

matplotlib is imported only inside these functions, through ``matplotlib.figure.Figure`` with
the Agg canvas (no pyplot state, no global backend switch), so the rest of the package stays light
and plotting works in headless processes and threads.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from .._io import atomic_write_bytes
from ..errors import MissingDependencyError


def figure(**kwargs: Any) -> Any:
    """A new ``matplotlib.figure.Figure`` on an Agg canvas (``kwargs`` go to ``Figure``)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingDependencyError("plotting needs matplotlib: pip install 'ropescale[eval]'") from e
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, path: str | os.PathLike, **savefig_kwargs: Any) -> Path:
    """Write ``fig`` at ``path`` atomically (format from the suffix, PNG if none); returns the path.

    The image is rendered in memory and written through a temporary file beside ``path`` that is
    renamed over it, with the usual (umask) permissions; missing parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".").lower() or "png", **savefig_kwargs)
    atomic_write_bytes(path, buf.getvalue())
    return path


def length_label(n: int) -> str:
    """``16384 -> "16k"``; lengths that are not whole multiples of 1024 stay as they are."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


__all__ = ["figure", "length_label", "save_png"]
