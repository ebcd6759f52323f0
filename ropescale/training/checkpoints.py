"""Training checkpoints: what a run may resume from, and the trainable weights under any wrapper.

``checkpoints/step-N/`` holds ``trainable.safetensors`` (LoRA + trainable embeddings/norms, names as
in the unwrapped peft model), the optimizer (``optimizer.safetensors``, or accelerate's FSDP file), the
scheduler, every rank's RNG state (in files that cannot run code: :mod:`.state_files`) and ``state.json`` (step, tokens, elapsed, the recipe's
fingerprint). A checkpoint is staged in a hidden folder and renamed when complete; ``manifest.json``
(size and sha256 of every other file) is written last, atomically, once every rank has written.
``--resume`` verifies the newest checkpoint against its manifest and falls back to the newest
complete one, saying which it skipped and why (:func:`newest_complete`): a disk that filled up or a
copy cut short shows as a file whose size or checksum differs, named, instead of a loader's error.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn

from .._io import (
    atomic_directory,
    atomic_write_json,
    atomic_write_text,
    remove_path,
    sha256_file,
)
from .._lock import refuse_overwriting_inputs
from ..errors import RopescaleError
from .config import TrainConfig, dump_config

CHECKPOINTS = "checkpoints"
TRAINABLE_FILE = "trainable.safetensors"
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# Sections a resumed run must share with the checkpoint (eval/log/save cadence, the memory options
# and train.max_steps may change: the schedule is a function of max_steps, see optim.py).
FINGERPRINT_SECTIONS = ("model", "scaling", "lora", "data", "pose", "s2attn", "optim")
FINGERPRINT_TRAIN_KEYS = ("batch_size", "grad_accum", "seed", "mixed_precision")
# What wrappers insert into parameter names: FSDP1 units, activation-checkpoint wrappers, torch.compile.
WRAPPER_TOKENS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


class RunIdentity(TypedDict):
    """Content fingerprints of what a run reads (None: handed to the trainer in memory, or not recorded)."""

    model: str | None
    data: str | None


class _CudaRngState(TypedDict, total=False):
    cuda: list[torch.Tensor]  # one state per GPU, where there are GPUs


class RngState(_CudaRngState):
    """Every random generator a step draws from, for an exact resume."""

    python: tuple
    numpy: tuple
    torch: torch.Tensor


@dataclass(frozen=True)
class CheckpointState:
    """What a checkpoint's ``state.json`` says, read once where the file is read (:meth:`read`)."""

    path: Path  # the checkpoint folder
    step: int
    tokens: int  # seen so far, over every process
    elapsed: float  # seconds of training steps so far
    fingerprint: dict[str, Any]  # the recipe's sections a resume must share, as JSON (:func:`fingerprint`)
    identity: RunIdentity

    @classmethod
    def read(cls, path: Path) -> CheckpointState:
        """``path/state.json``; a checkpoint written before fingerprints or identities has none (empty)."""
        raw = json.loads((path / "state.json").read_text())
        identity = raw.get("identity") or {}
        return cls(
            path,
            raw["step"],
            raw["tokens"],
            raw["elapsed"],
            raw.get("fingerprint") or {},
            RunIdentity(model=identity.get("model"), data=identity.get("data")),
        )


def fingerprint(config: TrainConfig) -> dict[str, Any]:
    """What a checkpoint's recipe must share with the run that resumes it."""
    d = config.to_dict()
    return {**{s: d[s] for s in FINGERPRINT_SECTIONS}, "train": {k: d["train"][k] for k in FINGERPRINT_TRAIN_KEYS}}


def recipe_difference(run_dir: str | Path, recipe: str | Path, overrides: list[str]) -> str | None:
    """Whether the run in ``run_dir`` (its ``config.yaml``) trained what ``recipe`` with ``overrides`` would:
    None, or its first difference (``key: was -> asked``). Compared: what a resume must share, and
    ``train.max_steps`` (a finished run of other steps is another model). A precision left ``auto`` is
    not compared (each machine resolves it); one the recipe or overrides set is.

    Raises:
        RopescaleError: the recipe refuses the overrides, or ``run_dir`` holds no readable run config.
    """
    from .._yaml import safe_load
    from .config import apply_overrides, load_config, load_run_config, resolve_recipe
    from .precision import AUTO

    asked, was = load_config(recipe, overrides), load_run_config(run_dir)
    path = resolve_recipe(recipe)
    raw = apply_overrides(safe_load(path.read_text(), str(path)) or {}, overrides)
    auto = {
        (s, k) for s, k in (("train", "mixed_precision"), ("model", "dtype")) if (raw.get(s) or {}).get(k, AUTO) == AUTO
    }

    def content(config: TrainConfig) -> dict[str, Any]:
        fp = {**fingerprint(config)}
        fp["train"] = {**fp["train"], "max_steps": config.train.max_steps}
        for section, key in auto:
            fp[section] = {k: v for k, v in fp[section].items() if k != key}
        return fp

    return None if content(was) == content(asked) else first_difference(content(was), content(asked))


def first_difference(a: Any, b: Any, prefix: str = "") -> str:
    """``key: old -> new`` for the first key (sorted, depth first) where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
    return f"{prefix.rstrip('.')}: {a!r} -> {b!r}"


def run_identity(config: TrainConfig, model: bool = True, data: bool = True) -> RunIdentity:
    """The content fingerprints of the recipe's model and local data (a path names a file, not its
    content: weights or text changed in place would otherwise resume silently). ``model``/``data``:
    False where the trainer was handed them in memory."""
    from ..models.identity import model_identity

    return RunIdentity(
        model=model_identity(config.model.name)["fingerprint"] if model else None,
        data=_data_fingerprint(config) if data else None,
    )


def _data_fingerprint(config: TrainConfig) -> str | None:
    """One fingerprint for the recipe's text: its source's, or for a mix one over every source's, in order."""
    import hashlib

    from ..data.sources import local_sources
    from ..models.identity import data_identity

    prints = [data_identity(s).get("fingerprint") for s in local_sources(config.data)]
    if len(prints) == 1:
        return prints[0]
    return hashlib.sha256(json.dumps(prints).encode()).hexdigest() if any(prints) else None


def check_resumable(state: CheckpointState, config: TrainConfig, identity: RunIdentity | None = None) -> None:
    """Refuse to resume the checkpoint ``state`` was read from under a recipe that changes what was trained.

    Raises:
        RopescaleError: the fingerprint differs (first difference named), the model's weights or the
            data's text changed since (``identity``, where the checkpoint recorded it), or the
            checkpoint is already past ``train.max_steps``.
    """
    path = state.path
    for key, where in (("model", config.model.name), ("data", config.data.source)):
        old, new = state.identity[key], identity[key] if identity is not None else None
        if old and new and old != new:
            raise RopescaleError(
                f"checkpoint {path} was trained on other {key} content: '{where}' changed since (fingerprint "
                f"{old[:12]}, now {new[:12]}); use another train.output_dir, or --overwrite to start again"
            )
    saved = state.fingerprint
    saved = {**saved, "train": {k: v for k, v in (saved.get("train") or {}).items() if k != "max_steps"}}
    if saved != fingerprint(config):
        raise RopescaleError(
            f"checkpoint {path} was made with a different recipe ("
            f"{first_difference(saved, fingerprint(config))}); use another train.output_dir or the original settings"
        )
    if state.step > config.train.max_steps:
        raise RopescaleError(
            f"checkpoint {path} is at step {state.step}, past train.max_steps={config.train.max_steps}; "
            "raise train.max_steps to train longer"
        )


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (partial ones are hidden dot-folders)."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def write_manifest(directory: Path) -> None:
    """Record the size and sha256 of every file of a staged checkpoint in ``manifest.json`` (last)."""
    files = {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    atomic_write_json(directory / MANIFEST, {"format": MANIFEST_FORMAT, "files": files})


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with a checkpoint folder (``<file> is N bytes, its manifest says M``...), or None.

    A checkpoint written before manifests existed is judged by its ``state.json`` alone.
    """
    import json

    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
            version = data.get("format", MANIFEST_FORMAT)
            files = data["files"]
            entries = [(str(name), int(e["size"]), str(e["sha256"])) for name, e in files.items()]
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{MANIFEST} is damaged"
        if isinstance(version, int) and version > MANIFEST_FORMAT:  # never resumed over, nor skipped and rewritten
            raise RopescaleError(
                f"checkpoint '{manifest}' was written by a newer ropescale (format {version}, this one reads "
                f"{MANIFEST_FORMAT}); it is not replaced: use that version or another train.output_dir"
            )
        for name, size, digest in entries:
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if file.stat().st_size != size:
                return f"{name} is {file.stat().st_size} bytes, its manifest says {size}"
            if sha256_file(file) != digest:
                return f"{name} does not match the sha256 in its manifest"
    elif (path / TRAINABLE_FILE).is_file():
        return None if _state_readable(path) else "state.json is missing or not valid JSON (no manifest)"
    else:
        return f"{MANIFEST} is missing (the checkpoint was not finished)"
    return None if _state_readable(path) else "state.json is not valid JSON"


def _state_readable(path: Path) -> bool:
    import json

    try:
        return isinstance(json.loads((path / "state.json").read_text()), dict)
    except (OSError, ValueError):
        return False


def newest_complete(output_dir: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(the newest checkpoint that passes :func:`checkpoint_problem`, the newer ones skipped with why).

    Every ``step-N`` folder counts, a checkpoint without ``state.json`` included.
    """
    root = Path(output_dir) / CHECKPOINTS
    folders = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")] if root.is_dir() else []
    skipped = []
    for path in sorted(folders, key=lambda p: int(p.name.split("-")[1]), reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def resume_point(
    output_dir: str | Path, announce: bool = True, remedy: str = "start again with --overwrite"
) -> Path | None:
    """The checkpoint ``--resume`` continues from (None: nothing to resume), saying on stderr which
    newer ones were skipped and why.

    Raises:
        RopescaleError: checkpoints exist but none is complete, naming the newest and its bad file.
    """
    import sys

    found, skipped = newest_complete(output_dir)
    if found is None and skipped:
        path, problem = skipped[0]
        raise RopescaleError(
            f"no complete checkpoint to resume in {Path(output_dir) / CHECKPOINTS}: {path / problem.split()[0]} "
            f"({problem}){' and ' + str(len(skipped) - 1) + ' older damaged' if len(skipped) > 1 else ''}; "
            f"{remedy}"
        )
    if skipped and announce:
        what = "; ".join(f"{p.name}: {problem}" for p, problem in skipped)
        print(f"ropescale: resuming from {found.name}, skipped {what}", file=sys.stderr)
    return found


def rng_state() -> RngState:
    """Python, NumPy, torch (and CUDA) RNG states of this process."""
    state = RngState(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: RngState) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def unwrapped_name(name: str) -> str:
    """A parameter name without what DDP/FSDP/checkpoint wrappers/torch.compile insert into it."""
    for token in WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


def select_trainable(
    state_dict: dict[str, torch.Tensor], names: list[str], prefix: str = ""
) -> dict[str, torch.Tensor]:
    """The entries of a (gathered) state dict that are trainable parameters, keyed by their names in
    the unwrapped peft model.

    Args:
        state_dict: the full model state dict (keys may carry wrapper prefixes).
        names: trainable parameter names taken from the peft model before it was wrapped.
        prefix: what the wrapped module puts before the peft model's names (``model.`` for
            :class:`~ropescale.training.modeling.CausalLMLoss`).

    Raises:
        RopescaleError: a trainable parameter is not in the state dict (a checkpoint without it
            would silently resume or export that weight from its initial value).
    """
    wanted = {prefix + n: n for n in names}
    found = {wanted[unwrapped_name(k)]: v for k, v in state_dict.items() if unwrapped_name(k) in wanted}
    missing = sorted(set(names) - set(found))
    if missing:
        raise RopescaleError(f"{len(missing)} trainable parameters missing from the gathered weights ({missing[0]})")
    return found


def gather_trainable(
    accelerator: Any, module: nn.Module, names: list[str], fsdp_version: int | None
) -> dict[str, torch.Tensor]:
    """The full trainable weights of a (possibly sharded) module, on the main process.

    Every rank must call it. FSDP2: each trainable DTensor is gathered on its own (the frozen base
    weights are never gathered); FSDP1: accelerate's full state dict, keys unwrapped; otherwise the
    parameters themselves.

    Returns:
        ``{name in the peft model: tensor}`` on the main process (possibly empty elsewhere).
    """
    if fsdp_version == 2:
        from torch.distributed.tensor import DTensor

        state = {}
        for name, p in module.named_parameters():
            if p.requires_grad:
                full = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
                state[name] = full.cpu()
        state = select_trainable(state, names, prefix="model.")
    elif fsdp_version == 1:
        full = accelerator.get_state_dict(module)
        state = select_trainable(full, names, prefix="model.") if accelerator.is_main_process else {}
    else:
        params = dict(accelerator.unwrap_model(module).named_parameters())  # DDP: without its `module.`
        state = {k: v.detach() for k, v in select_trainable(params, names, prefix="model.").items()}
    return state if accelerator.is_main_process else {}


RUN_ENTRIES = (CHECKPOINTS, "metrics.jsonl", "adapter", "merged")  # what --overwrite clears in a run folder


def prepare_output_dir(out: Path, resume: bool, overwrite: bool, inputs: dict[str, str] | None = None) -> None:
    """Create the output folder; refuse to start over existing checkpoints unless ``overwrite``
    (which removes the earlier run's checkpoints, metrics, adapter and merged model).

    Before anything is removed, each entry is checked against ``inputs`` (the recipe's model and
    data: a model trained from this run's ``merged/`` is not deleted under it). A symlinked entry is
    unlinked itself, never followed (:func:`~ropescale._io.remove_path`): what it points at stays.
    """
    if list_checkpoints(out) and not resume:
        if not overwrite:
            raise RopescaleError(
                f"output directory '{out}' already holds checkpoints: pass --resume to continue "
                "or --overwrite to start again"
            )
        for name in RUN_ENTRIES:  # every check first: nothing is removed when one refuses
            refuse_overwriting_inputs(out / name, inputs or {}, flag="run folder entry")
        for name in RUN_ENTRIES:
            remove_path(out / name)
    out.mkdir(parents=True, exist_ok=True)
    remove_staging(out)


@contextlib.contextmanager
def left_as_found(out: Path, enabled: bool = True) -> Iterator[None]:
    """Around a run's setup: if it is refused (raises), remove what it created in ``out`` — the
    folder itself when it did not exist, else the top-level entries that are new (``data/``...).
    ``enabled``: only the main process of a launch cleans up."""
    before = {p.name for p in out.iterdir()} if out.is_dir() else None
    try:
        yield
    except BaseException:
        if enabled and before is None:
            shutil.rmtree(out, ignore_errors=True)
        elif enabled and out.is_dir():
            for path in out.iterdir():
                if path.name not in before:
                    with contextlib.suppress(OSError):
                        remove_path(path)
        raise


def remove_staging(out: Path) -> None:
    """Remove the staging folders (``checkpoints/.step-N.partial``) of a writer that was stopped, naming
    each on stderr (the caller holds the run folder's lock: nobody else writes them)."""
    import sys

    root = out / CHECKPOINTS
    for path in sorted(root.glob(".step-*.partial")) if root.is_dir() else []:
        print(f"ropescale: removing {path}, left by a training run that was stopped", file=sys.stderr)
        with contextlib.suppress(OSError):
            remove_path(path)


def write_adapter(peft_model: nn.Module, config: TrainConfig, out: Path) -> None:
    """``out``: the LoRA adapter (peft format), the other trainable weights and the recipe, atomically."""
    from safetensors.torch import save_file

    with atomic_directory(out, overwrite=True) as tmp:
        peft_model.save_pretrained(tmp)
        extra = {
            n: p.detach().contiguous().cpu()
            for n, p in peft_model.named_parameters()
            if p.requires_grad and "lora_" not in n
        }
        if extra:
            save_file(extra, tmp / "trainable_params.safetensors")
        atomic_write_text(tmp / "ropescale_train.yaml", dump_config(config))
