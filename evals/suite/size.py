"""Sizing a suite to the time a user has: ``ropescale eval suite NAME --lengths ... --samples N``.

A shipped suite is written for one model; on another its relative lengths (``2L``, ``target``,
:mod:`.lengths`) may mean cells of 64k or 128k tokens (a Qwen2.5 checkpoint is trained at
32k, so ``extend-check``'s ``2L`` is 65,536). Two flags make it small, as lm-eval's ``--limit``
does for its tasks:

- ``--lengths`` replaces every task's lengths (token counts, ``4k``, or relative: ``L/4``, ``L``,
  ``2L``, ``target``); a method's ``only`` keeps the lengths it names that are still asked for;
- ``--samples N`` caps the prompts of each retrieval cell: RULER's ``samples``; passkey and needle
  keep every depth and run ``max(1, N // depths)`` trials at each (so never fewer than one per depth).

Prompt counts are part of a cell's protocol (:func:`.cell_keys.measured`), so a cell sized down by
``--samples`` is never resumed as, or reported as, the suite's full cell; lengths are not (a cell at
a length is the same cell whichever lengths were asked beside it). The suite records what was
sized (``sized``), and its report says so.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from ropescale.evals.suite.checks import SuiteError


def lengths_option(text: str) -> list[int | str]:
    """``--lengths`` of ``eval suite``: comma-separated token counts (``2048``, ``4k``) or lengths
    relative to the model's trained context (``L/4``, ``L``, ``2L``, ``target``), resolved later
    with the suite's own (:func:`.lengths.prepare`).

    Raises:
        ValueError: an empty list or a value that is neither (one line, naming ``--lengths``).
    """
    from ropescale import options
    from ropescale.evals.suite.lengths import is_relative

    items = [v.strip() for v in str(text).split(",") if v.strip()]
    if not items:
        raise ValueError(f"--lengths must be comma-separated lengths (4096, 4k, L/4, 2L, target), got {text!r}")
    out: list[int | str] = []
    for item in items:
        if is_relative(item):
            out.append(item)
            continue
        try:
            out.append(options.length(item))
        except ValueError:
            raise ValueError(
                f"{item!r} is not a length (a token count such as 4096 or 4k, or relative to the "
                "model's trained or shipped context: L/4, L, 2L, S, target)"
            ) from None
    return out


def with_lengths(raw: Any, lengths: list[int | str] | None) -> Any:
    """The suite mapping ``raw`` with every task's lengths replaced by ``lengths`` (unresolved: relative
    values are resolved with the suite's own, :func:`.lengths.prepare`)."""
    if lengths is None or not isinstance(raw, dict):
        return raw
    from ropescale.evals.tasks.task_table import names

    raw = copy.deepcopy(raw)
    for task in names():
        if isinstance(raw.get(task), dict):
            raw[task]["lengths"] = list(lengths)
    return raw


def keep_only_asked(raw: Any) -> Any:
    """``raw`` (lengths resolved and read, :func:`.parse._read_lengths`) with each method's ``only``
    reduced to the lengths its task still runs: ``only: {passkey: [4096]}`` of a suite asked at
    ``--lengths 2k`` runs that method's passkey nowhere (``[]``), as the suite meant it to run only there."""
    if not isinstance(raw, dict) or not isinstance(raw.get("methods"), list):
        return raw
    raw = copy.deepcopy(raw)
    for entry in raw["methods"]:
        only = entry.get("only") if isinstance(entry, dict) else None
        if not isinstance(only, dict):
            continue
        for task, lengths in only.items():
            block = raw.get(task)
            if isinstance(lengths, list) and isinstance(block, dict) and isinstance(block.get("lengths"), list):
                only[task] = [n for n in lengths if n in block["lengths"]]
    return raw


def with_samples(suite: Any, samples: int) -> tuple[Any, list[str]]:
    """``suite`` with each retrieval cell's prompts capped at ``samples`` (see the module), and one
    phrase per task it changed (``passkey: 3 depths x 1 trial (the suite's: x 5)``). A task whose
    cells already have at most that many prompts is left as it is (its cells stay the full suite's)."""
    from dataclasses import fields

    blocks = copy.deepcopy(suite.blocks)
    said = []
    for task in suite.tasks():
        names = {f.name for f in fields(suite.kind(task).settings)}
        settings = suite.settings(task)
        if "samples" in names and settings.samples > samples:
            blocks[task]["samples"] = samples
            said.append(f"{task}: {samples} samples (the suite's: {settings.samples})")
        elif {"depths", "trials"} <= names:
            depths = len(settings.depths)
            trials = max(1, min(settings.trials, samples // depths))
            if trials < settings.trials:
                blocks[task]["trials"] = trials
                said.append(
                    f"{task}: {depths} depths × {trials} trial{'s' if trials > 1 else ''} "
                    f"(the suite's: × {settings.trials})"
                )
    return dataclasses.replace(suite, blocks=blocks), said


def sized_text(lengths: list[int | str] | None, samples: int | None, resolved: Any, said: list[str]) -> str | None:
    """The line a sized suite's report and ``suite.yaml`` carry (None: the suite as its file has it)."""
    if lengths is None and samples is None:
        return None
    flags = []
    if lengths is not None:
        flags.append("--lengths " + ",".join(str(v) for v in lengths))
    if samples is not None:
        flags.append(f"--samples {samples}")
    parts = []
    if lengths is not None:
        asked = sorted({n for t in resolved.tasks() for n in resolved.block(t)["lengths"]})
        parts.append("lengths " + ", ".join(f"{n:,}" for n in asked))
    parts += said or ([] if samples is None else [f"no cell had more than {samples} prompts"])
    return f"Sized with `{' '.join(flags)}`, not the suite file's matrix: " + "; ".join(parts) + "."


def check_samples(samples: Any) -> int | None:
    """``--samples``: a positive number of prompts, or None."""
    if samples is None:
        return None
    if isinstance(samples, bool) or not isinstance(samples, int) or samples <= 0:
        raise SuiteError(f"--samples must be a positive number of prompts, got {samples!r}")
    return samples


__all__ = ["check_samples", "keep_only_asked", "lengths_option", "sized_text", "with_lengths", "with_samples"]
