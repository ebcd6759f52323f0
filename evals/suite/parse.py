"""Reading a suite: a YAML file (by path or by name from ``evals/suites/``) or a dict, checked into a
:class:`~.spec.Suite` before anything is loaded. Evaluation suites are methods × tasks × lengths on one
model, resumable, ending in a report.

A suite is a YAML file (``evals/suites/*.yaml``)::

    name: smollm2-x4
    model: smollm2-135m
    dtype: auto               # auto (bfloat16 on CUDA and bf16 CPUs, else float32) | float32 | bfloat16 | float16
    device: auto              # auto (cuda when available) | cpu | cuda | cuda:N | mps
    attn_implementation: auto # auto (flash_attention_2 on CUDA when installed, else sdpa) | sdpa | eager
    data: austen              # any --data value (see ropescale.data.documents)
    seed: 0
    note: why the matrix is what it is   # printed in the report
    target_length: 4L         # the N that lengths/factors may name as 'target' (--target-length overrides)
    methods:                  # label defaults to the method name
      - {method: saved}       # the checkpoint's own scaling (evals/tasks/saved.py); none on an unscaled one
      - {method: none}
      - {method: yarn, factor: 4}
      - {method: yarn, factor: 4, params: {attention_factor: 1.0}, label: yarn-af1}
      - {method: linear, factor: 4, only: {passkey: [4096]}}   # this method: passkey at 4096 only
    perplexity: {lengths: [2048, 8192], mode: nonoverlap, stride: null, max_tokens: 16384}
    # lengths (and `only`'s) may be relative to the model's trained context L or its shipped context S:
    # L/4, L, 2L, S, target; a factor may be target/L or target/S (evals/suite/lengths.py) -- one suite
    # fits every model
    passkey: {lengths: [4096, 8192], depths: [0.25, 0.75], trials: 2}
    needle: {task: niah_single, lengths: [4096], depths: [0.5], trials: 2}
    ruler: {tasks: [niah_single_1, vt], samples: 30, lengths: [4096]}
    longppl: {lengths: [16384], documents: 2}   # evaluator: the model unscaled unless named

The task blocks are the rows of :mod:`.task_table`: each task's keys, defaults and checks are its
settings dataclass's fields, and a cell runs through its row (adding a task adds no branch here).

Every (method, task, length) cell is written atomically to ``cells/`` as soon as it finishes and
is never recomputed (unless its method settings or resolved runtime — device, dtype, attention
kernel — differ from this run's), so an interrupted run loses at most the cell in flight. The model is
loaded once and re-patched per method (patching touches the rotary module, not the weights).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ropescale._yaml import DuplicateKeyError, safe_load
from ropescale.evals.suite.checks import check_raw
from ropescale.evals.suite.lengths import positive_ints
from ropescale.evals.suite.spec import ATTENTIONS, DTYPES, MethodEntry, Suite
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.saved import check_file_names, is_saved
from ropescale.evals.tasks.task_base import SuiteError, suite_meta
from ropescale.methods.types import MethodParams

SUITES_DIR = Path(__file__).parent.parent / "suites"


def _read_lengths(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a suite dict whose lengths written with k (``32k``) are token counts, through the
    one length parser of the command line (:func:`ropescale.options.length`); what is not a length
    is left for the type checks to name."""
    from ropescale import options

    def read(name: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return options.length(value, name)
        except ValueError:
            return value  # named by the type checks ("... must be positive integers, got '4q'")

    from dataclasses import fields

    out = dict(raw)
    for task, row in task_table.TABLE.items():
        settings = out.get(task)
        if isinstance(settings, dict):
            settings = dict(settings)
            if isinstance(settings.get("lengths"), list):
                settings["lengths"] = [read(f"{task}.lengths", v) for v in settings["lengths"]]
            for key in (f.name for f in fields(row.settings) if suite_meta(f).get("length")):
                if key in settings:
                    settings[key] = read(f"{task}.{key}", settings[key])
            out[task] = settings
    if isinstance(out.get("methods"), list):
        methods = []
        for i, entry in enumerate(out["methods"]):
            if isinstance(entry, dict) and isinstance(entry.get("only"), dict):
                only = {
                    t: [read(f"methods[{i}].only.{t}", v) for v in ls] if isinstance(ls, list) else ls
                    for t, ls in entry["only"].items()
                }
                entry = {**entry, "only": only}
            methods.append(entry)
        out["methods"] = methods
    return out


def suite_from_dict(raw: dict[str, Any], default_name: str = "suite", source: str = "suite") -> Suite:
    """Validate a suite dict (from YAML or built by the CLI) into a :class:`Suite` (``source``: the
    file named in errors). Relative lengths must have been resolved (:mod:`.lengths`)."""
    from ropescale.methods import get_method
    from ropescale.patching.plan import kv_consistent_option

    if not isinstance(raw, dict):
        raise SuiteError("a suite must be a mapping with model, methods and at least one task")
    known = (
        "name",
        "model",
        "dtype",
        "device",
        "attn_implementation",
        "data",
        "seed",
        "note",
        "sized",
        "target_length",
        "shipped_context",
        "methods",
        *task_table.names(),
    )
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SuiteError(f"unknown suite key '{unknown[0]}'; known: {', '.join(known)}")
    raw = _read_lengths(raw)  # 4k = 4096, as the docs write lengths
    check_raw(raw)  # types and task settings: nothing is loaded before the whole suite is valid
    shipped_context = _shipped_context(raw.get("shipped_context"), "shipped_context", source)
    methods = []
    for i, entry in enumerate(raw.get("methods") or []):
        if isinstance(entry, str):
            entry = {"method": entry}
        if not isinstance(entry, dict) or "method" not in entry:
            raise SuiteError(f"methods[{i}] must be a mapping with a 'method' key")
        params = dict(entry.get("params") or {})
        factor = entry.get("factor")
        # patch options, not method parameters: KV consistency, and building on the checkpoint's own scaling
        method_params = {k: v for k, v in params.items() if k not in ("kv_consistent", "compose", "shipped_context")}
        if "compose" in params and not isinstance(params["compose"], bool):
            raise SuiteError(f"methods[{i}].params.compose must be true or false, got {params['compose']!r}")
        params = _with_shipped_context(params, shipped_context, f"methods[{i}].params", source)
        if is_saved(entry["method"]):
            if factor is not None or params:
                raise SuiteError(
                    f"methods[{i}] of {source}: '{entry['method']}' runs the checkpoint's own scaling; it takes no "
                    "factor or params (name a method to replace it)"
                )
        else:
            scaling = get_method(entry["method"], **method_params, **({"factor": factor} if factor is not None else {}))
            kv_consistent_option(scaling, params.get("kv_consistent"))  # validates
        label = str(entry.get("label") or entry["method"])
        only = entry.get("only") or {}
        if not isinstance(only, dict):
            raise SuiteError(f"methods[{i}].only must map tasks to lengths, e.g. {{passkey: [4096]}}")
        only = {
            str(task): lengths if lengths == [] else positive_ints(f"methods[{i}].only.{task}", lengths)
            for task, lengths in only.items()
        }  # [] skips the task for this method
        methods.append(MethodEntry(label, entry["method"], factor, params, only))
    if not methods:
        raise SuiteError("a suite needs at least one method")
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise SuiteError(f"method labels must be unique, got {labels}")
    check_file_names(labels, source)
    name = str(raw.get("name") or default_name)
    if name in (".", "..") or not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*", name):
        raise SuiteError(
            f"name {name!r} of {source} must be one folder name (letters, digits, '.', '_', '-'): it names "
            "the default results folder runs/<name>"
        )
    suite = Suite(
        name=name,
        model=str(raw.get("model") or "smollm2-135m"),
        methods=methods,
        dtype=str(raw.get("dtype") or "auto"),
        device=str(raw.get("device") or "auto"),
        attn_implementation=str(raw.get("attn_implementation") or "auto"),
        data=raw.get("data"),
        seed=int(raw.get("seed") or 0),
        note=str(raw["note"]).strip() if raw.get("note") else None,
        sized=str(raw["sized"]).strip() if raw.get("sized") else None,
        target_length=raw.get("target_length"),
        shipped_context=shipped_context,
        blocks={t: raw[t] for t in task_table.names() if raw.get(t)},
    )
    if suite.dtype not in DTYPES:
        raise SuiteError(f"dtype must be one of {', '.join(DTYPES)}, got {suite.dtype!r}")
    if suite.attn_implementation not in ATTENTIONS:
        raise SuiteError(
            f"attn_implementation must be one of {', '.join(ATTENTIONS)}, got {suite.attn_implementation!r}"
        )
    if not suite.tasks():
        raise SuiteError(f"a suite needs at least one task ({', '.join(task_table.names())})")
    for task in suite.tasks():
        settings = suite.block(task)
        if not isinstance(settings, dict):
            raise SuiteError(f"{task} must be a mapping with at least 'lengths'")
        positive_ints(f"{task}.lengths", settings.get("lengths"))
    for m in suite.methods:
        for task, lengths in m.only.items():
            if task not in suite.tasks():
                raise SuiteError(f"'only' of method '{m.label}' names task '{task}', which this suite does not run")
            extra = sorted(set(lengths) - set(suite.block(task)["lengths"]))
            if extra:
                raise SuiteError(f"'only' of method '{m.label}' asks {task} at {extra[0]}, not among {task}.lengths")
    return suite


def _shipped_context(value: Any, key: str, source: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SuiteError(f"{key} of {source} must be a positive token count such as 131072, got {value!r}")
    return value


def _with_shipped_context(params: MethodParams, shipped: int | None, key: str, source: str) -> MethodParams:
    """A method's parameters with the suite's shipped context where it composes on the shipped scaling (the
    context its second ramp is measured in: the cells record it, and a cell of another S is not done);
    a replacing method starts from the pretraining context, where a shipped context means nothing."""
    own = _shipped_context(params.get("shipped_context"), f"{key}.shipped_context", source)
    if own is not None and params.get("compose") is not True:
        raise SuiteError(
            f"{key}.shipped_context of {source} is given to a method that replaces the shipped scaling (it starts "
            "from the pretraining context): add compose: true, or drop it"
        )
    if own is not None and shipped is not None and own != shipped:
        raise SuiteError(f"{key}.shipped_context of {source} is {own}, the suite's shipped_context {shipped}: give one")
    if shipped is not None and params.get("compose") is True:
        return {**params, "shipped_context": shipped}
    return params


def load_suite(
    path_or_name: str | Path,
    model: str | None = None,
    target_length: int | None = None,
    data: str | None = None,
    lengths: list[int | str] | None = None,
    samples: int | None = None,
    shipped_context: int | None = None,
) -> Suite:
    """A suite from a YAML path, or by name from ``evals/suites/``; ``model``, ``target_length`` and
    ``data`` replace the file's (``ropescale eval suite NAME --model PATH``), relative lengths are
    resolved against the model's trained context L and shipped context S (:func:`.lengths.prepare`). ``lengths`` and
    ``samples`` size it down (``--lengths``, ``--samples``: :mod:`.size`), so that a suite
    written for a small model fits the time a large one allows."""
    from ropescale.evals.suite import size as suite_size

    path = Path(path_or_name)
    if not path.is_file() and (SUITES_DIR / f"{path_or_name}.yaml").is_file():
        path = SUITES_DIR / f"{path_or_name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SUITES_DIR.glob("*.yaml")))
        raise SuiteError(f"suite '{path_or_name}' not found (a YAML path, or one of: {known})")
    try:
        raw = safe_load(path.read_text(), str(path))
    except DuplicateKeyError as exc:
        raise SuiteError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise SuiteError(f"suite '{path}' is not valid YAML: {' '.join(str(exc).split())}") from None
    from ropescale.evals.suite.lengths import prepare

    samples = suite_size.check_samples(samples)
    resolved = prepare(
        suite_size.with_lengths(raw, lengths),
        f"suite '{path}'",
        model=model,
        target_length=target_length,
        data=data,
        shipped_context=shipped_context,
    )
    raw = resolved.raw
    if lengths is not None:
        raw = suite_size.keep_only_asked(_read_lengths(raw))
    suite = suite_from_dict(raw, default_name=path.stem, source=f"suite '{path}'")
    said: list[str] = []
    if samples is not None:
        suite, said = suite_size.with_samples(suite, samples)
    sized = suite_size.sized_text(lengths, samples, suite, said)
    if sized:
        suite.sized = sized
    suite.contexts = resolved.contexts
    return suite
