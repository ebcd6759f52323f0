"""Classes that ``modeling_ropescale.py`` (written by :mod:`ropescale.models.checkpoint`) loads.

With ``trust_remote_code=True`` plain transformers finds them through the checkpoint's
``auto_map``; they hand the whole load to :func:`ropescale.from_pretrained`.
"""

from __future__ import annotations

from typing import Any

import transformers

from ..patching.plan import NON_NATIVE_PREFIX, SUPPORTED_MODEL_TYPES


def remote_classes(model_type: str) -> tuple[type, type]:
    """Config and model classes for ``modeling_ropescale.py`` (subclasses of the architecture's own)."""
    base_config = transformers.CONFIG_MAPPING[model_type]
    base_model = getattr(transformers, SUPPORTED_MODEL_TYPES[model_type])

    class RopescaleConfig(base_config):  # type: ignore[misc, valid-type]
        model_type = NON_NATIVE_PREFIX + base_config.model_type

    def _validate(self, rope_parameters, ignore_keys=None):  # validated by ropescale's method class
        return None

    from ..methods import METHODS

    for name in METHODS:  # transformers looks up _validate_<rope_type>_rope_parameters
        setattr(RopescaleConfig, f"_validate_{NON_NATIVE_PREFIX}{name}_rope_parameters", _validate)

    class RopescaleForCausalLM(base_model):  # type: ignore[misc, valid-type]
        config_class = RopescaleConfig

        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, config: Any = None, **kwargs: Any):
            from .loading import from_pretrained

            impl = getattr(config, "_attn_implementation", None)
            if impl and "attn_implementation" not in kwargs:
                kwargs["attn_implementation"] = impl
            for key in ("trust_remote_code", "code_revision", "adapter_kwargs", "_from_auto", "_commit_hash"):
                kwargs.pop(key, None)
            return from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    return RopescaleConfig, RopescaleForCausalLM
