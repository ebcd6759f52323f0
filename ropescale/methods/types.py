"""The shapes a scaling takes as plain data inside the library, named key by key.

A method object is the typed value; these are what it is written as where transformers, a saved
config or a report reads it as plain data: transformers' ``rope_parameters``, a method's parameters
as JSON values, and a method named with its parameters (a composition's two halves, a shipped
scaling). JSON read from a file stays a plain dict until it is checked; past that it is one of these.
"""

from __future__ import annotations

from typing import TypedDict


class RopeParameters(TypedDict, total=False):
    """transformers' ``config.rope_parameters``, with the keys ropescale writes or reads (a method writes
    a complete one: always ``rope_type`` and ``rope_theta``)."""

    rope_type: str
    rope_theta: float
    factor: float
    original_max_position_embeddings: int
    partial_rotary_factor: float
    # yarn
    beta_fast: float
    beta_slow: float
    truncate: bool
    attention_factor: float
    mscale: float
    mscale_all_dim: float
    # llama3
    low_freq_factor: float
    high_freq_factor: float
    # longrope
    long_factor: list[float]
    short_factor: list[float]
    long_mscale: float
    short_mscale: float


class MethodRef(TypedDict):
    """A method by name with its parameters: ``{"method": "yarn", "params": {"factor": 4, ...}}``."""

    method: str
    params: MethodParams


#: one parameter's value as JSON: a number, a flag, a name, a list of per-pair factors, or (a
#: composition's ``base`` and ``on_top``) a method with its own parameters
ParamValue = float | int | bool | str | list[float] | MethodRef | None
#: a method's parameters by name (:meth:`~ropescale.methods.base.ScalingMethod.params`)
MethodParams = dict[str, ParamValue]

__all__ = ["MethodParams", "MethodRef", "ParamValue", "RopeParameters"]
