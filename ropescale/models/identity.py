"""What a model is, for results that must know which model made them.

A resumable evaluation cell records :func:`model_identity` of the model it measured; a run on
another model (a folder of other weights, the same folder with new weights, another GGUF) then sees the
difference instead of reporting the old numbers under the new name, while the same files under another
path are the same model (runs compare the fingerprint, the name being incidental:
``ropescale.evals.tasks.run_folder.by_content``). The fingerprint covers
``config.json`` and every weight file (:func:`ropescale._io.content_fingerprint`: sizes and sampled
content, milliseconds even for large checkpoints); a Hub id, which is not read here, is its own identity.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TypedDict

from .._io import content_fingerprint

_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def files_fingerprint(files: list[Path], root: Path | None = None) -> str:
    """One sha256 over the names (relative to ``root``) and content fingerprints of ``files``."""
    h = hashlib.sha256()
    for path in sorted(files):
        name = str(path.relative_to(root)) if root is not None else path.name
        h.update(f"{name}\0{content_fingerprint(path)}\n".encode())
    return h.hexdigest()


class Identity(TypedDict, total=False):
    """What a run records of an input: its name as given and, where it can be read, a fingerprint."""

    name: str | None
    fingerprint: str


def model_identity(name_or_path: str | os.PathLike) -> Identity:
    """``{"name": as given, "fingerprint": sha256 or "hub:<id>"}`` of a ``--model`` value.

    A directory: ``config.json`` and its weight files; a ``.gguf`` file: the file; an embedded
    model: its converted directory; a Hub id: the id (nothing is downloaded).
    """
    from .loading import resolve_model

    resolved = resolve_model(name_or_path)
    path = Path(resolved.path)
    if "gguf_file" in resolved.kwargs:
        files = [path / resolved.kwargs["gguf_file"]]
    elif path.is_dir():
        files = [path / "config.json", *(p for pattern in _WEIGHTS for p in path.glob(pattern))]
    else:
        return {"name": str(name_or_path), "fingerprint": f"hub:{resolved.path}"}
    return {"name": str(name_or_path), "fingerprint": files_fingerprint([p for p in files if p.is_file()], path)}


def data_identity(data: str | None) -> Identity:
    """``{"name": the --data value, "fingerprint": ...}``: a local file or folder by content (every
    file in it), a corpus name or ``hub:`` id by name."""
    if data is None:
        return {"name": None}
    path = Path(str(data)).expanduser()
    if path.is_file():
        return {"name": str(data), "fingerprint": files_fingerprint([path], path.parent)}
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")]
        return {"name": str(data), "fingerprint": files_fingerprint(files, path)}
    return {"name": str(data)}


__all__ = ["data_identity", "files_fingerprint", "model_identity"]
