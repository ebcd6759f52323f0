"""Measured results ``ropescale recommend`` reads its trade-offs from: runs, and the ones shipped.

Two sources, both files, never numbers typed into code:

* **runs**: every ``results.json`` written by ``ropescale eval`` (it records each label's method, factor
  and parameters, and the passkey placement; older ones: the ``suite.yaml`` beside it), under ``runs/``
  and ``benchmarks/results/`` or given with ``--results``; only those of the model asked about count.
* **shipped measurements**: ``evals/measured/*.json`` (installed as ``ropescale/evals/measured``),
  one file per measured model. Each row is a method at a factor with its parameters; each of its
  numbers sits in a ``measured`` entry with the command that produced it, so every number can be
  reproduced and a new one added by running a command and writing down what it printed::

      {"model": "smollm2-135m", "original_context": 8192, "note": "...",
       "rows": [{"label": "yarn", "method": "yarn", "factor": 4, "params": {},
                 "measured": [{"command": "ropescale eval suite smollm2-x4-full",
                               "ppl": {"2048": 30.73}, "passkey": {"16384": 1.0}}]}]}

  ``ppl`` maps a window length to perplexity, ``passkey`` a prompt length to accuracy in [0, 1]
  (the mean over the depths and trials the command ran), the optional ``passkey_trials`` a prompt
  length to the number of prompts behind that accuracy (for its interval). A length measured twice
  in one row is an error. The protocol shared by a file's rows (data, windows, dtype) is its ``note``;
  the optional ``runtime`` (``{"device": "cpu", "dtype": "bfloat16", "kernels": "amx", ...}``, as the
  cells recorded it) is what computed every number: a merge from another kind of machine is refused
  (:func:`merge_shipped`), since bf16 answers differ between them. The optional ``passkey_jitter``
  says the passkey needles were placed at depths drawn around the nominal ones (``evals/tasks/passkey.py``;
  absent: fixed depths); a merge of the other placement is refused too. The optional ``status`` is what
  the experiment says of its own numbers (``"not converged: ..."``: a fine-tune whose held-out curve still
  fell at its last point, so its numbers are not its recipe's result); ``recommend`` says it wherever it
  quotes them, and a merge takes the newest run's (none: removed). The optional ``retrieval`` is the
  experiment's retrieval result in one line where it measured retrieval in cells of its own rather than
  the passkey's (issue 54's CPU fine-tune: RULER's countable tasks against the unscaled model, beside
  its scaling untrained); ``recommend --budget fine-tune`` quotes it, and a merge takes the newest run's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ropescale.errors import RopescaleError
from ropescale.evals.advice.records import MeasuredEntry, Params, ShippedFile, ShippedRow
from ropescale.evals.report.results_schema import Ran, ResultsSummary
from ropescale.evals.report.results_schema import version as schema_version
from ropescale.models.runtime import runtime_text, same_runtime

RESULT_GLOBS = ("runs/*/results.json", "benchmarks/results/*.json")
MEASURED_DIR = Path(__file__).resolve().parents[1] / "measured"
#: the rows of a fine-tune experiment that are trained models, not training-free methods
FINE_TUNED, CONTROL = "fine-tuned yarn", "control"


@dataclass(frozen=True)
class Measured:
    """One evaluated configuration: its method, what it scored per length, and how it was measured."""

    label: str
    method: str  # registry name; "default" for the unscaled model
    factor: float | None = None
    params: Params = field(default_factory=dict)
    ppl: dict[int, float] = field(default_factory=dict)
    passkey: dict[int, float] = field(default_factory=dict)  # accuracy in [0, 1]
    passkey_trials: dict[int, int] = field(default_factory=dict)  # prompts behind each accuracy, where known
    commands: tuple[str, ...] = ()  # the commands that produced the numbers (shipped measurements)
    budget: str = "training-free"  # or "fine-tune": a model trained at its scaling (its evidence file's budget)

    @property
    def title(self) -> str:
        """``self_extend ×2`` / ``none``: the label with the factor."""
        return self.label + (f" ×{self.factor:g}" if self.factor else "")

    def at_factor(self, factor: float | None) -> bool:
        """Whether this row was measured at exactly ``factor`` (False for an unscaled row or None)."""
        return factor is not None and self.factor is not None and abs(self.factor - factor) < 1e-9


@dataclass(frozen=True)
class Evidence:
    source: str
    model: str
    note: str
    rows: tuple[Measured, ...]
    #: the trained context of the measured model; None: the model asked about (same-model results)
    original_context: int | None = None
    #: ``training-free`` (methods applied to the model as trained) or ``fine-tune`` (models trained at
    #: their scaling: the extension experiment); only the first are candidates of the training-free frontier
    budget: str = "training-free"
    #: passkey placement of its cells: 0 = fixed depths (a depth's trials share one position), h = each
    #: trial's depth drawn from depth +- h (``evals/tasks/passkey.py``)
    passkey_jitter: float = 0.0
    #: what the experiment says of its own numbers, said wherever they are quoted (``not converged: ...``:
    #: a run whose held-out curve still fell at its last point); empty: nothing to add
    status: str = ""
    #: the experiment's retrieval result in one line, where it measured retrieval with other cells than the
    #: passkey's (issue 54's CPU fine-tune: RULER's countable tasks against the unscaled model); empty: none
    retrieval: str = ""

    def find(self, method: str, factor: float | None = None, **params: Any) -> Measured | None:
        """The row of ``method`` with exactly ``params`` (none: its defaults), at ``factor`` if one is
        measured there (else the first at any factor)."""
        rows = [r for r in self.rows if r.method == method and r.params == params]
        exact = [r for r in rows if r.at_factor(factor)]
        return (exact or rows or [None])[0]

    @property
    def commands(self) -> list[str]:
        """Every command behind the rows, in the order they first appear."""
        return list(dict.fromkeys(c for r in self.rows for c in r.commands))


def length_text(n: int) -> str:
    """``16384 -> "16k"``, ``20000 -> "20,000"`` (reports and recommendations)."""
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def _method_name(name: str) -> str | None:
    """The registry name of ``name`` (or an alias); None for a name no method has."""
    from ropescale.methods import method_class

    try:
        return method_class(name).name
    except ValueError:
        return None


def load_results(path: str | Path) -> Evidence | None:
    """Evidence from one ``results.json`` written by the suite runner (None if unreadable: a file the
    default search found; one the user named goes through :func:`read_results`, which says why)."""
    try:
        return read_results(path)
    except RopescaleError:
        return None


def read_results(path: str | Path) -> Evidence:
    """Evidence from one ``results.json`` written by the suite runner.

    Raises:
        RopescaleError: one line naming the file: missing, unreadable, not JSON, or not a results file.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RopescaleError(f"results file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RopescaleError(
            f"results file '{path}' cannot be read ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    try:
        summary = json.loads(text)
    except ValueError as exc:
        raise RopescaleError(f"results file '{path}' is not JSON ({exc})") from None
    summary = ResultsSummary.from_json(summary, path)  # a newer version is refused, not read as the old shape
    rows = []
    for label in summary.labels:
        ran = (summary.methods or {}).get(label) or Ran(label)
        method = _method_name(ran.method)
        if method is None:  # a label whose method nothing records: no row, not a guess
            continue
        ppl = {n: float(r.ppl) for n, r in summary.results("perplexity", label).items() if r.ppl is not None}
        passkey, trials = {}, {}
        for n, r in summary.results("passkey", label).items():
            grid = [v for row in r.accuracy or [] for v in row]
            if grid:
                # pooled over the cell's prompts; the mean of the depths' accuracies only where a cell
                # predates the pooled figure (equal for a finished cell, not for one in progress)
                pooled = (r.length_accuracy or {}).get(str(n))
                passkey[n] = float(pooled) if pooled is not None else sum(grid) / len(grid)
                count = (r.length_trials or {}).get(str(n), len(r.depths or []) * int(r.trials))
                if count:
                    trials[n] = int(count)
        rows.append(Measured(label, method, ran.factor, ran.params, ppl, passkey, trials))
    done, total = summary.cells_finished, summary.cells_total
    partial = f", {done}/{total} cells" if done is not None and done != total else ""
    name = summary.suite if summary.suite is not None else path.parent.name
    return Evidence(
        str(path),
        summary.model if summary.model is not None else "?",
        f"{name} suite, dtype {summary.dtype if summary.dtype is not None else '?'}{partial}",
        tuple(r for r in rows if r.ppl or r.passkey),
        passkey_jitter=_jitter(summary, path.parent),
    )


def _jitter(summary: ResultsSummary, folder: Path) -> float:
    """The passkey placement of a results file: as recorded, else as its cells say (fixed when they disagree)."""
    from ropescale.evals.report.cell_keys import cells_jitter

    if summary.passkey_jitter is not None:
        return summary.passkey_jitter
    try:
        return cells_jitter([folder])
    except RopescaleError:
        return 0.0


def _numbers(where: str, table: Any, low: float, high: float | None) -> dict[int, float]:
    """``{"2048": 30.7}`` → ``{2048: 30.7}``, each value a number in [low, high]."""
    if not isinstance(table, dict):
        raise RopescaleError(f"{where} must map lengths to numbers, got {table!r}")
    out = {}
    for key, value in table.items():
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= (high or value)
        if not (str(key).isdigit() and int(key) > 0 and ok):
            raise RopescaleError(
                f"{where}: {key!r}: {value!r} is not a length and a number in [{low:g}, {high or 'inf'}]"
            )
        out[int(key)] = float(value)
    return out


def _row(where: str, raw: Any) -> Measured:
    if not isinstance(raw, dict) or not isinstance(raw.get("measured"), list) or not raw["measured"]:
        raise RopescaleError(f"{where} needs a label, a method and a non-empty 'measured' list")
    ppl: dict[int, float] = {}
    passkey: dict[int, float] = {}
    commands, trials = [], {}
    for j, entry in enumerate(raw["measured"]):
        at = f"{where}.measured[{j}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("command"), str) or not entry["command"].strip():
            raise RopescaleError(f"{at} needs the command that produced its numbers")
        commands.append(entry["command"].strip())
        for name, table, low, high in (("ppl", ppl, 1.0, None), ("passkey", passkey, 0.0, 1.0)):
            numbers = _numbers(f"{at}.{name}", entry.get(name, {}), low, high)
            again = sorted(set(numbers) & set(table))
            if again:
                raise RopescaleError(f"{at}.{name}: length {again[0]} is measured twice in this row")
            table.update(numbers)
        counts = _numbers(f"{at}.passkey_trials", entry.get("passkey_trials", {}), 1.0, None)
        if set(counts) - set(passkey):
            raise RopescaleError(
                f"{at}.passkey_trials: length {min(set(counts) - set(passkey))} has no passkey accuracy"
            )
        trials.update({n: int(v) for n, v in counts.items()})
    method = _method_name(str(raw.get("method")))
    if method is None:
        raise RopescaleError(f"{where}.method: {raw.get('method')!r} is not a method ropescale knows")
    factor = raw.get("factor")
    return Measured(
        str(raw.get("label") or raw.get("method")),
        method,
        None if factor is None else float(factor),
        dict(raw.get("params") or {}),
        ppl,
        passkey,
        trials,
        tuple(dict.fromkeys(commands)),
    )


def shipped_dict(
    ev: Evidence,
    original_context: int,
    note: str,
    command: str | None = None,
    budget: str = "training-free",
    runtime: dict[str, str] | None = None,
    passkey_jitter: float = 0.0,
    status: str = "",
    retrieval: str = "",
) -> ShippedFile:
    """``ev`` in the format of ``evals/measured/*.json`` (the module docstring), the inverse of
    :func:`load_measured`: every row with its numbers rounded as reports print them and, in one
    ``measured`` entry, ``command`` (default: the row's own first command); ``runtime`` (see
    :func:`.cell_keys.cells_runtime`) where known; ``passkey_jitter`` where the passkey trials were not placed
    at fixed depths (:func:`.cell_keys.cells_jitter`); ``status`` where the experiment qualifies its numbers;
    ``retrieval`` where it measured retrieval in cells of its own (its result in one line)."""
    rows: list[ShippedRow] = []
    for r in ev.rows:
        measured: MeasuredEntry = {"command": command or (r.commands[0] if r.commands else "")}
        if r.ppl:
            measured["ppl"] = {str(n): round(v, 3) for n, v in sorted(r.ppl.items())}
        if r.passkey:
            measured["passkey"] = {str(n): round(v, 4) for n, v in sorted(r.passkey.items())}
            measured["passkey_trials"] = {str(n): k for n, k in sorted(r.passkey_trials.items())}
        rows.append(
            {"label": r.label, "method": r.method, "factor": r.factor, "params": dict(r.params), "measured": [measured]}
        )
    shipped: ShippedFile = {"model": ev.model, "original_context": original_context, "budget": budget, "note": note}
    placement = {"passkey_jitter": float(passkey_jitter)} if passkey_jitter else {}
    said = {"status": status} if status else {}
    said |= {"retrieval": retrieval} if retrieval else {}
    return shipped | ({"runtime": dict(runtime)} if runtime else {}) | placement | said | {"rows": rows}


def load_measured(path: str | Path) -> Evidence:
    """Evidence from a measurements file (the format of the module docstring).

    Args:
        path: a JSON file such as ``evals/measured/smollm2-135m.json``.

    Returns:
        The rows, with ``original_context`` from the file (the trade-offs are read relative to it).

    Raises:
        RopescaleError: the file is unreadable or a row lacks its command or has bad numbers
            (the message names the file and the row).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RopescaleError(f"measurements '{path}' cannot be read: {exc}") from None
    schema_version(data, path, "measurements")  # none: version 1, as every shipped file
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise RopescaleError(f"measurements '{path}' need 'model', 'original_context', 'note' and 'rows'")
    budget = str(data.get("budget") or "training-free")
    rows = tuple(
        dataclasses.replace(_row(f"{path.name}: rows[{i}]", raw), budget=budget) for i, raw in enumerate(data["rows"])
    )
    original = data.get("original_context")
    return Evidence(
        source=f"evals/measured/{path.name}" if path.parent == MEASURED_DIR else str(path),
        model=str(data.get("model", "?")),
        note=str(data.get("note", "")),
        rows=rows,
        original_context=int(original) if original else None,
        budget=budget,
        passkey_jitter=float(data.get("passkey_jitter") or 0.0),
        status=str(data.get("status") or ""),
        retrieval=str(data.get("retrieval") or ""),
    )


@functools.cache
def shipped_evidence() -> tuple[Evidence, ...]:
    """The measurements shipped with ropescale (``evals/measured/*.json``), read once."""
    return tuple(load_measured(p) for p in sorted(MEASURED_DIR.glob("*.json")))


def find_evidence(model: str, paths: list[str | Path] | None = None, root: str | Path = ".") -> list[Evidence]:
    """Results for ``model`` (newest first), then the shipped measurements.

    Args:
        model: the ``--model`` value the results were recorded under.
        paths: results files or folders holding ``results.json``; default: ``RESULT_GLOBS`` under ``root``.
        root: where to look by default.
    """
    if paths:  # named by the user: each must be a readable results file of this model, or we say why
        files = [Path(p) / "results.json" if Path(p).is_dir() else Path(p) for p in paths]
        for f in files:
            ev = read_results(f)
            if not same_model(ev.model, model):
                raise RopescaleError(f"results file '{f}' holds results of model '{ev.model}', not of '{model}'")
    else:
        files = [p for pattern in RESULT_GLOBS for p in Path(root).glob(pattern)]
    found = []
    for f in sorted(files, key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True):
        ev = load_results(f)
        if ev is not None and ev.rows and same_model(ev.model, model):
            found.append(ev)
    return found + list(shipped_evidence())


def same_model(a: str, b: str) -> bool:
    """Whether two ``--model`` values name the same model (equal, or the same existing path)."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def merge_shipped(old: ShippedFile, new: ShippedFile) -> tuple[ShippedFile, list[str]]:
    """``new`` (a :func:`shipped_dict`) added to the shipped file ``old``: each of its cells goes, with its
    command, into a new ``measured`` entry of the row with the same label, method, factor and params
    (a new row where there is none). A cell the file already has stays as it is, unless the file's was
    in progress (fewer prompts than the new one): then the new one replaces it. Nothing else changes but
    ``status``, which is the new file's, so the cells of a later stage join those of earlier ones whose run
    folders are gone.

    Returns:
        The merged file and one line per cell: ``added``, ``replaced`` (in progress before) or ``kept``.

    Raises:
        RopescaleError: the two files are of different models, contexts, budgets or passkey
            placements (``passkey_jitter``, absent = fixed depths), or both record a
            runtime and they differ (a file without one, written before runtimes were recorded, takes
            cells as before and stays without).
    """
    for key in ("model", "original_context", "budget"):
        if old.get(key) != new.get(key):
            raise RopescaleError(f"evidence to merge has {key} {new.get(key)!r}, the file {old.get(key)!r}")
    if old.get("passkey_jitter", 0.0) != new.get("passkey_jitter", 0.0):
        placement = {
            k: f"jitter {f.get('passkey_jitter', 0.0):g}" if f.get("passkey_jitter") else "fixed depths"
            for k, f in (("old", old), ("new", new))
        }
        raise RopescaleError(
            f"evidence to merge placed its passkey needles at {placement['new']}, the file at {placement['old']}: "
            "write it to a file of its own"
        )
    mine, theirs = old.get("runtime"), new.get("runtime")
    if mine and theirs and not same_runtime(mine, theirs):
        raise RopescaleError(
            f"evidence to merge was computed on {runtime_text(theirs)}, the file's on {runtime_text(mine)} "
            "(bf16 answers differ between them): write it to a file of its own"
        )
    merged: ShippedFile = json.loads(json.dumps(old))
    for key in ("status", "retrieval"):  # the experiment's word on its numbers is the newest run's, never an old one's
        merged.pop(key, None)
        if new.get(key):
            merged = {**{k: v for k, v in merged.items() if k != "rows"}, key: new[key], "rows": merged["rows"]}
    lines = []
    for row in new["rows"]:
        same = [
            r
            for r in merged["rows"]
            if (r.get("label"), r.get("method"), r.get("factor"), r.get("params") or {})
            == (row["label"], row["method"], row["factor"], row["params"] or {})
        ]
        target: ShippedRow = (
            same[0]
            if same
            else {
                "label": row["label"],
                "method": row["method"],
                "factor": row["factor"],
                "params": row["params"],
                "measured": [],
            }
        )
        entry: MeasuredEntry = {"command": row["measured"][0]["command"]}
        for m in row["measured"]:
            for task in ("ppl", "passkey"):
                for n, value in m.get(task, {}).items():
                    verdict = _take_cell(target["measured"], task, n, m.get("passkey_trials", {}).get(n))
                    lines.append(f"{row['label']} {task} {length_text(int(n))}: {verdict}")
                    if verdict != "kept":
                        entry.setdefault(task, {})[n] = value
                        if task == "passkey" and n in m.get("passkey_trials", {}):
                            entry.setdefault("passkey_trials", {})[n] = m["passkey_trials"][n]
        if len(entry) > 1:
            target["measured"].append(entry)
            if not same:
                merged["rows"].append(target)
        target["measured"] = [e for e in target["measured"] if e.get("ppl") or e.get("passkey")]
    return merged, lines


def _take_cell(entries: list[MeasuredEntry], task: str, n: str, trials: int | None) -> str:
    """Whether a new cell (``trials`` prompts) is ``added``, ``replaced`` (removed here from the entry
    holding it, which was in progress) or ``kept`` (the file's stays)."""
    for e in entries:
        if n in e.get(task, {}):
            had = e.get("passkey_trials", {}).get(n) if task == "passkey" else None
            if had is None or trials is None or had >= trials:
                return "kept"
            del e[task][n], e["passkey_trials"][n]
            for key in (task, "passkey_trials"):
                if not e[key]:
                    del e[key]
            return "replaced"
    return "added"


def write_shipped(path: str | Path, shipped: ShippedFile) -> list[str]:
    """Write ``shipped`` (a :func:`shipped_dict`) to ``path`` atomically, one writer at a time (the
    output's lock is held from reading to writing); where the file exists, merge into it
    (:func:`merge_shipped`) so the cells of earlier stages, whose run folders may be gone, stay.

    Returns:
        One line per cell merged (none for a new file).

    Raises:
        RopescaleError: the existing file is damaged or of another model, context or budget, or
            another process is writing it.
    """
    from ropescale._io import atomic_write_json
    from ropescale._lock import output_lock

    lines: list[str] = []
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with output_lock(path, "evidence file", folder=False):
        if Path(path).is_file():
            load_measured(path)  # a damaged file stops here, in one line naming it
            shipped, lines = merge_shipped(json.loads(Path(path).read_text()), shipped)
        atomic_write_json(path, shipped)
    return lines
