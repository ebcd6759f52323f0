"""Exporting a (patched) model for other runtimes: GGUF for llama.cpp (:mod:`ropescale.export.gguf`)."""

from __future__ import annotations

from .gguf import export_gguf
from .gguf_rope import NotExpressibleError, rope_for_gguf

__all__ = ["NotExpressibleError", "export_gguf", "rope_for_gguf"]
