"""``auto`` precision of a training recipe, resolved when the recipe is loaded (the run's ``config.yaml``
records what ran): ``train.mixed_precision`` is bf16 on a GPU with bf16 and on a CPU with
AMX/AVX512-BF16, else ``no``; ``model.dtype`` is bfloat16 for the frozen base of a LoRA run under bf16,
else float32 (a full fine-tune keeps float32 master weights; autocast computes in bf16).
"""

from __future__ import annotations

from typing import Any

from ..errors import RecipeError as ConfigError

AUTO = "auto"


def resolve_precision(c: Any) -> None:
    """Replace ``auto`` in ``train.mixed_precision`` and ``model.dtype`` (see the module docstring)."""
    if c.train.mixed_precision == AUTO:
        import torch

        from ..models.runtime import cpu_has_bf16

        fast = torch.cuda.is_bf16_supported() if torch.cuda.is_available() else cpu_has_bf16()
        c.train.mixed_precision = "bf16" if fast else "no"
    if c.model.dtype == AUTO:
        lora_bf16 = c.lora.enabled and c.train.mixed_precision == "bf16"
        c.model.dtype = "bfloat16" if lora_bf16 else "float32"
    _check_precision(c)


def _check_precision(c: Any) -> None:
    if not c.lora.enabled and c.model.dtype != "float32":
        raise ConfigError(
            f"model.dtype={c.model.dtype} with lora.enabled=false: a full fine-tune keeps float32 master "
            "weights (set model.dtype=float32 or auto; train.mixed_precision=bf16 computes in bf16)"
        )
    if c.model.dtype != "float32" and c.train.mixed_precision == "no":
        raise ConfigError(
            f"model.dtype={c.model.dtype} with train.mixed_precision=no: the trainable weights stay float32 and "
            f"cannot multiply {c.model.dtype} activations (set train.mixed_precision=bf16, or model.dtype=float32)"
        )
