"""What a search leaves in its output folder, and reading it back.

``DIR/``
  ``history.json``  every evaluated candidate, in order (settings, origin, parameters, score)
  ``best.json``     the best candidate as ``ropescale.patch`` arguments, with its rope_parameters
  ``scaling.yaml``  the same as a suite ``methods:`` entry / training ``scaling:`` section
  ``config.json``   the model's config patched with the best candidate (``rope_parameters`` of type
                    ``longrope`` or ``yarn``: plain transformers builds the scaled model from it; an
                    attention-level method's ``ropescale_*`` type loads through ropescale)
  ``heldout.json``  held-out cells (resumable like the history)
  ``report.md``/``report.json``  calibration vs held-out, with the tokens each used
  ``factors.png``   the found per-pair factors against PI / NTK / YaRN (frequency methods only)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text
from ..attention.modes import TABLE as MODE_TABLE
from ..errors import RopescaleError
from ..markdown import table
from .records import BestFile, MethodParams, PatchKwargs, SearchReport, SearchSettings, SuiteEntry, Trial

DEFAULT_BASELINES = ("linear", "ntk", "dynamic_ntk", "yarn")

BEST = "best.json"
HISTORY = "history.json"
HELDOUT = "heldout.json"
CONFIG = "config.json"
PLOT = "factors.png"
SCALING = "scaling.yaml"
SCALING_HEADER = (
    "# The searched scaling: an eval suite's `methods:` entry (add `label: searched`) or a training\n"
    "# recipe's `scaling:` section; `ropescale patch --from-search DIR` applies it to a model.\n"
)


@dataclass(frozen=True)
class SearchResult:
    """The best configuration a search found, ready for ``ropescale.patch``/``from_pretrained``.

    Attributes:
        method: ``longrope``, ``yarn``, ``self_extend``, ``dca`` or ``string``.
        params: the method's parameters, ``factor`` included.
        model: the model the search ran on.
        calibration_ppl: its perplexity on the calibration windows.
    """

    method: str
    params: MethodParams
    model: str
    calibration_ppl: float
    directory: Path

    def patch_kwargs(self) -> PatchKwargs:
        """``ropescale.patch(model, **result.patch_kwargs(), replace=True)`` (the keyword form of :meth:`scaling`)."""
        return {"method": self.method, **self.params}

    def scaling(self) -> Any:
        """The best configuration as one :class:`~ropescale.scaling.Scaling`: ``ropescale.patch(model,
        result.scaling())``. It replaces a scaling the checkpoint ships with, as the search measured it."""
        from ..scaling import REPLACE, Scaling  # the methods load torch; the search's parser must not

        params = {k: v for k, v in self.params.items() if k != "factor"}
        return Scaling(self.method, self.params.get("factor"), params, start=REPLACE)

    def suite_entry(self, label: str = "searched") -> SuiteEntry:
        """A ``methods:`` entry of an evaluation suite."""
        params = {k: v for k, v in self.params.items() if k != "factor"}
        return {"label": label, "method": self.method, "factor": self.params["factor"], "params": params}


def write_best(directory: Path, space: Any, candidate: Trial, settings: SearchSettings, model_config: Any) -> None:
    """``best.json`` and the patched ``config.json`` for ``candidate``."""
    from ..patching.model import patch_config

    params = space.method_params(candidate["params"])
    config = patch_config(model_config, space.method, replace=True, **params)
    from ..interop.legacy import with_legacy_keys  # the keys transformers 4 / serving engines read

    atomic_write_text(
        directory / CONFIG,
        json.dumps(with_legacy_keys(json.loads(config.to_json_string())), indent=2, sort_keys=True) + "\n",
    )
    import yaml

    scaling = {
        "method": space.method,
        "factor": params["factor"],
        "params": {k: v for k, v in params.items() if k != "factor"},
    }
    atomic_write_text(
        directory / SCALING,
        SCALING_HEADER + yaml.safe_dump(scaling, sort_keys=False, default_flow_style=None, width=120),
    )
    best: BestFile = {
        "method": space.method,
        "params": params,
        "model": settings["model"],
        "candidate": candidate["index"],
        "origin": candidate["origin"],
        "objective": objective_of(settings),
        "calibration": {"ppl": candidate["score"]["ppl"], "tokens": candidate["score"]["tokens"]},
        "rope_parameters": config.rope_parameters,
        "max_position_embeddings": config.max_position_embeddings,
    }
    atomic_write_json(directory / BEST, best)


def load_search(directory: str | os.PathLike) -> SearchResult:
    """The best configuration of a finished (or interrupted) search in ``directory``."""
    directory = Path(directory).expanduser()
    path = directory / BEST
    if not path.is_file():
        what = "has no search result yet" if (directory / HISTORY).is_file() else "is not a search output"
        raise RopescaleError(f"'{directory}' {what} (no {BEST}; run `ropescale search --output {directory}`)")
    try:
        data = json.loads(path.read_text())
        return SearchResult(
            str(data["method"]), dict(data["params"]), str(data["model"]), float(data["calibration"]["ppl"]), directory
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise RopescaleError(f"'{path}' is not a valid search result: {exc}") from None


def objective_of(settings: SearchSettings) -> str:
    """The search's objective (settings without one are perplexity searches, as before objectives existed)."""
    return settings.get("objective", "perplexity")


def _objective_title(settings: SearchSettings) -> str:
    """What the calibration score is, for column titles."""
    objective, needle = objective_of(settings), settings.get("needle") or {}
    needles = f"needle ×{needle.get('prompts')} at {settings['target_length']}"
    windows = f"{settings['layout']} {settings['eval_length']}"
    return {"perplexity": windows, "needle": needles, "mixed": f"{windows} + {needles}"}[objective]


def _objective_line(settings: SearchSettings) -> str:
    objective, needle = objective_of(settings), settings.get("needle") or {}
    if objective == "perplexity":
        return "perplexity of the calibration windows"
    depths = ", ".join(f"{d:g}" for d in needle.get("depths", []))
    line = (
        f"answer-token perplexity of {needle.get('prompts')} needle prompt(s) of {needle.get('length')} tokens "
        f"(depths {depths}; keys from seed {needle.get('seed')})"
    )
    if objective == "mixed":
        w = needle.get("weight", 0.5)
        line = f"exp({1 - w:g}·text NLL + {w:g}·answer NLL): perplexity of the calibration windows and the " + line
    return f"{objective}: " + line


#: what the score a search minimises is called in the report
SCORE_NAMES = {"perplexity": "PPL", "needle": "answer PPL", "mixed": "mixed PPL"}

_SPACE_LINES = {
    "yarn": "YaRN's beta_fast, beta_slow and attention factor",
    **{name: row.search_grid for name, row in MODE_TABLE.items() if row.search_grid},
}


def _space_line(settings: SearchSettings) -> str:
    space = settings.get("space") or {}
    if settings["method"] != "longrope":
        return _SPACE_LINES.get(settings["method"], settings["method"])
    floor = "λ_i ≥ s on pairs with wavelength > L" if space.get("floor") else "no floor"
    return (
        f"per-pair factors λ non-decreasing in [1, {space.get('max_ratio', 1.25):g}·s], {floor}; "
        f"attention factor: {space.get('attention', 'search')}"
    )


def build_report(
    space, history, best, cells, calibration, heldout, options, settings, n_cal, carries: str | None = None
) -> SearchReport:
    """The report of a search (``report.json``): calibration, held-out columns and one row per method."""
    columns = [
        {
            "key": "calibration",
            "title": f"calibration ({_objective_title(settings)})",
            "tokens": best["score"]["tokens"],
        }
    ]
    # every cell measured in this folder is reported (earlier runs may have asked for other lengths or
    # baselines), except a "searched" cell of a candidate that is no longer the best
    best_params = space.method_params(best["params"])
    cells = {k: c for k, c in cells.items() if c["label"] != "searched" or c["params"] == best_params}
    lengths = sorted(
        {
            *options.report_lengths,
            *(int(c["protocol"].split("-")[1]) for c in cells.values() if c["protocol"].startswith("contiguous-")),
        }
    )
    any_proxy = options.heldout or any(c["protocol"] == "calibration-protocol" for c in cells.values())
    protocols = (["calibration-protocol"] if any_proxy else []) + [f"contiguous-{n}" for n in lengths]
    for p in protocols:
        some = next((c for c in cells.values() if c["protocol"] == p), None)
        title = (
            f"held-out ({_objective_title(settings)})" if p == "calibration-protocol" else f"held-out {p.split('-')[1]}"
        )
        columns.append({"key": p, "title": title, "tokens": some["tokens"] if some else None})
    # a seed's calibration score stands for its method only when the seed is that method exactly
    # (not projected onto the floor, attention factor its own)
    exact = (settings.get("space") or {}).get("attention", "search") in ("search", "seed")
    seed_scores = {
        c["origin"].split(":", 1)[1]: c["score"]["ppl"]
        for c in history
        if c["origin"].startswith("seed:") and exact and "note" not in c
    }
    order = ["saved", "none", *DEFAULT_BASELINES]
    extra = sorted(
        {c["label"] for c in cells.values()}, key=lambda x: (order.index(x) if x in order else len(order), x)
    )
    labels = list(dict.fromkeys(["searched", *options.baselines, *extra]))
    rows = []
    # a scaled checkpoint (``carries``: its scaling's label): its rows say what `saved` and `none` ran
    shown = {"saved": f"{carries} (saved)", "none": "none (scaling removed)"} if carries else {}
    for label in labels:
        values = {"calibration": best["score"]["ppl"] if label == "searched" else seed_scores.get(label)}
        for p in protocols:
            cell = cells.get(f"{label}@{p}")
            values[p] = cell["ppl"] if cell else None
        rows.append({"label": shown.get(label, label), "values": values})
    return {
        "settings": settings,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(options).items()},
        "calibration_text": {"title": calibration.title, "source": calibration.source, "note": calibration.note},
        "heldout_text": {"title": heldout.title, "source": heldout.source, "note": heldout.note},
        "calibration_tokens": n_cal,
        "evaluated": len(history),
        "search_seconds": round(math.fsum(c["score"]["seconds"] for c in history), 1),
        "best": {
            "index": best["index"],
            "origin": best["origin"],
            "ppl": best["score"]["ppl"],
            "params": best["params"],
        },
        "columns": columns,
        "rows": rows,
        **({"carries": carries} if carries else {}),
        "heldout_cells": cells,
    }


def markdown_report(report: SearchReport) -> str:
    """The human-readable account of a search: calibration, held-out table, tokens, time."""
    s = report["settings"]
    cal, held = report["calibration_text"], report["heldout_text"]
    if objective_of(s) == "needle":  # the windows are not scored: the text is the prompts' haystack
        calibration = (
            f"- calibration: needle prompts with haystacks from '{cal['title']}' ({cal['source']}): "
            f"{report['columns'][0]['tokens']} answer tokens scored per candidate"
        )
    else:
        calibration = (
            f"- calibration: {s['windows']} window(s) × {s['eval_length']} tokens, layout `{s['layout']}`"
            + (
                f" ({s['chunks']} chunks spread over positions 0..{s['target_length']})"
                if s["layout"] == "spread"
                else ""
            )
            + f", on '{cal['title']}' ({cal['source']}): {report['calibration_tokens']} tokens scored per candidate"
        )
    lines = [
        f"# Search: {s['method']} for {s['model']} at {s['target_length']} tokens (factor {s['factor']:g})",
        "",
        calibration,
        f"- held-out text: '{held['title']}' ({held['source']}){' — ' + held['note'] if held.get('note') else ''}",
        f"- space: {_space_line(s)}",
        f"- objective: {_objective_line(s)}",
        f"- budget: {report['evaluated']} candidates evaluated ({report['search_seconds']:.0f} s of evaluation); "
        f"best #{report['best']['index']} ({report['best']['origin']}), calibration "
        f"{SCORE_NAMES[objective_of(s)]} {report['best']['ppl']:.3f}",
        "",
    ]
    rows = []
    for row in report["rows"]:
        values = (row["values"].get(col["key"]) for col in report["columns"])
        rows.append([row["label"], *("—" if v is None else f"{v:.3f}" for v in values)])
    lines.append(table(["method", *(c["title"] for c in report["columns"])], rows))
    lines += [
        "",
        "Tokens scored per cell: "
        + ", ".join(f"{c['title']}: {c['tokens']}" for c in report["columns"] if c.get("tokens")),
    ]
    return "\n".join(lines) + "\n"
