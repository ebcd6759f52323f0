"""Optimizer, scheduler and RNG state in a file that cannot run code when read.

``torch.save`` writes a pickle, and unpickling a file is running its instructions: a run folder from
someone else (its manifest re-hashed, so it looks intact) could execute anything on ``--resume``.
Here a state is split into its tensors, written as a ``.safetensors`` file (raw bytes and a JSON
header), and everything else (step counts, learning rates, betas, the Python RNG's integers), written
as plain JSON in that file's metadata. Reading it back parses JSON and copies bytes, nothing more.

The JSON keeps what JSON alone would lose: tuples (``{"tuple": [...]}``), dicts with non-string keys
such as the optimizer's integer parameter ids (``{"dict": [[k, v], ...]}``), tensors
(``{"tensor": "t3"}``) and NumPy arrays (``{"ndarray": "t4", "dtype": "uint32"}``).

A checkpoint of an earlier ropescale holds ``optimizer.pt``/``scheduler.pt``/``rng-N.pt`` pickles:
:func:`refuse_pickles` stops a resume from it naming the file, and never loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import RopescaleError

FORMAT = "ropescale-state"
VERSION = 1
# Files a checkpoint of ropescale <= 0.x held as pickles (torch.save), and what accelerate's sharded
# FSDP checkpoint (torch.distributed.checkpoint) reads with pickle.load.
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt")
PICKLE_NAMES = (".metadata",)
OPTIMIZER_FILE = "optimizer.safetensors"
SCHEDULER_FILE = "scheduler.safetensors"
# accelerate writes the FSDP optimizer (FULL_STATE_DICT) as optimizer.bin and reads it with
# torch.load(weights_only=True), which admits tensors and plain containers only
FSDP_OPTIMIZER_FILES = ("optimizer.bin",)


def rng_file(rank: int) -> str:
    """The RNG state of one process of a launch."""
    return f"rng-{rank}.safetensors"


class _Encoder:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def _tensor(self, t: torch.Tensor) -> str:
        name = f"t{len(self.tensors)}"
        self.tensors[name] = t.detach().cpu().contiguous().clone()  # no storage shared between entries
        return name

    def encode(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, torch.Tensor):
            return {"tensor": self._tensor(obj)}
        if isinstance(obj, np.ndarray):
            wide = obj.astype(np.int64) if obj.dtype.kind in "iu" else obj  # torch lacks most unsigned types
            return {"ndarray": self._tensor(torch.from_numpy(np.ascontiguousarray(wide))), "dtype": str(obj.dtype)}
        if isinstance(obj, np.generic):
            return self.encode(obj.item())
        if isinstance(obj, tuple):
            return {"tuple": [self.encode(v) for v in obj]}
        if isinstance(obj, list):
            return [self.encode(v) for v in obj]
        if isinstance(obj, dict):
            return {"dict": [[self.encode(k), self.encode(v)] for k, v in obj.items()]}
        raise TypeError(f"cannot store a {type(obj).__name__} in a state file")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "tensor" in obj:
        return tensors[obj["tensor"]]
    if "ndarray" in obj:
        return tensors[obj["ndarray"]].numpy().astype(np.dtype(obj["dtype"]))
    if "tuple" in obj:
        return tuple(_decode(v, tensors) for v in obj["tuple"])
    return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["dict"]}


def save_state(path: str | Path, state: Any) -> None:
    """Write ``state`` (nested dicts, lists, tuples, numbers, strings, tensors, NumPy arrays) to ``path``."""
    from safetensors.torch import save_file

    encoder = _Encoder()
    structure = json.dumps(encoder.encode(state))
    save_file(encoder.tensors, str(path), metadata={"format": FORMAT, "version": str(VERSION), "state": structure})


def load_state(path: str | Path) -> Any:
    """Read what :func:`save_state` wrote; no code in the file runs.

    Raises:
        RopescaleError: the file is not a ropescale state file, is damaged, or was written by a newer
            ropescale (its format version is above this one's), naming the file.
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no iterator)
    except Exception as exc:  # safetensors raises its own SafetensorError on a damaged header
        raise RopescaleError(
            f"state file '{path}' is damaged ({type(exc).__name__}); resume from another checkpoint"
        ) from None
    if meta.get("format") != FORMAT or not str(meta.get("version", "")).isdigit():
        raise RopescaleError(f"state file '{path}' is not a ropescale optimizer/scheduler/RNG state")
    if int(meta["version"]) > VERSION:
        raise RopescaleError(
            f"state file '{path}' was written by a newer ropescale (format {meta['version']}, this one reads "
            f"{VERSION}); resume it with that version"
        )
    try:
        return _decode(json.loads(meta["state"]), tensors)
    except (KeyError, ValueError, TypeError) as exc:
        raise RopescaleError(f"state file '{path}' is damaged ({type(exc).__name__}: {exc})") from None


def pickled_files(checkpoint: Path) -> list[Path]:
    """The files of a checkpoint folder that only a pickle loader reads (see :data:`PICKLE_SUFFIXES`)."""
    return sorted(
        p
        for p in checkpoint.rglob("*")
        if (p.is_file() or p.is_symlink()) and (p.suffix in PICKLE_SUFFIXES or p.name in PICKLE_NAMES)
    )


def refuse_pickles(checkpoint: Path, allowed: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint that holds a pickle (an earlier ropescale's ``optimizer.pt``...): we never load one.

    Args:
        checkpoint: the ``step-N`` folder a run would resume from.
        allowed: file names read by a loader that refuses code (accelerate's FSDP ``optimizer.bin``,
            read with ``torch.load(weights_only=True)``).

    Raises:
        RopescaleError: ``checkpoint file '<file>' is a pickle, which ropescale does not load (loading one
            can run code); start again with --overwrite or resume a checkpoint written by this version``.
    """
    for path in pickled_files(checkpoint):
        if path.name not in allowed:
            raise RopescaleError(
                f"checkpoint file '{path}' is a pickle, which ropescale does not load (loading one can run code); "
                "start again with --overwrite, or resume a checkpoint written by this ropescale version"
            )


def check_fsdp_state_dict_type(plugin: Any) -> None:
    """Refuse, before training, an FSDP setup whose checkpoints could not be resumed here.

    With ``SHARDED_STATE_DICT`` accelerate saves the optimizer through ``torch.distributed.checkpoint``,
    whose ``.metadata`` file is a pickle (read with ``pickle.load``): :func:`refuse_pickles` would stop
    the resume, after the run spent its time. ``FULL_STATE_DICT`` (the shipped configs) writes
    ``optimizer.bin``, read with ``torch.load(weights_only=True)``.

    Raises:
        RopescaleError: naming the setting and the value to use.
    """
    kind = getattr(getattr(plugin, "state_dict_type", None), "name", str(getattr(plugin, "state_dict_type", "")))
    if "SHARDED" in str(kind):
        raise RopescaleError(
            f"fsdp_state_dict_type: {kind} saves the optimizer with a pickled .metadata file, which ropescale "
            "does not load on resume; use fsdp_state_dict_type: FULL_STATE_DICT (configs/accelerate/fsdp.yaml)"
        )
