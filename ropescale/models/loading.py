"""Resolving ``--model`` and loading patched models.

``name_or_path`` may be a local checkpoint directory, a ``.gguf`` file, a Hugging Face Hub id
(only where the Hub is reachable; nothing in the default path or the tests needs it), or the name
of an embedded model (``smollm2-135m``).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RopescaleError, hub_unreachable
from ..interop.legacy import restore_serving_fields
from ..methods.types import MethodParams
from ..patching.model import FROM_PLAN, apply_plan, install_rotary, patched_copy
from ..patching.plan import (
    NON_NATIVE_PREFIX,
    PatchPlan,
    check_supported,
    plan_from_provenance,
    plan_scaling,
    quiet_transformers,
)
from ..scaling import KEEP, Scaling, as_scaling
from .checkpoint import unmark_config_dict
from .config_check import check_config_dict, transformers_rejection
from .embedded import EMBEDDED_MODELS, drop_gguf_quantizer, embedded_model_dir
from .integrity import check_checkpoint_dir, check_gguf, check_weights_format, read_json_file
from .runnable import buildable_config, check_runnable

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# from_pretrained keyword arguments that also apply to AutoConfig / AutoTokenizer.
_SHARED_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "subfolder", "trust_remote_code")


@dataclass(frozen=True)
class ResolvedModel:
    """Where to load from: ``path`` (directory or Hub id) plus extra from_pretrained kwargs."""

    path: str
    kwargs: dict[str, str] = field(default_factory=dict)  # {"gguf_file": name} for a .gguf file
    display: str = ""


def resolve_model(name_or_path: str | os.PathLike) -> ResolvedModel:
    """Turn a ``--model`` value into something transformers can load; clear errors otherwise."""
    text = str(name_or_path)
    if text in EMBEDDED_MODELS:
        return ResolvedModel(str(embedded_model_dir(text)), {}, text)
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf(path)  # a damaged file is named here, not by a reshape error deep in the reader
        return ResolvedModel(str(path.parent), {"gguf_file": path.name}, text)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise RopescaleError(f"model directory '{text}' has no config.json")
        check_checkpoint_dir(path)  # headers only: a truncated weight file or broken config, by name
        return ResolvedModel(str(path), {}, text)
    if path.exists():
        raise RopescaleError(f"model path '{text}' is neither a checkpoint directory nor a .gguf file")
    if text.endswith(".gguf") or text.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(text):
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise RopescaleError(
            f"model '{text}' not found: not a local path, a Hub id (org/name) or an embedded model ({known})"
        )
    return ResolvedModel(text, {}, text)


def _load(loader: Any, resolved: ResolvedModel, **kwargs: Any) -> Any:
    from huggingface_hub.utils import logging as hub_logging

    level = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # its "Retrying in 1s" lines would break the one-line promise
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*gguf.*", category=UserWarning)
            return loader.from_pretrained(resolved.path, **resolved.kwargs, **kwargs)
    except OSError as exc:  # missing files, Hub unreachable, gated repo...
        offline = None if Path(resolved.path).exists() else hub_unreachable(exc, resolved.display or resolved.path)
        if offline is not None:
            raise offline from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RopescaleError(f"could not load '{resolved.display}': {first}") from exc
    except Exception as exc:
        if "weights_only" not in str(exc):
            raise
        # torch refused a pickle; its message suggests the unsafe weights_only=False, never repeated here
        raise RopescaleError(
            f"could not load '{resolved.display}': its weights are a pickle, which ropescale does not load "
            "(loading one can run code); use a checkpoint with .safetensors weights"
        ) from None
    finally:
        hub_logging.set_verbosity(level)


def _read_config(resolved: ResolvedModel, original_context: int | None = None, **kwargs: Any) -> Any:
    """The config, checked by :func:`~ropescale.models.config_check.check_config_dict` before
    transformers sees it (the one validation pass every command shares)."""
    from transformers import AutoConfig

    local = Path(resolved.path) / "config.json"
    source = str(local)
    try:
        if "gguf_file" not in resolved.kwargs and local.is_file():
            data = read_json_file(local, "config")
            marked = str(data.get("model_type", "")).startswith(NON_NATIVE_PREFIX)  # saved by ropescale, non-native
            data = unmark_config_dict(data)
            check_config_dict(data, source, original_context)
            with quiet_transformers():  # it warns that it cannot validate rope_type "ropescale_*"
                return (
                    AutoConfig.for_model(**data)
                    if marked
                    else restore_serving_fields(_load(AutoConfig, resolved, **kwargs))
                )
        source = resolved.display or resolved.path
        with quiet_transformers():
            config = restore_serving_fields(_load(AutoConfig, resolved, **kwargs))
        check_config_dict(config.to_dict(), source, original_context=config.max_position_embeddings)
        return config
    except Exception as exc:  # transformers' own validation of what we did not check
        rejection = None if isinstance(exc, RopescaleError) else transformers_rejection(exc, source)
        if rejection is None:
            raise
        raise rejection from exc


def load_config(
    name_or_path: str | os.PathLike, original_max_position_embeddings: int | None = None, **kwargs: Any
) -> Any:
    """The transformers config of a model (resolved like :func:`from_pretrained`), validated.

    Args:
        name_or_path: as for :func:`from_pretrained`.
        original_max_position_embeddings: the trained context, where the config does not say it.

    Raises:
        ConfigError: a key transformers would reject or ropescale would misread, as one line
            ``<file>: <key> = <value>: <what is wrong>``.
    """
    return _read_config(resolve_model(name_or_path), original_max_position_embeddings, **kwargs)


#: files one of which a local model folder needs for AutoTokenizer
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "tokenizer_config.json",
)


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs: Any) -> Any:
    """The tokenizer of a model (resolved like :func:`from_pretrained`).

    Raises:
        RopescaleError: a local model folder without tokenizer files, naming the folder (instead of
            transformers' paragraph about sentencepiece).
    """
    from transformers import AutoTokenizer

    resolved = resolve_model(name_or_path)
    folder = Path(resolved.path)
    if "gguf_file" not in resolved.kwargs and folder.is_dir() and not kwargs.get("subfolder"):
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise RopescaleError(
                f"model folder '{folder}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}...); "
                "save the base model's tokenizer into it (tokenizer.save_pretrained)"
            )
    tokenizer = _load(AutoTokenizer, resolved, **kwargs)
    if "gguf_file" not in resolved.kwargs and folder.is_dir() and not kwargs.get("subfolder"):
        check_vocabulary(tokenizer, folder / "config.json")
    return tokenizer


def check_vocabulary(tokenizer: Any, config_file: Path) -> None:
    """Refuse a tokenizer with ids the model has no embedding row for (``config.json``'s ``vocab_size``
    below them): the first such token raised torch's "IndexError: index out of range in self" after the
    weights had loaded and the results folder was made. A vocabulary larger than the tokenizer (padded
    for the GPU, as Qwen's) is fine.

    Raises:
        RopescaleError: ``<dir>/config.json: vocab_size = 100 is below the tokenizer's 264 tokens ...``.
    """
    try:
        vocab = read_json_file(config_file, "config").get("vocab_size")
    except (RopescaleError, OSError, AttributeError):
        return  # a config that cannot be read is named by the config check
    if isinstance(vocab, bool) or not isinstance(vocab, int):
        return
    ids = max([len(tokenizer), *(i + 1 for i in tokenizer.get_vocab().values())])
    if ids > vocab:
        raise RopescaleError(
            f"{config_file}: vocab_size = {vocab} is below the tokenizer's {ids} tokens (ids {vocab} to {ids - 1} "
            "have no embedding row); give the model the tokenizer it was trained with, or resize its embeddings"
        )


def _check_runnable(checked: Any, resolved: ResolvedModel) -> None:
    """:func:`~ropescale.models.runnable.check_runnable` on ``checked``, the config the model will have."""
    local = Path(resolved.path) / "config.json"
    check_runnable(checked, str(local) if "gguf_file" not in resolved.kwargs and local.is_file() else resolved.display)


def from_pretrained(
    name_or_path: str | os.PathLike,
    method: str | Scaling | None = None,
    factor: float | None = None,
    original_max_position_embeddings: int | None = None,
    replace: bool = False,
    sliding_window: Any = KEEP,
    method_params: MethodParams | None = None,
    *,
    target_length: int | None = None,
    plan: PatchPlan | None = None,
    **hf_kwargs: Any,
) -> Any:
    """Load a causal LM and apply a RoPE scaling, ready to use.

    Args:
        name_or_path: local directory, ``.gguf`` file, Hub id, or ``smollm2-135m``.
        method: a :class:`~ropescale.scaling.Scaling` (then none of the scaling arguments below), or
            a scaling method name (``ropescale methods``); None (or ``"saved"``, the evaluation
            commands' default) keeps the checkpoint's own scaling (a checkpoint saved by ropescale
            reloads with the same behaviour); ``"none"`` with ``replace=True`` removes it.
        factor: scaling factor s; extended context = s × original.
        target_length: instead of ``factor``, the context to reach in tokens (factor = N / L,
            rounded up to an integer for llama3).
        original_max_position_embeddings: trained context L, if the config does not say it.
        replace: allow replacing an existing scaling (starts from the original parameters).
        sliding_window: ``"keep"``, ``None`` or a width, for Mistral-style models.
        method_params: the method's own parameters (``{"beta_fast": 32}``...).
        plan: a :class:`~ropescale.patching.plan.PatchPlan` already made for this model (by
            ``plan_patch`` on its config), applied as it is instead of planning again from the
            arguments above, which must then be left out: ``ropescale patch`` prints a plan and
            writes the checkpoint from that same object.
        **hf_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``dtype``, ``device_map``,
            ``attn_implementation``...).

    Returns:
        The loaded ``PreTrainedModel`` in eval mode, its config carrying the provenance block.
    """
    from transformers import AutoModelForCausalLM

    given, plan = plan, None
    scaling = as_scaling(
        method,
        factor,
        original_max_position_embeddings,
        replace,
        sliding_window,
        target_length=target_length,
        **(method_params or {}),
    )
    loose = scaling.factor is not None or scaling.params or scaling.target_length is not None
    if given is not None and (loose or not scaling.as_saved):
        raise ValueError("give from_pretrained either a plan or method/factor/target_length/parameters, not both")
    if scaling.as_saved and loose:
        raise ValueError("factor/target_length/method parameters given without a method")
    scaling.check()  # a wrong name or parameter fails before any conversion or download
    # a plan made beforehand carries its own window (its Scaling's), unless one is given here too
    sliding_window = FROM_PLAN if given is not None and sliding_window == KEEP else scaling.sliding_window
    resolved = resolve_model(name_or_path)
    shared = {k: hf_kwargs[k] for k in _SHARED_KWARGS if k in hf_kwargs}
    config = _read_config(resolved, scaling.original_context, **shared)
    check_supported(config)
    if given is not None:
        plan = given
    elif not scaling.as_saved:
        plan = plan_scaling(config, scaling)
    else:
        plan = plan_from_provenance(config)
        if plan is not None and not plan.custom_rotary:
            plan = None  # natively scaled: transformers builds it from the saved config alone
    if plan is not None and plan.native:
        # transformers builds the scaled rotary module itself from the patched config, which is also the
        # one to check (a native plan rewrites every field buildable_config would unwind)
        build = checked = patched_copy(config, plan, sliding_window)
    else:
        build = buildable_config(config)
        checked = config if plan is None else patched_copy(config, plan, sliding_window, quietly=True)
    _check_runnable(checked, resolved)  # what no loader can run stops before the weights
    hf_kwargs = {k: v for k, v in hf_kwargs.items() if k != "trust_remote_code"}
    if "gguf_file" not in resolved.kwargs:
        if Path(resolved.path).is_dir():
            check_weights_format(resolved.path)  # a pickled pytorch_model.bin, named, before anything loads
        hf_kwargs.setdefault("use_safetensors", True)  # never the pickled weights beside (or instead of) them
    with quiet_transformers():
        model = _load(AutoModelForCausalLM, resolved, config=build, **hf_kwargs)
    if "gguf_file" in resolved.kwargs:
        drop_gguf_quantizer(model)
    if plan is not None and plan.custom_rotary:  # non-native method or attention-level mode
        apply_plan(model.config, plan, sliding_window)
        install_rotary(model, plan)
    return model.eval()
