"""The checkpoint format: saving a patched model atomically, and marking non-native checkpoints.

A checkpoint whose scaling transformers cannot build (non-native methods) is written with
``model_type: "ropescale_<type>"`` and an ``auto_map`` pointing at a generated
``modeling_ropescale.py``. Plain transformers then stops while reading the config and asks for
``trust_remote_code=True`` (a clear message, instead of a ``KeyError`` deep in the rotary module);
with it, the classes of :mod:`ropescale.models.remote` hand the whole load to
:func:`ropescale.from_pretrained`, which rebuilds the scaling from the provenance block.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .._io import atomic_directory
from ..interop.legacy import write_engine_keys, write_legacy_keys
from ..interop.verdict import check
from ..patching.plan import NON_NATIVE_PREFIX, REMOTE_CODE_MODULE, plan_from_provenance

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
from ropescale.models.remote import remote_classes

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
            version=block["version"],
            method=block["method"],
            config_cls=CONFIG_CLASS,
            model_cls=MODEL_CLASS,
            model_type=config.model_type,
        )
    )


def unmark_config_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`mark_non_native` on a loaded config.json dict."""
    data = dict(data)
    if str(data.get("model_type", "")).startswith(NON_NATIVE_PREFIX):
        data["model_type"] = data["model_type"][len(NON_NATIVE_PREFIX) :]
    data.pop("auto_map", None)
    return data


def check_written(path: Path, shown: Path) -> None:
    """Read a written config.json the way :func:`ropescale.from_pretrained` will (the one validation pass,
    then transformers' config, then :func:`~ropescale.models.runnable.check_runnable`); raise, naming
    ``shown``, where a loader would fail on it."""
    from transformers import AutoConfig

    from ..interop.legacy import restore_serving_fields
    from ..patching.plan import quiet_transformers
    from .config_check import check_config_dict
    from .runnable import check_runnable

    data = unmark_config_dict(json.loads(path.read_text()))
    check_config_dict(data, str(shown))
    with quiet_transformers():
        config = restore_serving_fields(AutoConfig.for_model(**data))
    check_runnable(config, str(shown))


def save_pretrained(
    model: Any, directory: str | Path, tokenizer: Any = None, config_only: bool = False, overwrite: bool = False
) -> Path:
    """Save a (patched) model, its tokenizer and config atomically.

    Args:
        model: the patched model.
        directory: target; nothing appears there until everything is written.
        tokenizer: saved beside the weights if given.
        config_only: write only config.json (and the loader file for non-native methods).
        overwrite: replace an existing non-empty directory.

    Returns:
        ``directory``. config.json carries, beside ``rope_parameters``, the legacy keys older
        transformers and the serving engines read (:mod:`ropescale.interop.legacy`; check a
        checkpoint with :func:`ropescale.interop.verdict.check` or ``ropescale doctor``). For
        non-native methods the config is marked and ``modeling_ropescale.py`` added (see
        :mod:`ropescale.models.remote`), so plain transformers explains what to do instead of
        failing inside the model; a one-line warning says what other loaders get instead.
    """
    directory = Path(directory)
    config = model.config
    with atomic_directory(directory, overwrite=overwrite) as tmp:
        if config_only:
            config.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        # the keys transformers 4.x and the serving engines read, beside rope_parameters
        data = write_legacy_keys(tmp / "config.json")
        plan = plan_from_provenance(config)
        if plan is not None:  # keys one engine reads for this method (vLLM's dual_chunk_attention_config)
            data = write_engine_keys(tmp / "config.json", plan.method, plan.spec)
        block = getattr(config, "ropescale", None)
        if isinstance(block, dict) and not block.get("native", True):
            mark_non_native(tmp, config)
        check_written(tmp / "config.json", directory / "config.json")  # nothing a loader cannot run is written
    note = check(data).note if isinstance(getattr(config, "ropescale", None), dict) else None
    if note:
        warnings.warn(note, UserWarning, stacklevel=2)
    return directory
