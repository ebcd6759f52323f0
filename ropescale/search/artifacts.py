"""What a search leaves in its output folder, and reading it back.

``DIR/``
  ``history.json``  every evaluated candidate, in order (settings, origin, parameters, score)
  ``best.json``     the best candidate as ``ropescale.patch`` arguments, with its rope_parameters
  ``scaling.yaml``  the same as a suite ``methods:`` entry / training ``scaling:`` section
  ``config.json``   the model's config patched with the best candidate (``rope_parameters`` of type
                    ``longrope`` or ``yarn``): plain transformers builds the scaled model from it
  ``heldout.json``  held-out cells (resumable like the history)
  ``report.md``/``report.json``  calibration vs held-out, with the tokens each used
  ``factors.png``   the found per-pair factors against PI / NTK / YaRN
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text
from ..errors import RopescaleError

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
        method: ``longrope`` or ``yarn``.
        params: the method's parameters, ``factor`` included.
        model: the model the search ran on.
        calibration_ppl: its perplexity on the calibration windows.
    """

    method: str
    params: dict[str, Any]
    model: str
    calibration_ppl: float
    directory: Path

    def patch_kwargs(self) -> dict[str, Any]:
        """``ropescale.patch(model, **result.patch_kwargs(), replace=True)``."""
        return {"method": self.method, **self.params}

    def suite_entry(self, label: str = "searched") -> dict[str, Any]:
        """A ``methods:`` entry of an evaluation suite."""
        params = {k: v for k, v in self.params.items() if k != "factor"}
        return {"label": label, "method": self.method, "factor": self.params["factor"], "params": params}


def write_best(
    directory: Path, space: Any, candidate: dict[str, Any], settings: dict[str, Any], model_config: Any
) -> None:
    """``best.json`` and the patched ``config.json`` for ``candidate``."""
    from ..patching.config import patch_config

    params = space.method_params(candidate["params"])
    config = patch_config(model_config, space.method, replace=True, **params)
    from ..export.legacy import with_legacy_keys  # the keys transformers 4 / serving engines read

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
    atomic_write_json(
        directory / BEST,
        {
            "method": space.method,
            "params": params,
            "model": settings["model"],
            "candidate": candidate["index"],
            "origin": candidate["origin"],
            "calibration": {"ppl": candidate["score"]["ppl"], "tokens": candidate["score"]["tokens"]},
            "rope_parameters": config.rope_parameters,
            "max_position_embeddings": config.max_position_embeddings,
        },
    )


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


def plot_factors(
    path: Path, space: Any, best: dict[str, Any], seeds: dict[str, list[float]], title: str
) -> Path | None:
    """Per-pair λ_i = θ_i/θ'_i of the best candidate against the closed-form methods (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (matplotlib comes with ropescale[eval])
        return None
    spec = space.spec
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    styles = {"linear": ":", "ntk": "--", "yarn": "-."}
    for name, lam in seeds.items():
        ax.plot(
            range(len(lam)),
            lam,
            styles.get(name, ":"),
            color="gray" if name != "yarn" else "tab:orange",
            label={"linear": "PI", "ntk": "NTK", "yarn": "YaRN"}.get(name, name),
        )
    ax.plot(range(len(best["lam"])), best["lam"], "o-", color="tab:blue", ms=3.5, label=best["label"])
    wavelengths = [2 * math.pi / t for t in spec.base_inv_freq().tolist()]
    critical = next((i for i, w in enumerate(wavelengths) if w > spec.original_max_position_embeddings), None)
    if critical is not None:
        ax.axvline(critical - 0.5, color="k", lw=0.6, alpha=0.5)
        ax.text(critical - 0.3, 1.02, "wavelength > L", fontsize=8, alpha=0.7, va="bottom")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(_ticks(max(max(best["lam"]), *(max(v) for v in seeds.values()))))
    ax.set_xlabel("rotary pair i (high → low frequency)")
    ax.set_ylabel("rescale factor λ_i = θ_i / θ'_i")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def _space_line(settings: dict[str, Any]) -> str:
    space = settings.get("space") or {}
    if settings["method"] != "longrope":
        return "YaRN's beta_fast, beta_slow and attention factor"
    floor = "λ_i ≥ s on pairs with wavelength > L" if space.get("floor") else "no floor"
    return (
        f"per-pair factors λ non-decreasing in [1, {space.get('max_ratio', 1.25):g}·s], {floor}; "
        f"attention factor: {space.get('attention', 'search')}"
    )


def _ticks(upper: float) -> list[float]:
    return [t for t in (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32) if t <= upper * 1.05]


def markdown_report(report: dict[str, Any]) -> str:
    """The human-readable account of a search: calibration, held-out table, tokens, time."""
    s = report["settings"]
    cal, held = report["calibration_text"], report["heldout_text"]
    lines = [
        f"# Search: {s['method']} for {s['model']} at {s['target_length']} tokens (factor {s['factor']:g})",
        "",
        f"- calibration: {s['windows']} window(s) × {s['eval_length']} tokens, layout `{s['layout']}`"
        + (f" ({s['chunks']} chunks spread over positions 0..{s['target_length']})" if s["layout"] == "spread" else "")
        + f", on '{cal['title']}' ({cal['source']}): {report['calibration_tokens']} tokens scored per candidate",
        f"- held-out text: '{held['title']}' ({held['source']}){' — ' + held['note'] if held.get('note') else ''}",
        f"- space: {_space_line(s)}",
        f"- budget: {report['evaluated']} candidates evaluated ({report['search_seconds']:.0f} s of evaluation); "
        f"best #{report['best']['index']} ({report['best']['origin']}), calibration PPL {report['best']['ppl']:.3f}",
        "",
        "| method | " + " | ".join(c["title"] for c in report["columns"]) + " |",
        "|---|" + "---|" * len(report["columns"]),
    ]
    for row in report["rows"]:
        cells = []
        for col in report["columns"]:
            v = row["values"].get(col["key"])
            cells.append("—" if v is None else f"{v:.3f}")
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Tokens scored per cell: "
        + ", ".join(f"{c['title']}: {c['tokens']}" for c in report["columns"] if c.get("tokens")),
    ]
    return "\n".join(lines) + "\n"
