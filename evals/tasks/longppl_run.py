"""``ropescale eval longppl``'s runner: LongPPL and perplexity of scalings × lengths, beside each other.

Each length takes the first ``documents`` texts of the data that hold that many tokens, cut there.
The evaluator (by default the evaluated checkpoint itself, unscaled; :mod:`.longppl`) picks each
window's key tokens once, kept in ``OUTPUT/keys/``; every scaling is then scored on the same
windows, one file per (scaling, length) in ``OUTPUT/cells/``, skipped on a re-run when it records
the same request, model content and windows (the data by content). A cell there that measured
something else, a file of another task or of a newer schema stops the run naming it, before anything
is written (:mod:`.run_folder`); one writer at a time holds the folder's lock. ``report.md`` and
``results.json`` are rewritten (atomically) at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ropescale._io import atomic_write_json, atomic_write_text
from ropescale.evals.tasks.longppl import (
    ALPHA,
    BETA,
    LongPPLDocument,
    combine,
    evaluator_spans,
    score_text,
    text_window,
)
from ropescale.evals.tasks.records import (
    EvaluatorJSON,
    LongPPLCellFile,
    LongPPLFingerprint,
    LongPPLResults,
    LongPPLSummary,
)
from ropescale.evals.tasks.ruler.run import cell_name
from ropescale.evals.tasks.run_folder import Fingerprint, MeasuredJSON
from ropescale.markdown import table
from ropescale.scaling import Scaling

SCHEMA = "ropescale.longppl.cell/1"
RESULTS_SCHEMA = "ropescale.longppl.results/1"


def _load(model: str, scaling: Scaling, runtime: Any):
    from ropescale.models.loading import from_pretrained

    kwargs = runtime.load_kwargs() if runtime else {}
    # a method named here replaces a scaling the checkpoint ships with, unless asked to compose
    m = from_pretrained(
        model, scaling if scaling.as_saved or scaling.start else scaling.with_(start="replace"), **kwargs
    )
    return (runtime.place(m) if runtime else m).eval()


def run_longppl(
    model: str,
    scalings: list[Scaling],
    lengths: list[int],
    texts: list[tuple[str, str]],
    output: str | Path,
    documents: int = 1,
    evaluator: str | None = None,
    evaluator_scaling: Scaling | None = None,
    trunc_len: int = 4096,
    internal: int = 1024,
    runtime: Any = None,
    data: str | None = None,
) -> LongPPLSummary:
    """Score every scaling at every length, holding the folder's lock; return the summary (also
    written to ``output``).

    Args:
        model: the evaluated checkpoint.
        scalings: the scalings to compare (``Scaling("none")`` is the unscaled model).
        lengths: window lengths in the evaluated model's tokens.
        texts: ``[(title, text)]``, longest first (:func:`ropescale.data.documents.load_documents`).
        documents: windows per length.
        evaluator: the checkpoint that picks key tokens (default: ``model``).
        evaluator_scaling: its scaling (default: unscaled).
        trunc_len, internal: the short window and the scoring stride (the authors' defaults).
        runtime: a resolved :class:`ropescale.models.runtime.Runtime`.
        data: the ``--data`` value the texts came from (their name in the cells; their content is
            keyed by the windows scored).

    Raises:
        ValueError: a length no document of the data reaches, or ``trunc_len`` not below a length.
        RopescaleError: the folder holds a cell that measured something else (another model, model
            content, data, evaluator...), a file of another task or of a newer schema
            (:mod:`.run_folder`), or another process is writing it.
    """
    from ropescale._lock import output_lock

    output = Path(output)
    for n in lengths:
        if trunc_len >= n:
            raise ValueError(f"--trunc-len {trunc_len} must be below every length (got {n}): no token would be scored")
    with output_lock(output, "results folder"):
        from ropescale.evals.tasks.run_folder import check_folder
        from ropescale.models.loading import load_tokenizer
        from ropescale.patching.model import describe

        check_folder(output, SCHEMA, RESULTS_SCHEMA, "ropescale eval longppl")  # before anything is read or written
        tokenizer = load_tokenizer(model)
        windows = text_windows(tokenizer, texts, lengths, documents)
        judge = evaluator_record(model, evaluator, evaluator_scaling, trunc_len, internal)
        keys = CellKeys(model, judge, documents, data, windows)
        keys.check(output, scalings, lengths)  # a cell that measured something else: before anything is written
        spans = key_spans(output, judge, windows, runtime)
        for s in scalings:
            todo = [n for n in lengths if not keys.done(output, s, n)]
            if not todo:
                continue
            m = _load(model, s, runtime)
            for n in todo:
                docs = [score_text(m, tokenizer, w, spans[n][i], title) for i, (title, w) in enumerate(windows[n])]
                record = LongPPLCellFile(
                    schema=SCHEMA,
                    fingerprint=keys.fingerprint(s, n),
                    label=s.label,
                    scaling=describe(m),
                    length=n,
                    result=combine(docs),
                )
                atomic_write_json(_cell_path(output, s, n), record)
            del m
        return write_report(output, judge)


def text_windows(
    tokenizer: Any, texts: list[tuple[str, str]], lengths: list[int], documents: int
) -> dict[int, list[tuple[str, str]]]:
    """Each length's windows: the first ``documents`` texts holding that many tokens, cut there.

    Raises:
        ValueError: a length no text reaches (``length N: no document of the data holds N tokens``).
    """
    windows: dict[int, list[tuple[str, str]]] = {}
    for n in lengths:
        found = [(title, w) for title, text in texts if (w := text_window(tokenizer, text, n)) is not None]
        if not found:
            raise ValueError(f"length {n}: no document of the data holds {n} tokens")
        windows[n] = found[:documents]
    return windows


def evaluator_record(
    model: str, evaluator: str | None, scaling: Scaling | None, trunc_len: int, internal: int
) -> EvaluatorJSON:
    """Who chooses the key tokens and by which rule (recorded with every cell): ``evaluator`` (default
    ``model``) with ``scaling`` (default unscaled), and the authors' thresholds."""
    evaluator = evaluator or model
    scaling = scaling or Scaling("none")
    return EvaluatorJSON(
        model=str(evaluator),
        scaling=scaling.request(),
        default=evaluator == model and scaling.unscaled,
        trunc_len=trunc_len,
        internal=internal,
        alpha=ALPHA,
        beta=BETA,
    )


def evaluator_text(judge: EvaluatorJSON) -> str:
    """The evaluator and its rule in words, as the reports say it (``judge``: :func:`evaluator_record`)."""
    who = "the evaluated model itself, unscaled (default)" if judge["default"] else f"{judge['model']}"
    if not judge["default"]:
        who += f" with {Scaling(**judge['scaling']).label}"
    return (
        f"Key tokens chosen by {who}: loss with the {judge['trunc_len']}-token window minus loss with the whole "
        f"window > {judge['alpha']:g} nats, and whole-window loss < {judge['beta']:g} (stride {judge['internal']})."
    )


def _cell_path(output: Path, s: Scaling, n: int) -> Path:
    return output / "cells" / f"{cell_name(s, 'longppl', n)}.json"


class CellKeys:
    """What a LongPPL cell of this run records and must match to count as done: the model by name and
    content (:func:`.run_folder.model_content`), the scaling asked for, the length, the evaluator and its
    rule, the windows per length and the data (its ``--data`` name, and by content the windows scored:
    another file, or the same file edited, is other data). A cell written before the content and the
    data were recorded counts as matching on them (:func:`.run_folder.legacy`)."""

    def __init__(
        self,
        model: str,
        judge: EvaluatorJSON,
        documents: int,
        data: str | None,
        windows: dict[int, list[tuple[str, str]]],
    ):
        from ropescale.evals.tasks.run_folder import model_content, text_fingerprint

        self.model, self.judge, self.documents = str(model), judge, documents
        self.content = model_content(self.model)
        self.data = {n: Fingerprint(name=data, fingerprint=text_fingerprint(w)) for n, w in windows.items()}

    def fingerprint(self, s: Scaling, n: int) -> LongPPLFingerprint:
        content: dict[str, str] = {} if self.content is None else {"model_content": self.content}
        # model_content second, where known: the key order of the cells written before
        return LongPPLFingerprint(
            model=self.model,
            **content,
            scaling_requested=s.request(),
            length=n,
            evaluator=self.judge,
            documents=self.documents,
            data=self.data[n],
        )

    @staticmethod
    def measured(fingerprint: LongPPLFingerprint) -> MeasuredJSON:
        """A cell's fingerprint in the suite's shape (:func:`.cell_keys.measured`), for
        :func:`.run_folder.compare`: a key it lacks stays absent (a cell written before it)."""
        model = Fingerprint(name=fingerprint.get("model"))
        if "model_content" in fingerprint:
            model["fingerprint"] = fingerprint["model_content"]
        protocol = {k: fingerprint.get(k) for k in ("scaling_requested", "length", "evaluator", "documents")}
        out = MeasuredJSON(model=model, protocol=protocol)
        if "data" in fingerprint:
            out["data"] = fingerprint["data"]
        return json.loads(json.dumps(out))

    def _recorded(self, output: Path, s: Scaling, n: int) -> LongPPLFingerprint | None:
        try:
            record = json.loads(_cell_path(output, s, n).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # absent or damaged: recomputed
            return None
        fingerprint = record.get("fingerprint") if isinstance(record, dict) else None
        return fingerprint if isinstance(fingerprint, dict) else None

    def done(self, output: Path, s: Scaling, n: int) -> bool:
        from ropescale.evals.tasks.run_folder import legacy

        recorded = self._recorded(output, s, n)
        ours = self.measured(self.fingerprint(s, n))
        return recorded is not None and legacy(self.measured(recorded), ours) == ours

    def check(self, output: Path, scalings: list[Scaling], lengths: list[int]) -> None:
        """Stop, naming the first difference, where a cell this run would write measured something else,
        or a cell of the same model name recorded other content (:mod:`.run_folder`)."""
        from ropescale.evals.tasks.run_folder import check_model_content, compare

        cells = []
        for path in sorted((output / "cells").glob("*.json")):
            try:
                fingerprint = json.loads(path.read_text(encoding="utf-8"))["fingerprint"]
                cells.append((path, fingerprint["model"], fingerprint.get("model_content")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        check_model_content(output, cells, self.model, self.content)
        for s in scalings:
            for n in lengths:
                recorded = self._recorded(output, s, n)
                if recorded is not None:
                    compare(
                        _cell_path(output, s, n), self.measured(recorded), self.measured(self.fingerprint(s, n)), output
                    )


def key_spans(output: Path | None, judge: EvaluatorJSON, windows: dict[int, list[tuple[str, str]]], runtime: Any):
    """Each window's key spans by ``judge``'s evaluator, loaded once here and freed on return; kept in
    ``output/keys/`` and read back from there where the same evaluator already chose them (``output``
    None: nothing kept)."""
    import hashlib

    from ropescale.models.loading import load_tokenizer

    spans: dict[int, list[list[tuple[int, int]]]] = {}
    model = None
    tokenizer = None
    for n, found in windows.items():
        spans[n] = []
        for title, text in found:
            key = hashlib.sha256(json.dumps([judge, text], sort_keys=True).encode()).hexdigest()[:16]
            path = output / "keys" / f"{n}-{key}.json" if output is not None else None
            kept = _kept_spans(path) if path is not None else None
            if kept is not None:
                spans[n].append(kept)
                continue
            if model is None:
                model = _load(judge["model"], Scaling(**judge["scaling"]), runtime)
                tokenizer = load_tokenizer(judge["model"])
            found_spans = evaluator_spans(model, tokenizer, text, judge["trunc_len"], judge["internal"])
            if path is not None:
                atomic_write_json(path, {"evaluator": judge, "title": title, "length": n, "spans": found_spans})
            spans[n].append(found_spans)
    return spans


def _kept_spans(path: Path) -> list[tuple[int, int]] | None:
    try:
        return [tuple(s) for s in json.loads(path.read_text(encoding="utf-8"))["spans"]]
    except (OSError, ValueError, KeyError):
        return None


def write_report(output: str | Path, judge: EvaluatorJSON) -> LongPPLSummary:
    """``report.md`` and ``results.json`` of the cells in ``output`` scored with ``judge``'s key tokens."""
    output = Path(output)
    rows: list[LongPPLCellFile] = []
    for path in sorted((output / "cells").glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("schema") == SCHEMA and record["fingerprint"]["evaluator"] == json.loads(json.dumps(judge)):
            rows.append(record)
    lines = ["## LongPPL beside perplexity (arXiv 2410.23771)", "", evaluator_text(judge), ""]
    cells = []
    for r in sorted(rows, key=lambda r: (r["label"], r["length"])):
        res = r["result"]
        lp = "n/a (no key tokens)" if res["longppl"] is None else f"{res['longppl']:.3f}"
        cells.append(
            [r["label"], r["length"], lp, f"{res['ppl']:.3f}", res["key_tokens"], res["tokens"], len(res["documents"])]
        )
    lines.append(table(["scaling", "length", "LongPPL", "PPL", "key tokens", "tokens", "documents"], cells))
    text = "\n".join(lines) + "\n"
    atomic_write_text(output / "report.md", text)
    summary = LongPPLResults(schema="ropescale.longppl.results/1", evaluator=judge, cells=rows)
    atomic_write_json(output / "results.json", summary)
    return LongPPLSummary(**summary, markdown=text, report=str(output / "report.md"))


__all__ = [
    "CellKeys",
    "LongPPLDocument",
    "evaluator_record",
    "evaluator_text",
    "key_spans",
    "run_longppl",
    "text_windows",
    "write_report",
]
