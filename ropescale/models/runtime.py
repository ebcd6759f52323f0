"""Where and how a model runs: device, dtype and attention kernel, with ``auto`` defaults.

``auto`` picks what a user of the field expects on the hardware at hand:

============  ==========================================  =====================================
setting       on a CUDA device                            otherwise (CPU, MPS)
============  ==========================================  =====================================
device        ``cuda``                                    ``cpu``
dtype         ``bfloat16`` (``float16`` without bf16)     CPU: ``bfloat16`` where the CPU has bf16
                                                          instructions (AMX-BF16: 2-3.8x fp32's
                                                          speed; AVX512-BF16 alone: 1.15-1.3x a
                                                          forward, 1.8-1.9x training, as attention
                                                          does not gain; perplexity within 0.3%),
                                                          else ``float32`` (bf16 without them is
                                                          3-8x slower); MPS: ``float32``
attention     ``flash_attention_2`` if flash-attn is      ``sdpa``
              installed and the dtype is 16-bit, else
              ``sdpa``
============  ==========================================  =====================================

Explicit values are checked here, before any weights are loaded, so a wrong flag fails in one
line (``cuda`` without a GPU, ``flash_attention_2`` without flash-attn or on the CPU or in fp32).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    import torch

from ..errors import RopescaleError

DTYPES = ("float32", "bfloat16", "float16")
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")


class LoadKwargs(TypedDict):
    """:meth:`Runtime.load_kwargs`: what ``from_pretrained`` takes from a runtime."""

    dtype: torch.dtype
    attn_implementation: str | None


@dataclass(frozen=True)
class Runtime:
    """A resolved runtime: ``device`` (``cpu``, ``cuda``, ``cuda:1``, ``mps``), ``dtype`` (a name in
    :data:`DTYPES`), ``attention`` (a name in :data:`ATTENTIONS`) and, for bf16 on a CPU, ``kernels``:
    which bf16 instructions compute it (:func:`cpu_bf16_kernels`). AMX tiles and AVX512-BF16 dot
    products round differently, enough to change greedy answers (yarn ×4, 30 passkey prompts at 4k:
    12/30 with AMX, 10/30 with AVX512-BF16), so results record it and are not mixed across it."""

    device: str
    dtype: str
    attention: str
    kernels: str | None = None

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)

    def load_kwargs(self) -> LoadKwargs:
        """Keyword arguments for ``from_pretrained`` (the model is moved with :meth:`place`)."""
        return {"dtype": self.torch_dtype, "attn_implementation": self.attention}

    def place(self, model: Any) -> Any:
        """Move a loaded model to :attr:`device` (a no-op on the CPU)."""
        return model if self.device == "cpu" else model.to(self.device)

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def same_runtime(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two recorded runtimes (:meth:`Runtime.to_dict`) computed alike: equal on every key both
    record, so a record written before bf16 ``kernels`` were recorded (or a shipped evidence file that
    names only device and dtype) matches on what it has."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def runtime_text(runtime: dict[str, str]) -> str:
    """A recorded runtime for people: ``cpu / bfloat16 (amx) / sdpa`` (keys it lacks are left out)."""
    kernels = f" ({runtime['kernels']})" if runtime.get("kernels") else ""
    dtype = f"{runtime['dtype']}{kernels}" if "dtype" in runtime else None
    return " / ".join(x for x in (runtime.get("device"), dtype, runtime.get("attention")) if x)


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX-BF16 tiles or AVX512-BF16 dot products).

    Without either, oneDNN emulates bf16 and a bf16 model runs several times slower than fp32
    (benchmarks/bench_dtype.py measures both). ``ROPESCALE_CPU_BF16=0|1`` overrides the detection.
    """
    forced = os.environ.get("ROPESCALE_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return cpu_bf16_kernels() != "emulated"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows: for the machine line of
    a measurement (bf16 speed and answers depend on it)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_bf16_kernels() -> str:
    """Which instructions compute bf16 matmuls on this CPU, as the hardware has them (the override of
    :func:`cpu_has_bf16` does not change what computes) and oneDNN may use them (:func:`onednn_isa_cap`):
    ``amx``, ``avx512_bf16``, or ``emulated`` (neither: oneDNN converts to fp32).

    Read from torch's public ``torch.cpu.get_capabilities()`` (cpuinfo's feature flags, the same
    library oneDNN's dispatch trusts; torch 2.13 has it). ``torch.backends.cpu.get_cpu_capability()`` is
    no substitute: it names the vector ISA ATen dispatches to (``AVX512`` on Skylake and on Sapphire
    Rapids alike), not whether bf16 dot products exist. Older torch builds have only the private probes
    ``torch.cpu._is_amx_tile_supported``/``_is_avx512_bf16_supported``, used as a fallback.
    """
    import torch

    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        caps = get_capabilities()
        amx, avx512_bf16 = bool(caps.get("amx_bf16")), bool(caps.get("avx512_bf16"))
    else:  # an older torch (pyproject allows >= 2.3)
        amx, avx512_bf16 = torch.cpu._is_amx_tile_supported(), torch.cpu._is_avx512_bf16_supported()
    cap = onednn_isa_cap()
    if cap is not None:  # oneDNN dispatches below it: what the hardware has above the cap does not compute
        amx = amx and "AMX" in cap
        avx512_bf16 = avx512_bf16 and ("AMX" in cap or cap in _BF16_DOT_ISAS or cap.startswith("AVX10"))
    return "amx" if amx else "avx512_bf16" if avx512_bf16 else "emulated"


#: oneDNN's ISA names without AMX that still have bf16 dot products (AVX10 and the AMX names have them too)
_BF16_DOT_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16")


def onednn_isa_cap() -> str | None:
    """The instruction set oneDNN is capped at by ``ONEDNN_MAX_CPU_ISA`` (or its older name
    ``DNNL_MAX_CPU_ISA``), upper-cased; None where it is not capped. ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``
    on a Xeon with AMX runs bf16 matmuls on AVX512-BF16, as a CPU without AMX does (an EPYC's kind of
    kernels on the Xeon's cores and memory): a cell measured so must not say ``amx``."""
    for key in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(key, "").strip().upper()
        if value and value not in ("ALL", "DEFAULT"):
            return value
    return None


def load_average() -> float | None:
    """The machine's 1-minute load average now (None where the OS has none, e.g. Windows).

    Recorded beside every timed record (training log lines, suite and RULER cells, benchmarks): a
    measurement taken beside another job is slower by its neighbours' share, and the number tells a
    reader which figures ran alone (issue 54: one recipe timed 99 s a step beside a job, 23.8 s alone).
    """
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory torch frees, instead of handing it back to the OS.

    Large CPU tensors (logits chunks, attention blocks, activations) are allocated and freed every
    step. glibc serves each allocation above 32 MB with a fresh ``mmap`` and returns it with
    ``munmap``, so every step pays page faults to map and zero the same gigabytes again: a third of
    the process's time was system time in one SmolLM2 training step on 2 cores, and the step took
    14.4 s instead of 10.8 s (issue 54; benchmarks/README.md, "CPU speed"). Serving large blocks from
    the heap (``M_MMAP_MAX`` = 0) and trimming it only above 2 GB freed (``M_TRIM_THRESHOLD``) keeps
    the pages mapped for the next step: the peak resident memory is the same, the memory held after a
    peak is not returned to the OS until the process ends. This is what tcmalloc or jemalloc preloaded
    would give, without a preload. ``ROPESCALE_MALLOC=system`` leaves malloc as it is.

    Returns whether the setting was applied (glibc on Linux, not turned off).
    """
    if os.environ.get("ROPESCALE_MALLOC", "").lower() == "system" or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def auto_dtype(device: str) -> str:
    """``auto``'s dtype on ``device``: bf16 where the hardware computes it (CUDA with bf16, CPUs with
    AMX/AVX512-BF16), fp16 on older CUDA devices, fp32 otherwise."""
    import torch

    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if device == "cpu" and cpu_has_bf16():
        return "bfloat16"
    return "float32"


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
        dtype = auto_dtype(device)
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
    kernels = cpu_bf16_kernels() if device == "cpu" and dtype == "bfloat16" else None
    return Runtime(device, dtype, attention, kernels)


def _auto(value: str | None) -> str | None:
    text = None if value is None else str(value).strip()
    return None if text in (None, "", "auto") else text
