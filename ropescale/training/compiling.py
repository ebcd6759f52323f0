"""``train.compile``: every decoder layer through ``torch.compile``, and whether this machine can.

Each decoder layer's forward is compiled in place (:meth:`torch.nn.Module.compile`): the module, its
parameter names, LoRA's layers in it and the checkpoints stay as they are; inductor fuses the layer's
elementwise work (norms, rotary, SwiGLU, the casts around bf16 autocast) between the matmuls. The layers
share their code, so one compilation serves them all. Measured on ``smollm2-135m/yarn_x2_cpu`` on a
2-core Xeon: 10.3 to 9.3 s a step, after about 20 s of compilation in the first steps
(benchmarks/bench_train_step.py, its ``compile`` row; benchmarks/README.md).

Off by default: the first steps pay the compilation, a step's numbers differ from the uncompiled
step's by rounding (fused kernels), and on a CPU inductor builds its kernels with a C++ compiler the
user's machine may not have. :func:`compile_problem` finds that out before the weights load (the
preflight, :mod:`.preflight`).
"""

from __future__ import annotations

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Every decoder layer (a module with ``self_attn`` and ``mlp``: Llama, Mistral, Qwen2, Qwen3 and most decoders)."""
    return [m for m in model.modules() if isinstance(getattr(m, "mlp", None), nn.Module) and hasattr(m, "self_attn")]


def compile_layers(model: nn.Module) -> int:
    """Compile each decoder layer's forward in place; returns how many layers."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


def cpp_compiler() -> tuple[str | None, str]:
    """``(the C++ compiler inductor would use, or None; the names it looks for)``, found the way
    inductor finds it (``torch._inductor.config.cpp.cxx``, which reads ``$CXX``)."""
    from torch._inductor import config as inductor
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = inductor.cpp.cxx
    names = ", ".join(str(c) for c in (cxx if isinstance(cxx, (list, tuple)) else (cxx,)) if c)
    try:
        return get_cpp_compiler(), names
    except Exception:  # noqa: BLE001 - inductor raises InvalidCxxCompiler, or an OSError from the probe
        return None, names


def compile_problem(device: str) -> str | None:
    """Why ``train.compile=true`` cannot run on ``device`` (``cpu``, ``cuda``...), or None."""
    if not hasattr(torch, "compile"):
        return f"train.compile=true needs torch.compile (torch >= 2.0; this is torch {torch.__version__})"
    if device != "cpu":
        return None
    found, names = cpp_compiler()
    if found is None:
        return (
            f"train.compile=true: no C++ compiler found for torch inductor on this CPU run (looked for {names}); "
            "install g++ or set CXX to one, or set train.compile=false"
        )
    return None
