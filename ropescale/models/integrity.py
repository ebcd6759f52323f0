"""Checking model files before a library reads them, so damage is one line that names the file.

A truncated ``model.safetensors`` otherwise surfaces as safetensors' ``SafetensorError: Error while
deserializing header: incomplete metadata``, a truncated ``.gguf`` as a numpy reshape error, a
broken ``config.json`` as a bare ``JSONDecodeError`` — none says which file. The checks here read
headers only (a few KB per file), so they run on every load.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import RopescaleError

_REMEDY = "re-download or re-save the checkpoint"


class DamagedFileError(RopescaleError):
    """A model file is truncated or not in its format."""


def read_json_file(path: str | Path, what: str = "file", remedy: str = _REMEDY) -> dict[str, Any]:
    """A JSON object from ``path`` (``remedy``: what the message tells the user to do).

    Raises:
        DamagedFileError: the file is not JSON, or not a JSON object, naming the file and the position.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DamagedFileError(f"{what} '{path}' is not UTF-8 text (damaged?); {remedy}") from None
    except json.JSONDecodeError as exc:
        raise DamagedFileError(
            f"{what} '{path}' is not valid JSON ({exc.msg.removesuffix(' at')} at line {exc.lineno} column "
            f"{exc.colno}); {remedy}"
        ) from None
    if not isinstance(data, dict):
        raise DamagedFileError(f"{what} '{path}' holds a JSON {type(data).__name__}, not an object; {remedy}")
    return data


def check_safetensors(path: str | Path) -> None:
    """Check that a ``.safetensors`` file is complete: its header parses and its data fills the file.

    The format: an 8-byte little-endian header length N, N bytes of JSON (tensor name → dtype,
    shape, ``data_offsets`` [begin, end] into the data), then the data, which must end the file.

    Raises:
        DamagedFileError: naming the file, with the size it has and the size its header describes.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DamagedFileError(f"model file '{path}' is truncated ({size} bytes, no safetensors header); {_REMEDY}")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise DamagedFileError(
                f"model file '{path}' is truncated ({size} bytes; its header alone is {n + 8}); {_REMEDY}"
            )
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
            problem = _tensor_problem(header)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise DamagedFileError(f"model file '{path}' has a damaged safetensors header; {_REMEDY}") from None
    if problem:  # safetensors would say only "invalid shape, data type, or offset for tensor", no file
        raise DamagedFileError(f"model file '{path}' has a damaged safetensors header: {problem}; {_REMEDY}")
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        state = "truncated" if size < expected else "damaged"
        raise DamagedFileError(
            f"model file '{path}' is {state} ({size} bytes, its header describes {expected}); {_REMEDY}"
        )


#: bytes per element of the safetensors dtypes (sub-byte ones, F4 / F6, are not checked)
_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}  # fmt: skip


def _tensor_problem(header: dict) -> str | None:
    """What the safetensors reader would refuse in ``header``: a tensor whose shape and dtype do not
    fill its ``data_offsets``, or offsets that leave a gap or overlap (the data must be contiguous)."""
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = (int(v) for v in entry["data_offsets"])
        size = _DTYPE_BYTES.get(str(entry["dtype"]))
        if size is not None:
            count = 1
            for d in entry["shape"]:
                count *= int(d)
            if count * size != end - begin:
                return (
                    f"tensor '{name}' is {entry['dtype']} {list(entry['shape'])} ({count * size} bytes) but its "
                    f"data_offsets [{begin}, {end}] hold {end - begin}"
                )
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at or end < begin:
            return f"tensor '{name}' has data_offsets [{begin}, {end}], but the data before it ends at {at}"
        at = end
    return None


def check_checkpoint_dir(directory: str | Path) -> None:
    """``config.json`` parses and every ``*.safetensors`` (and each shard an index names) is complete."""
    directory = Path(directory)
    read_json_file(directory / "config.json", "config")
    index = directory / "model.safetensors.index.json"
    shards: set[str] = set()
    if index.is_file():
        weight_map = read_json_file(index, "weight index").get("weight_map") or {}
        shards = {str(name) for name in weight_map.values()} if isinstance(weight_map, dict) else set()
        for name in sorted(shards):
            if not (directory / name).is_file():
                raise DamagedFileError(f"model file '{directory / name}' named by '{index}' is missing; {_REMEDY}")
    for path in sorted(directory.glob("*.safetensors")):
        check_safetensors(path)


# Weight files only a pickle loader reads: transformers' ``pytorch_model.bin`` (and shards), ``*.pt``...
PICKLED_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_weights_format(directory: str | Path) -> None:
    """Refuse a checkpoint folder whose weights exist only as pickles (``pytorch_model.bin``...).

    Unpickling runs whatever instructions the file holds; ropescale loads weights from ``.safetensors``
    only (raw tensors and a JSON header), so a folder from someone else cannot run code here. A folder
    with no weight file at all (a config-only checkpoint) is left to the loader's own message.

    Raises:
        RopescaleError: naming the pickled file.
    """
    directory = Path(directory)
    if any(directory.glob("*.safetensors")):
        return
    pickles = sorted(p for pattern in PICKLED_WEIGHTS for p in directory.glob(pattern))
    if pickles:
        raise RopescaleError(
            f"model file '{pickles[0]}' is a pickle, which ropescale does not load (loading one can run code); "
            "ropescale loads weights only from .safetensors files: use a safetensors copy of the checkpoint"
        )


def check_gguf(path: str | Path) -> None:
    """Check that a ``.gguf`` file parses to its end (metadata and every tensor's data).

    Raises:
        DamagedFileError: naming the file (cached per path, size and modification time).
    """
    path = Path(path)
    stat = path.stat()
    problem = _gguf_problem(str(path), stat.st_size, stat.st_mtime_ns)
    if problem:
        raise DamagedFileError(f"GGUF file '{path}' is truncated or damaged ({problem}); {_REMEDY}")


@lru_cache(maxsize=8)
def _gguf_problem(path: str, size: int, mtime_ns: int) -> str | None:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # noqa: BLE001 - whatever the reader trips on, the file is the cause
        return " ".join(str(exc).split())[:120] or type(exc).__name__
    return f"{size} bytes, its tensors end at {end}" if end > size else None


__all__ = ["DamagedFileError", "check_checkpoint_dir", "check_gguf", "check_safetensors", "read_json_file"]
