"""Evaluation suites: methods × tasks × lengths on one model, resumable, ending in a report.

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
    # lengths (and `only`'s) may be relative to the model's trained context L: L/4, L, 2L, target;
    # a factor may be target/L (evals/suite/lengths.py) -- one suite fits every model
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

import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale._yaml import DuplicateKeyError, safe_load
from ropescale.evals.report.cell_keys import cell_id, same_scaling, scaling_run
from ropescale.evals.report.cell_record import SuiteCell
from ropescale.evals.suite.checks import check_against_model, check_raw, entry_kernel
from ropescale.evals.suite.lengths import positive_ints
from ropescale.evals.tasks import task_table
from ropescale.evals.tasks.saved import check_file_names, is_saved
from ropescale.evals.tasks.task_base import CellContext, SuiteError, suite_meta
from ropescale.models.runtime import ATTENTIONS as RUNTIME_ATTENTIONS
from ropescale.models.runtime import DTYPES as RUNTIME_DTYPES
from ropescale.models.runtime import load_average, same_runtime
from ropescale.scaling import Scaling

DTYPES = ("auto", *RUNTIME_DTYPES)
ATTENTIONS = ("auto", *RUNTIME_ATTENTIONS)
SUITES_DIR = Path(__file__).parent.parent / "suites"


@dataclass(frozen=True)
class MethodEntry:
    label: str
    method: str
    factor: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: task → the lengths this method runs at (a subset of the task's); tasks not named run in full
    only: dict[str, list[int]] = field(default_factory=dict)

    def runs(self, task: str, length: int) -> bool:
        return task not in self.only or length in self.only[task]

    @property
    def scaling(self) -> Scaling:
        """The entry's one :class:`~ropescale.scaling.Scaling` (a shipped scaling is replaced unless it composes)."""
        return Scaling.evaluated(self.method, self.factor, self.params)

    @property
    def title(self) -> str:
        """The row name a report and a cell's line give this method: its label with its factor
        (``yarn ×4``, ``yarn-af1 ×4``), so that two rows at different factors are never read as one;
        a label that already says its factor (``yarn x2 (saved)``, ``yarn-x4``) is kept as it is."""
        if self.factor is None:
            return self.label
        factor = f"{float(self.factor):g}"
        if re.search(rf"(?<![0-9.])[x×]{re.escape(factor)}(?![0-9.])", self.label, flags=re.I):
            return self.label
        return f"{self.label} ×{factor}"


@dataclass
class Suite:
    name: str
    model: str
    methods: list[MethodEntry]
    dtype: str = "auto"
    device: str = "auto"
    attn_implementation: str = "auto"
    data: str | None = None
    seed: int = 0
    note: str | None = None
    #: task name -> its block as the suite file wrote it (lengths resolved): a cell's protocol is read from it
    blocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the target length N its relative lengths were resolved with (evals/suite/lengths.py)
    target_length: int | None = None
    #: the scaling the model's checkpoint carries (``yarn x4``), None when unscaled or not yet known
    carries: str | None = None
    #: how ``--lengths``/``--samples`` sized the suite down (:mod:`.size`), None: as its file has it
    sized: str | None = None

    def __getattr__(self, name: str) -> Any:
        """A task's block by its name (``suite.passkey``), None where the suite does not run it."""
        if name in task_table.TABLE and "blocks" in self.__dict__:
            return self.__dict__["blocks"].get(name)
        raise AttributeError(name)

    def tasks(self) -> list[str]:
        return [t for t in task_table.TABLE if self.blocks.get(t)]

    def kind(self, task: str) -> Any:
        """The row of :mod:`.task_table` that runs ``task``."""
        return task_table.get(task)

    def block(self, task: str) -> dict[str, Any]:
        return self.blocks[task]

    def settings(self, task: str) -> Any:
        """The typed settings of ``task`` (its row's dataclass: the block's values over the defaults)."""
        return task_table.get(task).read(self.blocks[task])

    def cells(self) -> list[tuple[MethodEntry, str, int]]:
        return [
            (m, t, n) for m in self.methods for t in self.tasks() for n in self.blocks[t]["lengths"] if m.runs(t, n)
        ]


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
        "methods",
        *task_table.names(),
    )
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SuiteError(f"unknown suite key '{unknown[0]}'; known: {', '.join(known)}")
    raw = _read_lengths(raw)  # 4k = 4096, as the docs write lengths
    check_raw(raw)  # types and task settings: nothing is loaded before the whole suite is valid
    methods = []
    for i, entry in enumerate(raw.get("methods") or []):
        if isinstance(entry, str):
            entry = {"method": entry}
        if not isinstance(entry, dict) or "method" not in entry:
            raise SuiteError(f"methods[{i}] must be a mapping with a 'method' key")
        params = dict(entry.get("params") or {})
        factor = entry.get("factor")
        # patch options, not method parameters: KV consistency, and building on the checkpoint's own scaling
        method_params = {k: v for k, v in params.items() if k not in ("kv_consistent", "compose")}
        if "compose" in params and not isinstance(params["compose"], bool):
            raise SuiteError(f"methods[{i}].params.compose must be true or false, got {params['compose']!r}")
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


def load_suite(
    path_or_name: str | Path,
    model: str | None = None,
    target_length: int | None = None,
    data: str | None = None,
    lengths: list[int | str] | None = None,
    samples: int | None = None,
) -> Suite:
    """A suite from a YAML path, or by name from ``evals/suites/``; ``model``, ``target_length`` and
    ``data`` replace the file's (``ropescale eval suite NAME --model PATH``), relative lengths are
    resolved against the model's trained context (:func:`.lengths.prepare`). ``lengths`` and
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
    raw = prepare(
        suite_size.with_lengths(raw, lengths), f"suite '{path}'", model=model, target_length=target_length, data=data
    )
    if lengths is not None:
        raw = suite_size.keep_only_asked(_read_lengths(raw))
    suite = suite_from_dict(raw, default_name=path.stem, source=f"suite '{path}'")
    said: list[str] = []
    if samples is not None:
        suite, said = suite_size.with_samples(suite, samples)
    sized = suite_size.sized_text(lengths, samples, suite, said)
    if sized:
        suite.sized = sized
    return suite


class SuiteRunner:
    """Runs a suite into ``output``; call :meth:`run`."""

    def __init__(self, suite: Suite, output: str | Path, progress: bool = True):
        self.suite, self.output, self.progress = suite, Path(output), progress
        self.cells_dir = self.output / "cells"
        self.data: dict[str, Any] = {}  # task -> what its cells read (Task.prepare)
        self._journals: list[Any] = []  # the prompt journals of the cell in flight
        self._bars = progress  # progress bars shown (a terminal watches): set per run
        self._runtime = None
        self._identity: dict[str, Any] | None = None
        self._saved_mode: str | None = None  # the attention-level mode the saved scaling installs
        self._resolve_saved()

    def _resolve_saved(self) -> None:
        """Entries resolved against what the checkpoint carries (:func:`.saved.resolve_saved`); a
        report of a folder copied without its model keeps them as written."""
        from ropescale.errors import RopescaleError
        from ropescale.evals.tasks.saved import resolve_saved
        from ropescale.models.loading import load_config
        from ropescale.patching.plan import plan_from_provenance

        try:
            config = load_config(self.suite.model)
        except (RopescaleError, OSError, ValueError):
            return
        self.suite = resolve_saved(self.suite, config)
        plan = plan_from_provenance(config)
        self._saved_mode = plan.attention_mode if plan is not None else None

    def measured(self, task: str) -> dict[str, Any]:
        """What a cell of ``task`` measures besides its method and runtime (:func:`.cell_keys.measured`)."""
        from ropescale.evals.report.cell_keys import measured

        if self._identity is None:
            from ropescale.errors import RopescaleError
            from ropescale.models.identity import data_identity, model_identity

            try:
                model = model_identity(self.suite.model)
            except RopescaleError:  # --report-only of a folder copied without its model: nothing matches
                model = {"name": self.suite.model, "fingerprint": None}
            self._identity = {"model": model, "data": data_identity(self.suite.data)}
        return measured(self.suite, self._identity, task)

    @property
    def runtime(self):
        """The suite's device/dtype/attention with ``auto`` resolved for this machine."""
        if self._runtime is None:
            from ropescale.models.runtime import resolve_runtime

            self._runtime = resolve_runtime(self.suite.device, self.suite.dtype, self.suite.attn_implementation)
        return self._runtime

    def runtime_for(self, entry: MethodEntry) -> dict[str, str]:
        """The runtime ``entry``'s cells run on: the suite's, with the attention kernel its mode runs."""
        if is_saved(entry.method):
            from ropescale.attention import kernel_for

            kernel = kernel_for(self._saved_mode, self.runtime.attention)
        else:
            kernel = entry_kernel(entry.method, entry.factor, entry.params, self.runtime.attention)
        return {**self.runtime.to_dict(), "attention": kernel}

    def cell_path(self, entry: MethodEntry, task: str, length: int) -> Path:
        return self.cells_dir / f"{cell_id(entry, task, length)}.json"

    def is_done(self, entry: MethodEntry, task: str, length: int) -> bool:
        """A cell counts as done only if its file records the same method settings."""
        from ropescale.errors import RopescaleError

        path = self.cell_path(entry, task, length)
        if not path.is_file():
            return False
        try:
            cell = SuiteCell.read(path)
        except RopescaleError:  # damaged, or not a cell of this layout: recomputed
            return False
        # a cell computed elsewhere (another dtype or kernel: a GPU run resumed on the CPU, bf16 on AMX
        # resumed on AVX512-BF16) is redone; cells written before runtimes (or bf16 kernels) were
        # recorded count as matching
        ours = self.runtime_for(entry)
        measured = json.loads(json.dumps(self.measured(task)))  # as it reads back
        return (
            cell.runs(entry)
            and same_runtime(ours if cell.runtime is None else cell.runtime, ours)
            and task_table.same_measured(None if cell.measured is None else cell.measured.to_json(), measured, task)
            and same_scaling(cell, scaling_run(self.suite.model, entry), entry)
        )

    def journal(self, entry: MethodEntry, task: str, length: int, part: str = ""):
        """The prompts a retrieval cell has finished, kept beside the cell until it is written, so
        that an interrupted cell resumes at its first unfinished prompt (``part``: one of several
        journals of a cell, e.g. a RULER task of the battery)."""
        from ropescale.evals.tasks.generation import PromptJournal

        fingerprint = {
            "model": self.suite.model,
            "method_name": entry.method,
            "factor": entry.factor,
            "params": entry.params,
            "scaling": scaling_run(self.suite.model, entry),  # a checkpoint's own parameters, resolved
            "runtime": self.runtime_for(entry),
            "measured": self.measured(task),
            **({"part": part} if part else {}),
        }
        path = self.cell_path(entry, task, length)
        return PromptJournal(path.with_name(path.stem + (f".{part}" if part else "") + ".partial.jsonl"), fingerprint)

    def report(self) -> dict[str, Any]:
        """Write the report of the finished cells and, marked in progress, the partial ones
        (:func:`.in_progress.partial_cells`), without running anything."""
        from ropescale.evals.report.aggregate import write_report
        from ropescale.evals.report.cell_keys import check_protocols
        from ropescale.evals.report.in_progress import partial_cells
        from ropescale.evals.report.results_schema import check_suite_results

        check_protocols(self)  # a sized-down cell is not reported as the full suite's
        check_suite_results(self.output)  # a newer or another task's results.json is left as it is
        return write_report(self.suite, self.output, partial=partial_cells(self))

    def pending(self) -> list[tuple[MethodEntry, str, int]]:
        return [c for c in self.suite.cells() if not self.is_done(*c)]

    def run(self) -> dict[str, Any]:
        """Run the pending cells and write the report, holding the results folder's lock."""
        from ropescale._lock import output_lock
        from ropescale.evals.report.results_schema import check_suite_results

        with output_lock(self.output, "results folder"):
            check_suite_results(self.output)  # a newer or another task's results.json: before anything is written
            return self._run()

    def _run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        from ropescale.evals.report.cell_keys import check_measured
        from ropescale.evals.tasks.saved import scaling_origin
        from ropescale.models.loading import from_pretrained, load_config, load_tokenizer
        from ropescale.patching.model import attention_kernel, patch
        from ropescale.patching.plan import trained_context
        from ropescale.patching.readback import restore_scaling, scaling_of, snapshot_scaling

        self.runtime  # noqa: B018 — a device/dtype/kernel this machine lacks fails before anything is written
        # everything that can fail on bad input is checked before the output or the weights are touched
        config = load_config(self.suite.model)
        check_against_model(self.suite, config)  # each method planned on the config, before any weights
        from ropescale.evals.suite.lengths import check_lengths
        from ropescale.patching.shipped import shipped_of

        check_lengths(self.suite, trained_context(config), shipped_of(config).context)
        check_measured(self)  # cells of another model, data or protocol: stop before anything is written
        todo = self.pending()
        if todo:  # the tokenizer and the data can be refused too: before the folder is written
            tokenizer = load_tokenizer(self.suite.model)
            self._prepare_data(tokenizer)
        self.output.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.output / "suite.yaml", yaml.safe_dump(_suite_dict(self.suite), sort_keys=False))
        if todo:
            model = self.runtime.place(from_pretrained(self.suite.model, **self.runtime.load_kwargs()))
            as_loaded = snapshot_scaling(model)  # the checkpoint's own scaling, for its `saved` rows
            key = lambda s: (s["method"], s["params"])  # noqa: E731 — what makes two scalings the same
            loaded = key(scaling_of(model))
            total = len(self.suite.cells())
            # a bar only where someone watches it; in a log (nohup, CI, a pipe) or under --no-progress a
            # run says one line per finished cell, so that hours of cells are never hours of silence
            self._bars = self.progress and sys.stderr.isatty()
            lines = not self._bars or not sys.stdout.isatty()  # a log of stdout gets them beside a bar too
            bar = tqdm(total=total, initial=total - len(todo), desc="suite cells", disable=not self._bars, unit="cell")
            if lines:
                print(f"{self.suite.name}: {len(todo)} of {total} cells to run, into {self.output}", flush=True)
            current = None
            for i, (entry, task, length) in enumerate(todo):
                if entry != current and is_saved(entry.method):
                    restore_scaling(model, as_loaded)
                elif entry != current:
                    if entry.scaling.compose:  # on the scaling the checkpoint ships with
                        restore_scaling(model, as_loaded)
                    patch(model, entry.scaling)
                current = entry
                bar.set_postfix_str(f"{entry.label} {task} {length}")
                load = load_average()  # beside the result: a cell timed beside another job says so
                started = time.monotonic()
                result = self._run_cell(model, tokenizer, entry, task, length)
                seconds = time.monotonic() - started
                # the kernel that ran: an attention-level mode runs SDPA/eager, not the suite's flash-attn
                runtime = {**self.runtime.to_dict(), "attention": attention_kernel(model)}
                # what ran, read back from the model (not from the request), and how it relates to the saved one
                ran = scaling_of(model)
                scaling = {**ran, "as": scaling_origin(entry, self.suite.carries, key(ran) == loaded)}
                load_avg = [load, load_average()]
                cell = SuiteCell.of(entry, task, length, runtime, result, self.measured(task), scaling, load_avg)
                atomic_write_json(self.cell_path(entry, task, length), cell.to_json())
                for journal in self._journals:
                    journal.remove()
                bar.update(1)
                if lines:
                    from ropescale.evals.tasks.report_cells import cell_line

                    print(
                        cell_line(
                            task_table.get(task), entry, length, result, seconds, total - len(todo) + i + 1, total
                        ),
                        flush=True,
                    )
            bar.close()
        from ropescale.evals.report.aggregate import write_report

        return write_report(self.suite, self.output)

    # -- data ------------------------------------------------------------------------------------
    def _prepare_data(self, tokenizer) -> None:
        """What each task reads (documents, a haystack), refused in one line before the weights load."""
        self.data = {
            t: task_table.get(t).prepare(self.suite, self.suite.settings(t), tokenizer) for t in self.suite.tasks()
        }

    # -- cells -----------------------------------------------------------------------------------
    def _run_cell(self, model, tokenizer, entry: MethodEntry, task: str, length: int) -> Any:
        """One cell through its task's row: its typed result (the row's ``result`` class)."""
        self._journals = []

        def journal_for(part: str):
            journal = self.journal(entry, task, length, part)
            self._journals.append(journal)
            return journal

        # a prompt bar only where the cell bar is shown
        ctx = CellContext(model, tokenizer, entry, self.suite.seed, self.data[task], self._bars, journal_for)
        return task_table.get(task).run_cell(ctx, self.suite.settings(task), length)


def _suite_dict(suite: Suite) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": suite.name,
        "model": suite.model,
        "dtype": suite.dtype,
        "device": suite.device,
        "attn_implementation": suite.attn_implementation,
        "data": suite.data,
        "seed": suite.seed,
        **({"note": suite.note} if suite.note else {}),
        **({"sized": suite.sized} if suite.sized else {}),
        **({"target_length": suite.target_length} if suite.target_length else {}),
    }
    out["methods"] = [
        {
            "label": m.label,
            "method": m.method,
            "factor": m.factor,
            "params": m.params,
            **({"only": m.only} if m.only else {}),
        }
        for m in suite.methods
    ]
    for task in suite.tasks():
        out[task] = suite.block(task)
    return out


def run_suite(suite: Suite | str | Path, output: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or resume) a suite; returns the aggregated results also written to ``output``."""
    if not isinstance(suite, Suite):
        suite = load_suite(suite)
    return SuiteRunner(suite, output, progress).run()
