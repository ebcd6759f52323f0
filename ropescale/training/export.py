"""Merge a fine-tuned LoRA run into a plain checkpoint that carries its RoPE scaling.

The base model is loaded and scaled exactly as in training (fp32 by default, so the merge does not
round the LoRA update into bf16), the trainable weights of a checkpoint are loaded into the peft
wrapper, LoRA is merged (``merge_and_unload``), and the result is written by
:func:`ropescale.save_pretrained`: atomically, with the config's provenance block, and with the
loader file for methods transformers cannot build. Where the method is native (linear, yarn, ...)
the export loads in plain ``transformers.AutoModelForCausalLM``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RopescaleError
from .checkpoints import TRAINABLE_FILE, checkpoint_problem, list_checkpoints, resume_point
from .config import load_run_config
from .modeling import load_base_model, load_trainable, scale_model, wrap_lora


def find_checkpoint(run_dir: str | Path, checkpoint: str | None = None) -> Path:
    """A run's checkpoint folder: the newest, or ``step-N`` / ``N`` / a path."""
    found = list_checkpoints(run_dir)
    if checkpoint is None or checkpoint == "latest":
        newest = resume_point(
            run_dir, remedy="nothing to export"
        )  # the newest complete one, saying which newer ones are damaged
        if newest is None:
            raise RopescaleError(f"run '{run_dir}' has no complete checkpoint yet")
        return newest
    path = Path(checkpoint)
    if not (path / TRAINABLE_FILE).is_file():
        path = next(
            (
                p
                for p in found
                if p.name == checkpoint or (checkpoint.isdigit() and int(p.name.split("-")[1]) == int(checkpoint))
            ),
            None,
        )
    if path is not None:
        problem = checkpoint_problem(path)
        if problem:
            raise RopescaleError(f"checkpoint {path} is damaged: {problem}; export another (--checkpoint)")
        return path
    names = ", ".join(p.name for p in found) or "none"
    raise RopescaleError(f"checkpoint '{checkpoint}' not found in '{run_dir}' (available: {names})")


def merged_model(
    run_dir: str | Path, checkpoint: str | None = None, dtype: str = "float32", base_model: Any = None
) -> Any:
    """The run's model with LoRA merged in (eval mode, full attention).

    Args:
        run_dir: the training output folder (holds ``config.yaml`` and ``checkpoints/``).
        checkpoint: which checkpoint (default: the newest).
        dtype: dtype of the base weights the LoRA update is merged into.
        base_model: an already loaded base model to use instead of loading ``model.name``.
    """
    from safetensors.torch import load_file

    config = load_run_config(run_dir)
    path = find_checkpoint(run_dir, checkpoint)
    base = scale_model(base_model, config) if base_model is not None else load_base_model(config, dtype=dtype)
    peft_model = wrap_lora(base, config)
    load_trainable(peft_model, load_file(path / TRAINABLE_FILE))
    model = peft_model.merge_and_unload()
    model.config.use_cache = True
    return model.eval()


def export(
    run_dir: str | Path,
    output: str | Path,
    checkpoint: str | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
    base_model: Any = None,
    tokenizer: Any = None,
) -> Path:
    """Write the merged model (weights, tokenizer, scaled config) to ``output``; returns ``output``."""
    from ..models.checkpoint import save_pretrained
    from ..models.loading import load_tokenizer

    config = load_run_config(run_dir)
    model = merged_model(run_dir, checkpoint, dtype, base_model)
    block = getattr(model.config, "ropescale", None)
    if isinstance(block, dict):  # its weights were trained with this scaling: a later extension composes on it
        model.config.ropescale = {**block, "fine_tuned": True}
    if tokenizer is None and base_model is None:
        try:
            tokenizer = load_tokenizer(config.model.name)
        except Exception:  # noqa: BLE001 - a checkpoint without a tokenizer is still a checkpoint
            tokenizer = None
    return save_pretrained(model, output, tokenizer=tokenizer, overwrite=overwrite)
