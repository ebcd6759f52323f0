"""Where and how a model runs: device, dtype and attention kernel, with ``auto`` defaults.

``auto`` picks what a user of the field expects on the hardware at hand:

============  ==========================================  =====================================
setting       on a CUDA device                            otherwise (CPU, MPS)
============  ==========================================  =====================================
device        ``cuda``                                    ``cpu``
dtype         ``bfloat16`` (``float16`` without bf16)     ``float32`` (bf16 on CPUs without bf16
                                                          instructions is ~4x slower)
attention     ``flash_attention_2`` if flash-attn is      ``sdpa``
              installed and the dtype is 16-bit, else
              ``sdpa``
============  ==========================================  =====================================

Explicit values are checked here, before any weights are loaded, so a wrong flag fails in one
line (``cuda`` without a GPU, ``flash_attention_2`` without flash-attn or on the CPU or in fp32).
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import RopescaleError

DTYPES = ("float32", "bfloat16", "float16")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass(frozen=True)
class Runtime:
    """A resolved runtime: ``device`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``), ``dtype`` (a name in
    :data:`DTYPES`), ``attention`` (a name in :data:`ATTENTIONS`)."""

    device: str
    dtype: str
    attention: str

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``from_pretrained`` (the model is moved with :meth:`place`)."""
        return {"dtype": self.torch_dtype, "attn_implementation": self.attention}

    def place(self, model: Any) -> Any:
        """Move a loaded model to :attr:`device` (a no-op on the CPU)."""
        return model if self.device == "cpu" else model.to(self.device)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def auto_attention(cuda: bool, dtype: str) -> str:
    """``auto``'s kernel: flash_attention_2 on a CUDA device with 16-bit weights when flash-attn is
    installed (it has no fp32 kernel), else sdpa. Evaluation and training both decide with this."""
    return "flash_attention_2" if cuda and dtype != "float32" and flash_attn_installed() else "sdpa"


def resolve_runtime(device: str | None = "auto", dtype: str | None = "auto", attention: str | None = "auto") -> Runtime:
    """Resolve ``auto`` (or None) in each setting and check explicit ones (see the module doc).

    Raises:
        RopescaleError: a device, dtype or attention kernel this machine cannot use.
    """
    import torch

    device = _auto(device)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        try:
            kind = torch.device(device).type
        except RuntimeError:
            raise RopescaleError(f"device must be cpu, cuda, cuda:N or mps, got {device!r}") from None
        if kind == "cuda" and not torch.cuda.is_available():
            raise RopescaleError(f"device {device!r} asked for, but torch sees no CUDA device")
        if kind == "mps" and not torch.backends.mps.is_available():
            raise RopescaleError("device 'mps' asked for, but torch sees no MPS device")
    cuda = device.startswith("cuda")

    dtype = _auto(dtype)
    if dtype is None:
        dtype = ("bfloat16" if torch.cuda.is_bf16_supported() else "float16") if cuda else "float32"
    elif dtype not in DTYPES:
        raise RopescaleError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")

    attention = _auto(attention)
    if attention is None:
        attention = auto_attention(cuda, dtype)
    elif attention not in ATTENTIONS:
        raise RopescaleError(f"attention must be auto or one of {', '.join(ATTENTIONS)}, got {attention!r}")
    elif attention == "flash_attention_2":
        if not cuda:
            raise RopescaleError("flash_attention_2 runs on a CUDA device only; use sdpa on the CPU")
        if dtype == "float32":
            raise RopescaleError("flash_attention_2 needs bfloat16 or float16, not float32")
        if not flash_attn_installed():
            raise RopescaleError(
                "flash_attention_2 needs the flash-attn package: pip install flash-attn --no-build-isolation"
            )
    return Runtime(device, dtype, attention)


def _auto(value: str | None) -> str | None:
    text = None if value is None else str(value).strip()
    return None if text in (None, "", "auto") else text
