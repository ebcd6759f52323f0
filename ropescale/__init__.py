"""ropescale: extend the context window of pretrained RoPE LLMs.

Public API (imported lazily so ``import ropescale`` and the CLI start fast)::

    ropescale.from_pretrained(name_or_path, method="yarn", factor=8, **hf_kwargs)
    ropescale.patch(model, method="yarn", factor=8)
    ropescale.patch_config(config, method="yarn", factor=8)
    ropescale.patch(model, ropescale.Scaling("yarn", 8, {"beta_fast": 16}))   # the one scaling value
    ropescale.save_pretrained(model, directory, tokenizer=None)
    ropescale.get_method("yarn", factor=8).compute(spec)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "from_pretrained": "ropescale.models.loading",
    "load_tokenizer": "ropescale.models.loading",
    "patch": "ropescale.patching.model",
    "save_pretrained": "ropescale.models.checkpoint",
    "patch_config": "ropescale.patching.model",
    "Scaling": "ropescale.scaling",
    "get_method": "ropescale.methods",
    "METHODS": "ropescale.methods",
    "RotarySpec": "ropescale.methods",
    "apply_rotary": "ropescale.rotary_reference",
    "cos_sin": "ropescale.rotary_reference",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ropescale' has no attribute {name!r}")


__all__ = sorted(_LAZY) + ["__version__"]
