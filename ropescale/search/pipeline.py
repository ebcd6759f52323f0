"""A whole search: calibration text → candidates → best config → held-out report.

:func:`search_model` works on a loaded model and token lists (what the tests and the benchmark
call); :func:`run_search_job` resolves ``--model`` and ``--data`` first (what the CLI calls).

Calibration and held-out texts are kept apart: by default the held-out text is the longest
document of the data (Emma for the embedded Austen corpus) and
the calibration text the next one; a single document is cut into two disjoint halves.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_write_json, atomic_write_text
from ..errors import RopescaleError
from ..methods import RotarySpec, get_method
from ..patching.plan import original_spec
from ..plots.factors import plot_factors
from .artifacts import (
    BEST,
    CONFIG,
    HELDOUT,
    HISTORY,
    PLOT,
    SCALING,
    build_report,
    markdown_report,
    write_best,
)
from .engine import best_of, run_search
from .needles import build_objective, needle_settings, tokens_needed
from .objective import LAYOUTS, make_windows
from .options import SearchOptions
from .records import HeldoutCell, MethodParams, SearchReport, SearchSettings, SpaceSettings, Trial
from .space import make_space, pair_factors

#: the baseline that runs the model as loaded (a scaled checkpoint's own scaling; ``evals/tasks/saved.py``)
SAVED = "saved"
OUR_FILES = (BEST, HISTORY, HELDOUT, CONFIG, PLOT, SCALING, "report.md", "report.json")


@dataclass(frozen=True)
class Text:
    """A tokenized text and where it came from (for the report)."""

    title: str
    source: str
    tokens: list[int]
    note: str = ""

    def fingerprint(self, n: int) -> str:
        return hashlib.sha256(",".join(map(str, self.tokens[:n])).encode()).hexdigest()[:16]


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def validate(options: SearchOptions, spec: RotarySpec) -> tuple[float, int, bool]:
    """Check the options against the model; return (factor, eval_length, floor)."""
    L = spec.original_max_position_embeddings
    target = _check_int("target length", options.target_length)
    if target <= L:
        raise ValueError(f"target length {target} must exceed the model's original context {L}")
    eval_length = _check_int("eval length", options.eval_length if options.eval_length is not None else target, 2)
    _check_int("budget", options.budget)
    _check_int("windows", options.windows)
    if options.layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {options.layout!r}")
    if options.layout == "contiguous" and eval_length <= L:
        raise ValueError(
            f"eval length {eval_length} must exceed the original context {L}: longrope uses its long "
            "factors only beyond it (or use layout 'spread', which places the tokens up to the target)"
        )
    if options.layout == "spread":
        _check_int("chunks", options.chunks)
        if eval_length + 1 > target:
            raise ValueError(
                f"a spread window ({eval_length} tokens + BOS) must be shorter than the target length {target}"
            )
    if eval_length > target:
        raise ValueError(f"eval length {eval_length} is larger than the target length {target}")
    for n in options.report_lengths:
        _check_int("report length", n, 2)
        if n > target:
            raise ValueError(f"report length {n} is larger than the target length {target}")
    floor = (
        options.floor if options.floor is not None else not (options.layout == "contiguous" and eval_length >= target)
    )
    if options.objective == "mixed" and not 0 <= options.needle_weight <= 1:
        raise ValueError(f"needle weight must be in [0, 1], got {options.needle_weight!r}")
    return target / L, eval_length, floor


def _baseline(name: str, factor: float) -> tuple[str, MethodParams]:
    key = name.strip().lower()
    if key in ("none", "default"):
        return "default", {}
    if key == SAVED:  # the model as loaded: a scaled checkpoint's own scaling
        return SAVED, {}
    get_method(key, factor=factor)  # validates the name
    return key, {"factor": factor}


def search_model(
    model: Any,
    calibration: Text,
    heldout: Text,
    options: SearchOptions,
    output: str | Path,
    bos_token_id: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    tokenizer: Any = None,
) -> SearchReport:
    """Search ``options.method``'s parameters for ``model`` at ``options.target_length``.

    Args:
        model: a loaded Llama/Mistral-family ``*ForCausalLM``; re-patched for every candidate and left
            patched with the best one.
        calibration: the text the search minimises perplexity on.
        heldout: a different text for the report.
        options: the search settings.
        output: folder for the history, best config, held-out cells, report and plot; a search
            already there with the same settings is resumed.
        bos_token_id: BOS prepended to every window.
        overwrite: discard an earlier search in ``output``.
        progress: progress bars.
        tokenizer: the model's tokenizer; the ``needle`` and ``mixed`` objectives build their prompts with it.

    Returns:
        The report (also written to ``output/report.json`` and ``report.md``).
    """
    from ..patching.model import patch
    from ..patching.plan import is_scaled
    from ..patching.readback import scaling_label, scaling_of, snapshot_scaling

    start = time.perf_counter()
    config = model.config
    spec = original_spec(config)
    as_loaded = snapshot_scaling(model)  # before any candidate is patched in: the `saved` baseline
    as_loaded["scaling"] = scaling_of(model)
    carries = scaling_label(scaling_of(config)) if is_scaled(config) else None
    factor, eval_length, floor = validate(options, spec)
    target = options.target_length
    space_options: SpaceSettings = {}
    if options.method.strip().lower() == "longrope":
        space_options = {"max_ratio": options.max_ratio, "floor": floor}
        space_options.update(attention=options.attention, short=options.short)
    space = make_space(options.method, spec, factor, **space_options)
    needles = needle_settings(options)

    def objective_on(text: Text) -> Any:
        windows = None
        if options.objective != "needle":
            args = (eval_length, options.windows, options.layout, target, options.chunks, bos_token_id)
            windows = make_windows(text.tokens, *args)
        args = (options.objective, model, space.method, text.tokens, windows, needles, tokenizer, bos_token_id)
        return build_objective(*args, weight=options.needle_weight)

    objective = objective_on(calibration)
    n_cal = eval_length * options.windows
    settings: SearchSettings = {
        "model": options.model,
        "method": space.method,
        "target_length": target,
        "factor": factor,
        "original_max_position_embeddings": spec.original_max_position_embeddings,
        "eval_length": eval_length,
        "windows": options.windows,
        "layout": options.layout,
        "chunks": options.chunks if options.layout == "spread" else None,
        "seed": options.seed,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "bos_token_id": bos_token_id,
        "space": {k: getattr(space, k) for k in space_options},
        "calibration": {
            "title": calibration.title,
            "source": calibration.source,
            "tokens": n_cal,
            "sha256": calibration.fingerprint(n_cal),
        },
    }
    if needles is not None:  # only then: a perplexity search's settings stay those of earlier versions
        settings["objective"] = options.objective
        n_hay = needles.tokens_needed
        settings["needle"] = {**needles.as_dict(), "haystack_sha256": calibration.fingerprint(n_hay)}
        if options.objective == "mixed":
            settings["needle"]["weight"] = options.needle_weight
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in OUR_FILES:
            (output / name).unlink(missing_ok=True)
    # the config written with the best candidate starts from the model's unscaled config
    base_config = _unscaled(config)

    written: dict[str, int | None] = {"index": None}

    def on_record(history: list[Trial]) -> None:
        best = best_of(history)
        if best is not None and best["index"] != written["index"]:
            write_best(output, space, best, settings, base_config)
            written["index"] = best["index"]

    history = run_search(
        space, objective, options.budget, output / HISTORY, settings, options.seed, progress, on_record
    )
    best = best_of(history)
    if best is None:
        raise RopescaleError("every candidate gave a non-finite perplexity; nothing to write")
    write_best(output, space, best, settings, base_config)

    held_objective = objective_on(heldout) if options.heldout else None
    heldout_cells = _heldout(
        model, space, best, heldout, options, settings, factor, held_objective, output, progress, as_loaded
    )
    patch(model, space.method, replace=True, **space.method_params(best["params"]))

    report = build_report(
        space, history, best, heldout_cells, calibration, heldout, options, settings, n_cal, carries=carries
    )
    report["wall_seconds_this_run"] = round(time.perf_counter() - start, 1)
    atomic_write_json(output / "report.json", report)
    atomic_write_text(output / "report.md", markdown_report(report))
    seeds = {name: pair_factors(name, spec, factor, target)[0] for name in ("linear", "ntk", "yarn")}
    title = (
        f"{options.model}: {space.method} search, {spec.original_max_position_embeddings} → {target} "
        f"(s={factor:g}); calibration PPL {best['score']['ppl']:.2f}"
    )
    lam = space.factors(best["params"])
    if lam is not None:  # attention-level methods keep their frequencies: nothing to plot
        plot_factors(output / PLOT, space, {"lam": lam, "label": f"searched (#{best['index']})"}, seeds, title)
    return report


def _unscaled(config: Any) -> Any:
    """A copy of ``config`` with its original (unscaled) rope parameters."""
    import copy

    from ..patching.plan import original_geometry, provenance

    out = copy.deepcopy(config)
    rope, field_value, _ = original_geometry(config)
    out.rope_parameters = rope
    out.max_position_embeddings = field_value
    if provenance(out) is not None:
        delattr(out, "ropescale")
    return out


def _heldout(
    model,
    space,
    best,
    heldout: Text,
    options: SearchOptions,
    settings,
    factor,
    held_objective,
    output,
    progress,
    as_loaded=None,
):
    """Held-out cells, each recorded atomically in ``heldout.json`` and reused while its method,
    parameters and protocol are unchanged; each records the scaling it ran, read back from the model
    (``saved``: the model as loaded, ``as_loaded`` of :func:`ropescale.patching.readback.snapshot_scaling`)."""
    import json

    from ..patching.model import patch
    from ..patching.readback import restore_scaling, scaling_of
    from ..scoring.perplexity import evaluate_perplexity

    path = output / HELDOUT
    # the whole text's fingerprint: adding report lengths later keeps the cells already computed
    identity = {
        "search": settings,
        "heldout": {
            "title": heldout.title,
            "source": heldout.source,
            "sha256": heldout.fingerprint(len(heldout.tokens)),
        },
    }
    cells: dict[str, HeldoutCell] = {}
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("identity") == identity:
            cells = data.get("cells", {})
    methods = [("searched", space.method, space.method_params(best["params"]))]
    methods += [(name, *_baseline(name, factor)) for name in options.baselines]
    protocols: list[tuple[str, int | None]] = []
    if options.heldout:
        protocols.append(("calibration-protocol", None))
    protocols += [(f"contiguous-{n}", n) for n in options.report_lengths]
    todo = [(p, m) for p in protocols for m in methods]
    from tqdm.auto import tqdm

    for (protocol, length), (label, method, params) in tqdm(todo, desc="held-out", unit="cell", disable=not progress):
        key = f"{label}@{protocol}"
        same = cells.get(key, {}).get("method") == method and cells[key]["params"] == params
        if same and (method != SAVED or cells[key].get("scaling") == as_loaded["scaling"]):
            continue  # a saved cell only while the model carries the same scaling
        if method == SAVED:
            restore_scaling(model, as_loaded)
        else:
            patch(model, method, replace=True, **params)
        if length is None:  # the search's own objective, on the held-out text
            score = held_objective.evaluate()
            result = {"ppl": score.ppl, "tokens": score.tokens, "seconds": round(score.seconds, 3)}
        else:
            if len(heldout.tokens) < length:
                raise RopescaleError(
                    f"held-out text '{heldout.title}' has {len(heldout.tokens)} tokens, fewer than {length}"
                )
            r = evaluate_perplexity(
                model,
                [heldout.tokens],
                window=length,
                mode="nonoverlap",
                bos_token_id=settings["bos_token_id"],
                max_tokens=length,
                progress=False,
            )
            result = {"ppl": r.ppl, "tokens": r.tokens_scored, "seconds": round(r.elapsed_s, 3)}
        ran = scaling_of(model)  # read back from the model, not from the request
        cells[key] = {
            "label": label,
            "method": method,
            "params": params,
            "protocol": protocol,
            **result,
            "scaling": ran,
        }
        atomic_write_json(path, {"identity": identity, "cells": cells})
    return cells


# -- from names to texts and a model --------------------------------------------------------------------


def _pick(documents: list[tuple[str, str]], title: str | None, source: str) -> tuple[str, str]:
    if title is None:
        return documents[0]
    for doc in documents:
        if doc[0].lower() == title.lower():
            return doc
    names = ", ".join(t for t, _ in documents[:12])
    raise RopescaleError(f"no document titled '{title}' in data '{source}' (documents: {names})")


def select_texts(tokenizer: Any, options: SearchOptions, need_calibration: int, need_heldout: int) -> tuple[Text, Text]:
    """The calibration and held-out texts (see the module docstring), tokenized without specials."""
    from ..data.documents import load_documents

    cal_source = options.data or "austen"
    held_source = options.heldout_data or cal_source
    cal_docs = sorted(load_documents(cal_source), key=lambda d: -len(d[1]))
    held_docs = cal_docs if held_source == cal_source else sorted(load_documents(held_source), key=lambda d: -len(d[1]))
    if held_source == cal_source and options.data_doc is None and options.heldout_doc is None and len(cal_docs) >= 2:
        held, cal = cal_docs[0], cal_docs[1]
    else:
        held = _pick(held_docs, options.heldout_doc, held_source)
        rest = [d for d in cal_docs if not (held_source == cal_source and d[0] == held[0])] or cal_docs
        cal = _pick(rest if options.data_doc is None else cal_docs, options.data_doc, cal_source)

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    if held_source == cal_source and held[0] == cal[0]:
        tokens = ids(cal[1])
        half = len(tokens) // 2
        note = "same document as the calibration text: its second half, disjoint from the calibration tokens"
        calibration = Text(cal[0], cal_source, tokens[:half], "first half")
        held_text = Text(held[0], held_source, tokens[half:], note)
    else:
        calibration, held_text = Text(cal[0], cal_source, ids(cal[1])), Text(held[0], held_source, ids(held[1]))
    for text, need, what in ((calibration, need_calibration, "calibration"), (held_text, need_heldout, "held-out")):
        if len(text.tokens) < need:
            raise RopescaleError(f"{what} text '{text.title}' has {len(text.tokens)} tokens; this search needs {need}")
    return calibration, held_text


def shipped_line(config: Any) -> str:
    """What a search does with the scaling a checkpoint ships with: every candidate starts from the
    pretraining frequencies (the search's space is LongRoPE/YaRN from L), the model as shipped beside them."""
    from ..patching.geometry import scaling_label
    from ..patching.shipped import shipped_of

    shipped = shipped_of(config)
    trained = {True: "trained with it", False: "applied without training", None: "unknown"}[shipped.trained]
    return (
        f"ropescale: search: every candidate replaces the shipped {scaling_label(shipped.scaling or {})} "
        f"({trained}: {shipped.trained_source}), starting from the "
        f"pretraining frequencies at {shipped.pretraining}; the model as shipped is measured beside them (saved)"
    )


def run_search_job(
    options: SearchOptions, output: str | Path, overwrite: bool = False, progress: bool = True
) -> SearchReport:
    """Load ``options.model`` and its texts, then :func:`search_model` (what ``ropescale search`` runs)."""
    from ..models.loading import from_pretrained, load_config, load_tokenizer
    from ..models.runtime import resolve_runtime

    runtime = resolve_runtime(options.device, options.dtype, options.attn_implementation)
    config = load_config(options.model)
    spec = original_spec(config)
    _, eval_length, _ = validate(options, spec)  # fail on bad options before loading anything large
    tokenizer = load_tokenizer(options.model)
    need_cal = tokens_needed(options, eval_length)
    need_held = max([need_cal if options.heldout else 0, *options.report_lengths])
    calibration, heldout = select_texts(tokenizer, options, need_cal, need_held)
    from ..patching.plan import is_scaled

    if is_scaled(config):  # never silently: every candidate replaces the shipped scaling, and says so
        print(shipped_line(config), file=sys.stderr)
    if is_scaled(config) and SAVED not in options.baselines:  # a scaled checkpoint: measure it as saved too
        import dataclasses

        options = dataclasses.replace(options, baselines=(SAVED, *options.baselines))
    model = runtime.place(from_pretrained(options.model, **runtime.load_kwargs()))
    bos = tokenizer.bos_token_id
    return search_model(model, calibration, heldout, options, output, bos, overwrite, progress, tokenizer)


__all__ = ["SearchOptions", "Text", "search_model", "run_search_job", "select_texts"]
