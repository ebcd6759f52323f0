"""The config.json keys the interop checks read and write, by name.

A config.json is JSON read from (and written to) a file: these ``TypedDict``s are total=False and
name the keys this package reads or writes; every other key of the file passes through unread.
"""

from __future__ import annotations

from typing import TypedDict


class RopeDict(TypedDict, total=False):
    """A ``rope_parameters`` (transformers 5) or ``rope_scaling`` (transformers 4) dict: the type, the base
    and the fields each method reads (:data:`ropescale.interop.legacy.FIELDS`), and ``attn_factor``,
    what vLLM < 0.30 and SGLang read for YaRN."""

    rope_type: str
    type: str
    rope_theta: float
    partial_rotary_factor: float
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    truncate: bool
    attention_factor: float
    attn_factor: float
    mscale: float
    mscale_all_dim: float
    low_freq_factor: float
    high_freq_factor: float
    short_factor: list[float]
    long_factor: list[float]
    short_mscale: float
    long_mscale: float


class ProvenanceBlock(TypedDict, total=False):
    """ropescale's block of a config.json (``"ropescale"``): the keys the interop checks read."""

    method: str
    native: bool
    kv_consistent: bool
    original_rope_theta: float
    original_max_position_embeddings: int
    extended_context: int


class DualChunkConfig(TypedDict):
    """vLLM's ``dual_chunk_attention_config`` (Qwen2.5-1M's key) for a DCA checkpoint."""

    chunk_size: int
    local_size: int
    original_max_position_embeddings: int


class LegacyKeys(TypedDict, total=False):
    """The top-level keys transformers 4 and the serving engines read (:func:`ropescale.interop.legacy.legacy_keys`)."""

    rope_scaling: RopeDict | None
    rope_theta: float
    max_position_embeddings: int
    original_max_position_embeddings: int
    partial_rotary_factor: float


class ConfigJSON(LegacyKeys, total=False):
    """A checkpoint's config.json as the interop checks read it (the rest of the file passes through)."""

    rope_parameters: RopeDict | None
    model_type: str
    ropescale: ProvenanceBlock | None
    dual_chunk_attention_config: DualChunkConfig


__all__ = ["ConfigJSON", "DualChunkConfig", "LegacyKeys", "ProvenanceBlock", "RopeDict"]
