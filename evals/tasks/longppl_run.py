"""What ``ropescale eval longppl`` and a suite's ``longppl:`` cells share: each length's windows, the
evaluator's record and its key tokens (kept in ``OUTPUT/keys/``), and the command's report.

Each length takes the first ``documents`` texts of the data that hold that many tokens, cut there.
The evaluator (by default the evaluated checkpoint itself, unscaled; :mod:`.longppl`) picks each
window's key tokens once; every scaling is then scored on the same windows. The command runs its flags
as a suite of the task table's LongPPL row (:mod:`.task_longppl`) through the suite runner; cells it
wrote before (``ropescale.longppl.cell/1``, one file per scaling and length) are keyed by
:class:`CellKeys` (the same request, model content and windows: read as done) and reported beside the
suite's (:mod:`ropescale.evals.report.longppl_folder`); :func:`write_report` writes ``report.md`` and
``results.json``.
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
    evaluator_spans,
    text_window,
)
from ropescale.evals.tasks.records import (
    EvaluatorJSON,
    LongPPLCellFile,
    LongPPLFingerprint,
    LongPPLResults,
    LongPPLSummary,
)
from ropescale.evals.tasks.ruler.earlier import cell_name
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
        from ropescale.evals.tasks.run_folder import matches

        recorded = self._recorded(output, s, n)
        ours = self.measured(self.fingerprint(s, n))
        return recorded is not None and matches(self.measured(recorded), ours)

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


def write_report(output: str | Path, judge: EvaluatorJSON, cells: list[LongPPLCellFile]) -> LongPPLSummary:
    """``report.md`` and ``results.json`` of ``cells`` (both layouts: :mod:`ropescale.evals.report.longppl_folder`)
    scored with ``judge``'s key tokens (a cell of another evaluator is left out)."""
    output = Path(output)
    judged = json.loads(json.dumps(judge))
    rows = [r for r in cells if r["fingerprint"]["evaluator"] == judged]
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
    "text_windows",
    "write_report",
]
