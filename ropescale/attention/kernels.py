"""Each attention mode's kernel: one explicit table from a mode (:mod:`.modes`) to what it registers.

A mode row says what installing the mode needs (no torch: the command line reads it); the kernel is
the torch half, the attention function(s) registered with transformers' ``AttentionInterface`` under
ropescale's names. They meet here, through imports: a kernel module renamed or removed fails at
import time, and a row without its kernel makes this module refuse to import, where the old table
named each kernel's module as a string resolved by ``importlib`` only when a model was patched.

The kernel modules import :mod:`.modes` (through :mod:`.rotated_cache`) and this module imports them,
never the package's ``__init__`` (which imports this module lazily, in ``install``): the graph stays
acyclic (``tests/test_layout.py``). Only ``install`` needs the kernels, so ``import ropescale`` and the
command line's parser never load them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .consistent import NAMES as KV_CONSISTENT_NAMES
from .consistent import register as register_kv_consistent
from .dca import NAME as DCA_NAME
from .dca import register as register_dca
from .modes import DCA, KV_CONSISTENT, SELF_EXTEND, SELF_EXTEND_LLAMACPP, STRING, TABLE, AttentionMode
from .modes import mode as mode_row
from .self_extend import NAME as SELF_EXTEND_NAME
from .self_extend import register as register_self_extend
from .self_extend_llamacpp import NAME as SELF_EXTEND_LLAMACPP_NAME
from .self_extend_llamacpp import register as register_self_extend_llamacpp
from .string import NAME as STRING_NAME
from .string import register as register_string


@dataclass(frozen=True)
class Kernel:
    """A mode's kernel: the function that registers it with transformers, and the names it registers."""

    mode: AttentionMode
    #: registers the attention function(s) and their mask functions with transformers (idempotent)
    register: Callable[[], None]
    #: the kernel the mode wraps (``"sdpa"``, ``"eager"``, see :func:`ropescale.attention.kernel_for`)
    #: -> the name registered for it, which ``config._attn_implementation`` is set to
    names: Mapping[str, str]

    def name(self, inner: str) -> str:
        """The registered name the model runs under when the mode wraps ``inner``."""
        return self.names[inner]


#: every mode's kernel, in the modes' table order; Self-Extend, DCA, STRING and llama.cpp's grouped
#: attention always run torch's SDPA kernels (:mod:`.merge`), so they register one name, for ``sdpa``
KERNELS: dict[str, Kernel] = {
    kernel.mode.name: kernel
    for kernel in (
        Kernel(KV_CONSISTENT, register_kv_consistent, KV_CONSISTENT_NAMES),
        Kernel(SELF_EXTEND, register_self_extend, {"sdpa": SELF_EXTEND_NAME}),
        Kernel(DCA, register_dca, {"sdpa": DCA_NAME}),
        Kernel(STRING, register_string, {"sdpa": STRING_NAME}),
        Kernel(SELF_EXTEND_LLAMACPP, register_self_extend_llamacpp, {"sdpa": SELF_EXTEND_LLAMACPP_NAME}),
    )
}

if [kernel.mode for kernel in KERNELS.values()] != list(TABLE.values()):  # one kernel per row, in its order
    raise ImportError(f"ropescale/attention/kernels.py: kernels for {list(KERNELS)}, but the modes are {list(TABLE)}")


def kernel(name: str) -> Kernel:
    """The kernel of the mode ``name``; unknown names get the list of known modes (:func:`.modes.mode`)."""
    return KERNELS[mode_row(name).name]


__all__ = ["KERNELS", "Kernel", "kernel"]
