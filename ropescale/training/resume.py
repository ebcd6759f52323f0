"""A run's checkpoints from the trainer's side: each step written atomically, read back on resume.

:class:`Checkpointing` is the part of :class:`~ropescale.training.trainer.Trainer` that writes
``checkpoints/step-N`` (staged in a hidden folder and renamed when complete, so a run killed mid-write
leaves the previous checkpoint whole), the final ``adapter/``, and on ``--resume`` restores the
trainable weights, optimizer, scheduler, RNG and step counters, trimming metric lines of lost steps.
What a checkpoint holds and how it is checked (fingerprints, manifests, the state files) is in
:mod:`.checkpoints` and :mod:`.state_files`; this module is the order in which a run uses them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text, remove_path
from .checkpoints import (
    CHECKPOINTS,
    TRAINABLE_FILE,
    CheckpointState,
    RunIdentity,
    check_resumable,
    fingerprint,
    gather_trainable,
    list_checkpoints,
    resume_point,
    rng_state,
    set_rng_state,
    write_adapter,
    write_manifest,
)
from .config import TrainConfig
from .modeling import load_trainable
from .optim import sync_lr
from .state_files import OPTIMIZER_FILE, SCHEDULER_FILE, load_state, rng_file, save_state


class Checkpointing:
    """Saving and restoring a run; mixed into :class:`~ropescale.training.trainer.Trainer`, whose
    ``setup`` builds the attributes below."""

    config: TrainConfig
    output_dir: Path
    accelerator: Any
    peft_model: Any
    module: Any
    optimizer: Any
    scheduler: Any
    identity: RunIdentity
    trainable_names: list[str]
    fsdp_version: int | None
    step: int
    tokens_seen: int
    elapsed: float

    def _restore_weights(self) -> CheckpointState | None:
        """Load the newest checkpoint's trainable weights before wrapping; returns its state."""
        path = resume_point(self.output_dir, announce=self.accelerator.is_main_process)
        if path is None:
            return None  # --resume on a fresh directory starts from scratch
        state = CheckpointState.read(path)
        check_resumable(state, self.config, self.identity)
        from safetensors.torch import load_file

        load_trainable(self.peft_model, load_file(path / TRAINABLE_FILE))
        return state

    def _restore_training_state(self, state: CheckpointState) -> None:
        path, acc = state.path, self.accelerator
        if self._fsdp():
            from accelerate.utils import load_fsdp_optimizer

            load_fsdp_optimizer(acc.state.fsdp_plugin, acc, self.optimizer.optimizer, self.module, str(path), 0)
        else:
            self.optimizer.optimizer.load_state_dict(load_state(path / OPTIMIZER_FILE))
        self.scheduler.load_state_dict(load_state(path / SCHEDULER_FILE))
        sync_lr(self.scheduler)  # a larger train.max_steps recomputes the decay from here on
        rng = path / rng_file(acc.process_index)
        if rng.is_file():
            set_rng_state(load_state(rng))
        self.step, self.tokens_seen, self.elapsed = state.step, state.tokens, state.elapsed
        if acc.is_main_process:
            self._trim_metrics(self.step)

    def _fsdp(self) -> bool:
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type == DistributedType.FSDP

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-N`` atomically: staged in a hidden folder, renamed when complete."""
        from safetensors.torch import save_file

        acc, root = self.accelerator, self.output_dir / CHECKPOINTS
        final = root / f"step-{self.step:08d}"
        staging = root / f".step-{self.step:08d}.partial"
        if acc.is_main_process:
            remove_path(staging)
            staging.mkdir(parents=True)
        acc.wait_for_everyone()
        # every rank takes part in gathering; under FSDP the names are matched unwrapped
        weights = gather_trainable(acc, self.module, self.trainable_names, self.fsdp_version)
        if self._fsdp():
            from accelerate.utils import save_fsdp_optimizer

            save_fsdp_optimizer(acc.state.fsdp_plugin, acc, self.optimizer.optimizer, self.module, str(staging), 0)
        save_state(staging / rng_file(acc.process_index), rng_state())
        if acc.is_main_process:
            save_file({k: v.contiguous().cpu() for k, v in weights.items()}, staging / TRAINABLE_FILE)
            if not self._fsdp():
                save_state(staging / OPTIMIZER_FILE, self.optimizer.optimizer.state_dict())
            save_state(staging / SCHEDULER_FILE, self.scheduler.state_dict())
            atomic_write_json(
                staging / "state.json",
                {
                    "step": self.step,
                    "tokens": self.tokens_seen,
                    "elapsed": self.elapsed,
                    "world_size": acc.num_processes,
                    "fingerprint": fingerprint(self.config),
                    "identity": self.identity,
                },
            )
        acc.wait_for_everyone()
        if acc.is_main_process:
            write_manifest(staging)  # last: sizes and sha256 of what every rank wrote
            if final.exists() or final.is_symlink():
                remove_path(final)
            os.replace(staging, final)
            for old in list_checkpoints(self.output_dir)[: -self.config.train.keep_checkpoints]:
                remove_path(old)  # a symlinked step folder: the link goes, not what it points at
        acc.wait_for_everyone()
        return final

    def _trim_metrics(self, step: int) -> None:
        """Drop metric lines of steps lost after the checkpoint a run resumes from."""
        path = self.output_dir / "metrics.jsonl"
        if path.is_file():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
            atomic_write_text(path, "".join(ln + "\n" for ln in lines))

    def save_adapter(self) -> Path | None:
        """``adapter/``: the LoRA adapter in peft format plus the other trainable weights."""
        acc, out = self.accelerator, self.output_dir / "adapter"
        if self._fsdp():
            return None  # the last checkpoint holds the gathered weights; export reads it
        acc.wait_for_everyone()
        if acc.is_main_process:
            write_adapter(self.peft_model, self.config, out)
        acc.wait_for_everyone()
        return out
