"""The method registry: one name → one :class:`ScalingMethod` subclass.

>>> from ropescale.methods import get_method, RotarySpec
>>> spec = RotarySpec(head_dim=64, base=1e5, original_max_position_embeddings=8192)
>>> inv_freq, attention_factor = get_method("yarn", factor=4).compute(spec)
"""

from __future__ import annotations

from .base import RotarySpec, ScalingMethod
from .basic import NTK, Default, DynamicNTK, Linear
from .composed import Composed
from .dca import DualChunk
from .llama3 import Llama3
from .longrope import LongRope
from .registry import ALIASES, METHODS, get_method, method_class, register_method
from .self_extend import SelfExtend
from .self_extend_llamacpp import SelfExtendLlamaCpp
from .string import String
from .yarn import DynamicYarn, Yarn

for _cls in (Default, Linear, NTK, DynamicNTK, Yarn, DynamicYarn, Llama3, LongRope, SelfExtend, DualChunk, String):
    register_method(_cls)
register_method(SelfExtendLlamaCpp)
register_method(Composed)


__all__ = ["ALIASES", "METHODS", "RotarySpec", "ScalingMethod", "get_method", "method_class", "register_method"]
