"""lm-evaluation-harness integration: the ``ropescale`` model, :func:`run_harness` and ``ropescale eval harness``.

Importing this module registers the lm-eval model ``ropescale`` (an ``HFLM`` subclass that loads
and patches through :func:`ropescale.from_pretrained`). lm-eval 0.4.13 discovers no external
models by itself (no entry points), so use one of::

    ropescale eval harness --model smollm2-135m --method yarn --factor 4 --tasks passkey_4k
    python -m ropescale.evals.harness run --model ropescale \\
        --model_args pretrained=smollm2-135m,method=yarn,factor=4 --tasks passkey_4k
    python -c "import ropescale.evals.harness, lm_eval; lm_eval.simple_evaluate(model='ropescale', ...)"

``python -m ropescale.evals.harness`` is lm-eval's own CLI (``lm-eval run|ls|validate``) with the
model registered and, unless ``--include_path`` is given, this package's task folder
(``passkey_2k`` ... ``passkey_128k`` and the group ``ropescale_passkey``; lm-eval has its own
``passkey``, a LIBRA Hub task) on the task path.

Model arguments (``--model_args``): ``pretrained`` (model name, directory, .gguf or Hub id, as for
``ropescale.from_pretrained``), ``method`` (none for no scaling), ``factor``,
``target_length`` (instead of factor, where ropescale supports it), ``original_max_position_embeddings``,
``replace``, ``sliding_window`` (keep/none/N),
``param_<name>=value`` for method parameters (``param_beta_fast=32``), ``max_length`` (default:
the scaled context, ``config.ropescale["extended_context"]`` = factor x original, also for the
dynamic methods whose ``max_position_embeddings`` stays at the original), ``dtype``
(auto/float32/bfloat16/float16), ``device`` (default cuda when available, else cpu),
``tokenizer``, ``attn_implementation``, plus HFLM's ``batch_size``, ``max_batch_size``,
``add_bos_token``, ``truncation``, ``logits_cache``, ``softmax_dtype``, ``mixed_precision_dtype``,
``prefix_token_id``, ``think_end_token``, ``enable_thinking``, ``chat_template_args``. Unknown
arguments are an error (HFLM would silently ignore them for a ready model).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ropescale.errors import MissingDependencyError, RopescaleError

MODEL_NAME = "ropescale"
MODEL_TARGET = "ropescale.evals.harness:RopescaleLM"  # also when this file runs as __main__
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
RESULTS_FILE = "results.json"

log = logging.getLogger(__name__)

# Arguments given to ropescale.from_pretrained as scaling options / transformers loading options.
_SCALING_ARGS = ("method", "factor", "target_length", "original_max_position_embeddings", "replace", "sliding_window")
_LOAD_ARGS = (
    "attn_implementation",
    "revision",
    "trust_remote_code",
    "local_files_only",
    "cache_dir",
    "token",
    "subfolder",
)
# HFLM arguments that still matter when HFLM is given a ready model.
_HFLM_ARGS = (
    "batch_size",
    "max_batch_size",
    "add_bos_token",
    "truncation",
    "logits_cache",
    "softmax_dtype",
    "mixed_precision_dtype",
    "prefix_token_id",
    "think_end_token",
    "enable_thinking",
    "chat_template_args",
    "backend",
    "use_fast_tokenizer",
)
_PARAM_PREFIX = "param_"
_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _lm_eval_missing() -> MissingDependencyError:
    return MissingDependencyError("lm-eval is not installed: pip install 'lm-eval[ruler]' (or ropescale[eval])")


# --------------------------------------------------------------------------------------------
# Argument normalisation (no lm-eval or torch needed)
# --------------------------------------------------------------------------------------------


def _none_like(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    try:
        number = int(str(value).strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer, got {value!r}") from None
    if number <= 0 or (isinstance(value, float) and number != value):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def _parse_value(value: Any) -> Any:
    """lm-eval hands strings for values it could not type (``[1,2]``, ``1e4``...): read them as YAML."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _parse_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", ""):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _parse_sliding_window(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() == "keep":
        return "keep"
    if _none_like(value):
        return None
    return _positive_int("sliding_window", value)


def _parse_dtype(value: Any) -> Any:
    import torch

    if _none_like(value) or value == "auto":
        return "auto"
    if isinstance(value, torch.dtype):
        return value
    name = str(value).strip().lower().removeprefix("torch.")
    name = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(
        name, name
    )
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {value!r}")
    return getattr(torch, name)


def _resolve_device(value: Any) -> str:
    """HFLM's defaults (``cuda``, the CLI's ``cuda:0``) fall back to the CPU when there is no GPU."""
    import torch

    if _none_like(value):
        return "cuda" if torch.cuda.is_available() else "cpu"
    device = str(value).strip()
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.info("ropescale: no CUDA device, using the CPU instead of %s", device)
        return "cpu"
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {value!r}") from None
    return device


def split_model_args(args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Sort ``--model_args`` into scaling, loading, method-parameter and HFLM groups; reject unknown keys."""
    groups: dict[str, dict[str, Any]] = {"scaling": {}, "load": {}, "params": {}, "hflm": {}}
    unknown = []
    for key, value in args.items():
        if key in _SCALING_ARGS:
            groups["scaling"][key] = value
        elif key in _LOAD_ARGS:
            groups["load"][key] = value
        elif key in _HFLM_ARGS:
            groups["hflm"][key] = value
        elif key.startswith(_PARAM_PREFIX) and len(key) > len(_PARAM_PREFIX):
            groups["params"][key[len(_PARAM_PREFIX) :]] = _parse_value(value)
        else:
            unknown.append(key)
    if unknown:
        accepted = ", ".join(
            [
                "pretrained",
                *_SCALING_ARGS,
                "param_<name>",
                "max_length",
                "dtype",
                "device",
                "tokenizer",
                *_LOAD_ARGS,
                *_HFLM_ARGS,
            ]
        )
        raise ValueError(f"unknown model_args for '{MODEL_NAME}': {', '.join(sorted(unknown))} (accepted: {accepted})")
    return groups


def default_max_length(config: Any) -> int:
    """The context the scaled model is meant for: ``config.ropescale["extended_context"]`` (factor x
    original, also for dynamic methods whose ``max_position_embeddings`` stays at the original),
    else ``max_position_embeddings``."""
    block = getattr(config, "ropescale", None) or {}
    extended = block.get("extended_context") if isinstance(block, dict) else None
    if extended:
        return int(extended)
    return int(config.max_position_embeddings)


# --------------------------------------------------------------------------------------------
# The lm-eval model
# --------------------------------------------------------------------------------------------


class _DropReadyModelNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return "model kwarg is not of type `str`" not in text and "already-initialized model" not in text


def _build_lm_class() -> type:
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError as exc:
        raise _lm_eval_missing() from exc

    class RopescaleLM(HFLM):
        """lm-eval's HF model with the checkpoint loaded and RoPE-scaled by ropescale.

        ``RopescaleLM(pretrained="smollm2-135m", method="yarn", factor=4, max_length=32768)``, or
        ``RopescaleLM(pretrained=<a ready PreTrainedModel>, tokenizer=<its tokenizer>)`` for a model
        already patched (then no scaling arguments). See the module docstring for every argument.
        """

        def __init__(
            self,
            pretrained: Any = "smollm2-135m",
            max_length: Any = None,
            dtype: Any = "auto",
            device: Any = None,
            tokenizer: Any = None,
            method_params: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> None:
            import ropescale

            groups = split_model_args(kwargs)
            scaling, params = groups["scaling"], {**(method_params or {}), **groups["params"]}
            method = scaling.get("method")
            method = None if _none_like(method) else str(method).strip()
            factor = scaling.get("factor")
            factor = None if _none_like(factor) else factor
            explicit_max_length = None if _none_like(max_length) else _positive_int("max_length", max_length)
            target_length = scaling.get("target_length")
            if not _none_like(target_length):  # newer ropescale: factor = target_length / original context
                load_kwargs_extra = {"target_length": _positive_int("target_length", target_length)}
            else:
                load_kwargs_extra = {}
            if isinstance(pretrained, str):
                name = pretrained.strip()
                if not name:
                    raise ValueError(f"model_args for '{MODEL_NAME}' need pretrained=<model name or path>")
                load_kwargs = dict(groups["load"])
                load_kwargs["dtype"] = _parse_dtype(dtype)
                target_device = _resolve_device(device)
                model = ropescale.from_pretrained(
                    name,
                    method=method,
                    factor=factor,
                    original_max_position_embeddings=(
                        None
                        if _none_like(scaling.get("original_max_position_embeddings"))
                        else _positive_int(
                            "original_max_position_embeddings", scaling["original_max_position_embeddings"]
                        )
                    ),
                    replace=_parse_bool("replace", scaling.get("replace", False)),
                    sliding_window=_parse_sliding_window(scaling.get("sliding_window", "keep")),
                    method_params=params or None,
                    **load_kwargs_extra,
                    **load_kwargs,
                )
                model.to(target_device)
                if tokenizer is None or isinstance(tokenizer, str):
                    tokenizer = ropescale.load_tokenizer(tokenizer or name)
            else:
                if not hasattr(pretrained, "config"):
                    raise ValueError(
                        "pretrained must be a model name or path or a transformers model, "
                        f"got {type(pretrained).__name__}"
                    )
                if method is not None or factor is not None or params or load_kwargs_extra:
                    raise ValueError(
                        "a ready model is used as it is: scale it first (ropescale.patch) or pass its name"
                    )
                if tokenizer is None:
                    raise ValueError("a ready model needs its tokenizer: pass tokenizer=")
                if isinstance(tokenizer, str):
                    tokenizer = ropescale.load_tokenizer(tokenizer)
                model = pretrained
                name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
            default = default_max_length(model.config)
            max_length = explicit_max_length or default
            if max_length > default:
                log.warning(
                    "ropescale: max_length %d is beyond the model's %s context %d",
                    max_length,
                    "scaled" if getattr(model.config, "ropescale", None) else "trained",
                    default,
                )
            hf_log = logging.getLogger(HFLM.__module__)
            quiet = _DropReadyModelNotes()
            hf_log.addFilter(quiet)  # HFLM warns twice that it was given a model object: intended here
            try:
                super().__init__(pretrained=model, tokenizer=tokenizer, max_length=max_length, **groups["hflm"])
            finally:
                hf_log.removeFilter(quiet)
            self.pretrained = name
            self.ropescale_config = dict(getattr(model.config, "ropescale", None) or {})

        def get_model_info(self) -> dict[str, Any]:
            """HFLM's model info without its Hub lookup (offline-safe), plus the ropescale block."""
            model = self._model
            return {
                "model_num_parameters": sum(p.numel() for p in model.parameters()),
                "model_dtype": str(getattr(model, "dtype", "")),
                "model_name": self.pretrained,
                "max_length": self.max_length,
                "ropescale": self.ropescale_config or None,
            }

    RopescaleLM.__module__ = MODEL_TARGET.partition(":")[0]
    RopescaleLM.__qualname__ = "RopescaleLM"
    return RopescaleLM


def __getattr__(name: str) -> Any:
    # The class is built on first use: importing lm-eval's HF model costs seconds, and the CLI
    # imports this module just to register its sub-command.
    if name == "RopescaleLM":
        cls = _build_lm_class()
        globals()["RopescaleLM"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_lm_eval_model() -> bool:
    """Register ``ropescale`` in lm-eval's model registry (lazily: the class loads on first use).

    Returns:
        False when lm-eval is not installed.
    """
    try:
        import lm_eval.models  # noqa: F401 - lm-eval's own models first (get_model skips them otherwise)
        from lm_eval.api.registry import model_registry
    except ImportError:
        return False
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    return True


register_lm_eval_model()


# --------------------------------------------------------------------------------------------
# Library entry point
# --------------------------------------------------------------------------------------------


def _task_list(tasks: str | Sequence[str]) -> list[str]:
    items = tasks.split(",") if isinstance(tasks, str) else [t for item in tasks for t in str(item).split(",")]
    names = [t.strip() for t in items if t.strip()]
    if not names:
        raise ValueError("no tasks given")
    return names


def _include_paths(include_path: str | os.PathLike | Sequence[str | os.PathLike] | None) -> list[str]:
    if include_path is None:
        given = []
    elif isinstance(include_path, (str, os.PathLike)):
        given = [include_path]
    else:
        given = list(include_path)
    paths = [str(TASKS_DIR)]
    for p in given:
        path = Path(p).expanduser()
        if not path.is_dir():
            raise ValueError(f"include path '{p}' is not a directory")
        if str(path.resolve()) not in paths:
            paths.append(str(path.resolve()))
    return paths


def task_manager(tasks: list[str], include_path: Any = None, metadata: dict[str, Any] | None = None) -> Any:
    """An lm-eval ``TaskManager`` that knows ``tasks``: this package's tasks and ``include_path``
    first; lm-eval's ~15k built-in tasks (about 12 s to index) only when a task needs them."""
    from lm_eval.tasks import TaskManager

    paths = _include_paths(include_path)
    manager = TaskManager(include_path=paths, include_defaults=False, metadata=metadata)
    if not set(tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=paths, include_defaults=True, metadata=metadata)
    missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        raise ValueError(
            f"unknown task(s): {', '.join(missing)} (not in lm-eval, {TASKS_DIR.name}/ or the include path; "
            "list them with `lm-eval ls tasks`)"
        )
    return manager


def _tokenizer_source(name: str, tokenizer: Any, stack: ExitStack, temporary: list[str]) -> str | None:
    """A path or name the tasks can load the model's tokenizer from (RULER sizes its prompts with it).

    A tokenizer object, or one inside a .gguf file, is saved to a temporary directory (listed in
    ``temporary``) that lives as long as ``stack``.
    """
    from ropescale.models.loading import load_tokenizer, resolve_model

    if isinstance(tokenizer, str) and tokenizer.strip():
        tokenizer = tokenizer.strip()
        try:
            resolved = resolve_model(tokenizer)
        except RopescaleError:
            return tokenizer
        name = tokenizer
    elif tokenizer is not None:  # an object: save it where AutoTokenizer can read it
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ropescale-tok-"))
        tokenizer.save_pretrained(tmp)
        temporary.append(tmp)
        return tmp
    else:
        resolved = resolve_model(name)
    path = Path(resolved.path)
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if not resolved.kwargs and path.is_dir() and any((path / f).is_file() for f in tokenizer_files):
        return str(path)
    if not resolved.kwargs and not path.exists():
        return resolved.path  # a Hub id
    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ropescale-tok-"))
    load_tokenizer(name).save_pretrained(tmp)  # a .gguf file: give the tasks a plain tokenizer directory
    temporary.append(tmp)
    return tmp


def _limit(limit: Any) -> int | float | None:
    if limit is None:
        return None
    if isinstance(limit, bool):
        raise ValueError(f"limit must be a positive number, got {limit!r}")
    try:
        value = float(limit)
    except (TypeError, ValueError):
        raise ValueError(f"limit must be a positive number, got {limit!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"limit must be a positive number, got {limit!r}")
    if value < 1:
        return value  # lm-eval: a fraction of each task's documents
    if value != int(value):
        raise ValueError(f"limit must be a whole number of documents or a fraction below 1, got {limit!r}")
    return int(value)


def results_path(output_path: str | os.PathLike) -> Path:
    """``output_path`` itself when it ends in .json, else ``output_path/results.json``."""
    path = Path(output_path).expanduser()
    return path if path.suffix == ".json" else path / RESULTS_FILE


def _check_writable(path: Path) -> None:
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise RopescaleError(f"output '{parent}' exists and is not a directory")
    if path.exists() and path.is_dir():
        raise RopescaleError(f"output '{path}' is a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=parent).close()
    except OSError as exc:
        raise RopescaleError(f"output '{path}' is not writable: {exc.strerror or exc}") from None


def jsonable(obj: Any) -> Any:
    """lm-eval's results as plain JSON types (dtypes, numpy numbers, sets... converted)."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(obj, default=handle_non_serializable))


def run_harness(
    model: Any = "smollm2-135m",
    tasks: str | Sequence[str] = "passkey_4k",
    *,
    method: str | None = None,
    factor: Any = None,
    original_max_position_embeddings: int | None = None,
    replace: bool = False,
    sliding_window: Any = "keep",
    method_params: dict[str, Any] | None = None,
    target_length: int | None = None,
    max_length: int | None = None,
    dtype: Any = "auto",
    device: str | None = None,
    batch_size: int | str = 1,
    tokenizer: Any = None,
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    limit: int | float | None = None,
    output_path: str | os.PathLike | None = None,
    metadata: dict[str, Any] | None = None,
    gen_kwargs: dict[str, Any] | None = None,
    log_samples: bool = False,
    random_seed: int = 0,
    **model_kwargs: Any,
) -> dict[str, Any]:
    """Evaluate a RoPE-scaled model on lm-eval tasks and return lm-eval's results dict.

    Args:
        model: model name / directory / .gguf / Hub id (loaded and scaled with the arguments below),
            or a ready lm-eval ``LM`` (e.g. a ``RopescaleLM``; scaling arguments must then be left out).
        tasks: task, group or tag names (list or comma-separated): this package's ``passkey_*`` /
            ``ropescale_passkey``, lm-eval's own (``niah_single_1``...) or ones under ``include_path``.
        method, factor, original_max_position_embeddings, replace, sliding_window, method_params:
            as for :func:`ropescale.from_pretrained`; ``method=None`` evaluates the model as it is.
        target_length: instead of ``factor``, the context to reach (where ropescale supports it).
        max_length: lm-eval's context limit (default: the scaled context, see :func:`default_max_length`).
        dtype, device, batch_size, tokenizer: as the ``ropescale`` model's arguments.
        include_path: extra task folder(s); this package's task folder is always included.
        limit: documents per task (an integer, or a fraction below 1).
        output_path: write the results as JSON (atomically): a ``.json`` file, or a directory that
            receives ``results.json``. Checked before the model is loaded.
        metadata: task metadata (``{"max_seq_lengths": [4096]}`` for RULER, ``passkey_samples``...);
            ``pretrained`` and ``tokenizer`` (the model's tokenizer, as a loadable path) are added
            unless given, so RULER and the passkey tasks size prompts with the model's tokenizer,
            and ``max_seq_lengths`` (RULER's lengths) defaults to ``[max_length]``.
        gen_kwargs: generation overrides for every generate_until task.
        log_samples: keep per-document samples under ``results["samples"]``.
        random_seed: lm-eval's Python seed (numpy/torch/few-shot seeds stay at lm-eval's defaults).
        **model_kwargs: more ``ropescale`` model arguments (``attn_implementation``, ``add_bos_token``...).

    Returns:
        lm-eval's results dict (``results``, ``groups``, ``configs``, ``n-samples``, ``config``...)
        in plain JSON types, with a ``ropescale`` entry describing the scaled model.
    """
    try:
        import lm_eval
        from lm_eval.api.model import LM
    except ImportError as exc:
        raise _lm_eval_missing() from exc

    task_names = _task_list(tasks)
    limit = _limit(limit)
    out = results_path(output_path) if output_path is not None else None
    if out is not None:
        _check_writable(out)
    register_lm_eval_model()
    temporary: list[str] = []
    with ExitStack() as stack:
        if isinstance(model, LM):
            scaling = (method, factor, target_length, original_max_position_embeddings, method_params, max_length)
            if any(v is not None for v in scaling):
                raise ValueError(
                    "a ready lm-eval model is used as it is: give scaling arguments only with a model name"
                )
            lm = model
            name = getattr(lm, "pretrained", None)
            if not isinstance(name, str):
                config = getattr(getattr(lm, "model", None), "config", None)
                name = str(getattr(config, "_name_or_path", "") or type(lm).__name__)
            tok_source = _tokenizer_source(name, getattr(lm, "tokenizer", None), stack, temporary)
        elif isinstance(model, (str, os.PathLike)):
            name = str(model)
            tok_source = _tokenizer_source(name, tokenizer, stack, temporary)
            lm = None
        else:
            raise ValueError(f"model must be a model name or path or an lm-eval LM, got {type(model).__name__}")
        task_metadata = {"pretrained": name, "tokenizer": tok_source, **(metadata or {})}
        manager = task_manager(task_names, include_path, task_metadata)
        if lm is None:
            lm_cls = lm_eval.api.registry.get_model(MODEL_NAME)
            lm = lm_cls(
                pretrained=name,
                method=method,
                factor=factor,
                original_max_position_embeddings=original_max_position_embeddings,
                replace=replace,
                sliding_window=sliding_window,
                method_params=method_params,
                max_length=max_length,
                **({} if target_length is None else {"target_length": target_length}),
                dtype=dtype,
                device=device,
                batch_size=batch_size,
                tokenizer=tokenizer,
                **model_kwargs,
            )
        if "max_seq_lengths" not in task_metadata:  # RULER's lengths: lm-eval's default goes to 128k
            task_metadata["max_seq_lengths"] = [int(lm.max_length)]
            if getattr(getattr(manager, "_factory", None), "_meta", None) is not task_metadata:
                manager = task_manager(task_names, include_path, task_metadata)  # it kept a copy: rebuild
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=task_names,
            limit=limit,
            task_manager=manager,
            gen_kwargs=gen_kwargs,
            log_samples=log_samples,
            random_seed=random_seed,
        )
    if results is None:  # not rank 0 in a distributed run
        return {}
    if not log_samples:
        results.pop("samples", None)
    block = getattr(lm, "ropescale_config", None) or {}
    results["ropescale"] = {
        "model": name,
        "method": block.get("method"),
        "factor": (block.get("params") or {}).get("factor"),
        "extended_context": block.get("extended_context"),
        "max_length": lm.max_length,
        "tasks": task_names,
        "limit": limit,
        "metadata": {k: v for k, v in task_metadata.items() if not (k == "tokenizer" and v in temporary)},
        "config": block or None,
    }
    results = jsonable(results)
    if out is not None:
        from ropescale._io import atomic_write_json

        atomic_write_json(out, results)
    return results


def format_results(results: dict[str, Any]) -> str:
    """A readable account of :func:`run_harness`'s results: one line on the model, lm-eval's tables."""
    from lm_eval.utils import make_table

    info = results.get("ropescale", {})
    method = info.get("method") or "none"
    factor = info.get("factor")
    head = (
        f"model {info.get('model', '?')}, method {method}"
        + (f" x{factor:g}" if isinstance(factor, (int, float)) and info.get("method") else "")
        + f", max_length {info.get('max_length', '?')}, limit {info.get('limit')}"
    )
    parts = [head, make_table(results)]
    if results.get("groups"):
        parts.append(make_table(results, "groups"))
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# `ropescale eval harness`
# --------------------------------------------------------------------------------------------

EXAMPLES = """examples:
  ropescale eval harness --method yarn --factor 4 --tasks passkey_4k,passkey_16k --limit 5
  ropescale eval harness --method none --tasks ropescale_passkey --output runs/baseline
  ropescale eval harness --factor 4 --param attention_factor=1.0 --tasks passkey_16k
  ropescale eval harness --factor 4 --tasks niah_single_1 --limit 3 --metadata max_seq_lengths=[4096]

--method none evaluates the checkpoint as it is (unscaled, or with the scaling it was saved with).
Tasks: passkey_2k/4k/8k/16k/32k/64k/128k and the group ropescale_passkey (2k-32k) from this package; any
lm-eval task (RULER's niah_single_1 works offline); more with --include-path. The model's
tokenizer is passed to the tasks as metadata (RULER and passkey size their prompts with it), and
RULER's max_seq_lengths defaults to [max length] (lm-eval's own default runs 4k to 128k).
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``harness`` to an ``eval`` sub-command group."""
    from ropescale.cli.common import add_model_args, add_scaling_args

    p = sub.add_parser(
        "harness",
        help="run lm-evaluation-harness tasks (passkey, RULER...) on a RoPE-scaled model",
        description="Load and scale a model with ropescale and evaluate it with lm-evaluation-harness. "
        "Prints lm-eval's tables; --output writes the results as JSON.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    add_scaling_args(p, factor_required=False)
    p.add_argument("--tasks", required=True, metavar="T1,T2", help="comma-separated task, group or tag names")
    p.add_argument(
        "--include-path",
        action="append",
        default=[],
        metavar="DIR",
        help="another folder of task YAMLs (repeatable; this package's tasks are always included)",
    )
    p.add_argument("--limit", default=None, metavar="N", help="documents per task (or a fraction below 1)")
    p.add_argument(
        "--output",
        default=None,
        metavar="PATH",
        help="write the results as JSON: a .json file, or a directory that receives results.json",
    )
    p.add_argument(
        "--max-length",
        default=None,
        metavar="N",
        help="context limit given to lm-eval (default: the scaled context, factor x original)",
    )
    p.add_argument("--dtype", default="auto", choices=_DTYPES, help="weights dtype (default: auto, as stored)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)")
    p.add_argument("--batch-size", default="1", metavar="N|auto", help="lm-eval batch size (default 1)")
    p.add_argument("--tokenizer", default=None, metavar="NAME", help="tokenizer to use instead of the model's")
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task metadata, repeatable or one JSON object (e.g. max_seq_lengths=[4096] for RULER)",
    )
    p.add_argument(
        "--gen-kwargs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="generation overrides for generate_until tasks, repeatable (e.g. max_gen_toks=32)",
    )
    p.add_argument("--log-samples", action="store_true", help="keep every document's prompt and output in the JSON")
    p.set_defaults(func=run)


def _key_values(items: list[str], flag: str) -> dict[str, Any]:
    from ropescale.cli.common import parse_params

    out: dict[str, Any] = {}
    for item in items:
        text = item.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{flag}: invalid JSON: {exc.msg}") from None
            if not isinstance(value, dict):
                raise ValueError(f"{flag}: expected a JSON object")
            out.update(value)
        else:
            try:
                out.update(parse_params([text]))
            except ValueError:
                raise ValueError(f"{flag} expects KEY=VALUE or a JSON object, got {item!r}") from None
    return out


def run(args: argparse.Namespace) -> int:
    from ropescale.cli.common import scaling_kwargs

    kw = scaling_kwargs(args)
    method = None if _none_like(kw["method"]) else kw["method"]
    target_length = kw.get("target_length")  # --target-length, where the CLI has it
    if method is None and (kw["factor"] is not None or target_length is not None or kw["params"]):
        raise ValueError("--factor/--target-length/--param given with --method none")
    if method is not None and kw["factor"] is None and target_length is None:
        raise ValueError(f"--method {method} needs --factor (or use --method none to evaluate the model as it is)")
    batch_size = args.batch_size
    if not str(batch_size).startswith("auto"):
        batch_size = _positive_int("--batch-size", batch_size)
    results = run_harness(
        args.model,
        args.tasks,
        method=method,
        factor=kw["factor"],
        original_max_position_embeddings=kw["original_max_position_embeddings"],
        replace=kw["replace"],
        sliding_window=kw["sliding_window"],
        method_params=kw["params"] or None,
        target_length=target_length,
        max_length=None if args.max_length is None else _positive_int("--max-length", args.max_length),
        dtype=args.dtype,
        device=args.device,
        batch_size=batch_size,
        tokenizer=args.tokenizer,
        include_path=args.include_path or None,
        limit=args.limit,
        output_path=args.output,
        metadata=_key_values(args.metadata, "--metadata") or None,
        gen_kwargs=_key_values(args.gen_kwargs, "--gen-kwargs") or None,
        log_samples=args.log_samples,
    )
    print(format_results(results))
    if args.output:
        print(f"wrote {results_path(args.output)}")
    return 0


# --------------------------------------------------------------------------------------------
# `python -m ropescale.evals.harness`: lm-eval's CLI with the model registered
# --------------------------------------------------------------------------------------------


def lm_eval_main(argv: Sequence[str] | None = None) -> None:
    """lm-eval's command line (``lm-eval run|ls|validate ...``) with ``ropescale`` registered and this
    package's tasks on the task path when ``--include_path`` is not given."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as exc:
        raise _lm_eval_missing() from exc
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not {"-h", "--help"} & set(argv) and "--include_path" not in argv:
        argv += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0] or "lm-eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    lm_eval_main()
