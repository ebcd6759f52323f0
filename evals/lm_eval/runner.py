"""Run lm-eval tasks on a RoPE-scaled model: :func:`run_harness`, the task manager, results files.

The task folder ``evals/lm_eval/tasks`` (installed as ``ropescale/evals/lm_eval/tasks``: ``passkey_2k`` ...
``passkey_128k`` and the group ``ropescale_passkey``; lm-eval has its own ``passkey``, a LIBRA Hub
task) is always on the include path. The model's tokenizer is handed to the tasks as metadata
(RULER and the passkey tasks size their prompts with it), and RULER's ``max_seq_lengths``
defaults to ``[max_length]``: lm-eval's own default is ``[4096]``, within most models' trained
context (see :mod:`ropescale.evals.lm_eval.checks`).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.lm_eval.model import MODEL_NAME, lm_eval_missing, register_lm_eval_model
from ropescale.evals.tasks.records import JSONValue

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
RESULTS_FILE = "results.json"


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
    method_params: dict[str, JSONValue] | None = None,
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
        raise lm_eval_missing() from exc

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
    scaling = getattr(lm, "scaling", None) or {}  # read back from the loaded model (evals/tasks/saved.py)
    results["ropescale"] = {
        "model": name,
        "method": scaling.get("method", block.get("method")),
        "factor": scaling.get("factor", (block.get("params") or {}).get("factor")),
        "scaling": scaling or None,
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

    from ropescale.patching.readback import scaling_label

    info = results.get("ropescale", {})
    scaling = info.get("scaling")
    if isinstance(scaling, dict) and scaling.get("method"):
        what = f"scaling {scaling_label(scaling)} ({scaling.get('as', '?')})"
    else:
        method, factor = info.get("method") or "none", info.get("factor")
        what = f"method {method}" + (f" x{factor:g}" if isinstance(factor, (int, float)) and info.get("method") else "")
    head = (
        f"model {info.get('model', '?')}, {what}"
        + f", max_length {info.get('max_length', '?')}, limit {info.get('limit')}"
    )
    parts = [head, make_table(results)]
    if results.get("groups"):
        parts.append(make_table(results, "groups"))
    return "\n".join(parts)
