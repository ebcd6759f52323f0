"""Checkpoints whose scaling transformers cannot build (non-native methods).

:func:`ropescale.save_pretrained` writes such a checkpoint with ``model_type: "ropescale_<type>"``
and an ``auto_map`` pointing at a generated ``modeling_ropescale.py``. Plain transformers then
stops while reading the config and asks for ``trust_remote_code=True`` (a clear message, instead
of a ``KeyError`` deep in the rotary module); with it, the classes below hand the whole load to
:func:`ropescale.from_pretrained`, which rebuilds the scaling from the provenance block.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import transformers

from .config import NON_NATIVE_PREFIX, REMOTE_CODE_MODULE, SUPPORTED_MODEL_TYPES

CONFIG_CLASS = "RopescaleConfig"
MODEL_CLASS = "RopescaleForCausalLM"

_REMOTE_CODE = '''"""Written by ropescale {version}.

This checkpoint uses the RoPE scaling method "{method}", which transformers cannot build from
config.json alone (see the "ropescale" block there). Load it with

    import ropescale
    model = ropescale.from_pretrained("<this directory>")

or with transformers and trust_remote_code=True, which hands the loading to ropescale
(pip install ropescale).
"""
from ropescale.patching.remote import remote_classes

{config_cls}, {model_cls} = remote_classes("{model_type}")
'''


def mark_non_native(directory: Path, config: Any) -> None:
    """Rewrite a saved config.json so plain transformers cannot silently build it, and add the loader."""
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data["model_type"] = NON_NATIVE_PREFIX + config.model_type
    data["auto_map"] = {
        "AutoConfig": f"{REMOTE_CODE_MODULE}.{CONFIG_CLASS}",
        "AutoModelForCausalLM": f"{REMOTE_CODE_MODULE}.{MODEL_CLASS}",
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    block = config.ropescale
    (directory / f"{REMOTE_CODE_MODULE}.py").write_text(
        _REMOTE_CODE.format(
            version=block["version"], method=block["method"], config_cls=CONFIG_CLASS, model_cls=MODEL_CLASS,
            model_type=config.model_type,
        )
    )


def unmark_config_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`mark_non_native` on a loaded config.json dict."""
    data = dict(data)
    if str(data.get("model_type", "")).startswith(NON_NATIVE_PREFIX):
        data["model_type"] = data["model_type"][len(NON_NATIVE_PREFIX):]
    data.pop("auto_map", None)
    return data


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
            from ..models.loading import from_pretrained

            impl = getattr(config, "_attn_implementation", None)
            if impl and "attn_implementation" not in kwargs:
                kwargs["attn_implementation"] = impl
            for key in ("trust_remote_code", "code_revision", "adapter_kwargs", "_from_auto", "_commit_hash"):
                kwargs.pop(key, None)
            return from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    return RopescaleConfig, RopescaleForCausalLM
