"""A checkpoint is evaluated as saved unless a method is asked for.

The method ``saved`` (the default of ``ropescale eval perplexity|passkey|needle``) runs the model
with the scaling it carries: a folder written by ``ropescale patch --method yarn --factor 4`` runs
YaRN ×4, its row labelled ``yarn x4 (saved)``. On an unscaled checkpoint ``saved`` is ``none``.
Any method named explicitly replaces the saved scaling, starting from the original RoPE (as
``patch --replace``); ``none`` on a scaled checkpoint is the unscaled baseline, labelled
``none (scaling removed)``. :func:`resolve_saved` rewrites a suite's entries once the model's config
is known; :func:`scaling_origin` says, per cell, how what ran relates to what was saved.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ropescale.evals.tasks.task_base import SuiteError
from ropescale.search.records import ScalingRan

#: the method name that means "the scaling the checkpoint carries"
SAVED = "saved"
REMOVED = "scaling removed"


def is_saved(method: str) -> bool:
    return str(method).strip().lower() == SAVED


def safe_name(label: str) -> str:
    """A label as it appears in a cell's file name (``yarn x4 (saved)`` → ``yarn-x4-saved-``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(label))


def check_file_names(labels: list[str], where: str = "suite") -> None:
    """Two labels that become the same file name would share one cell (one method's rows vanish).

    Raises:
        SuiteError: ``method labels 'a b' and 'a-b' of suite 'x.yaml' both write cells named 'a-b'...``
    """
    seen: dict[str, str] = {}
    for label in labels:
        key = safe_name(label)
        if key in seen and seen[key] != label:
            raise SuiteError(
                f"method labels {seen[key]!r} and {label!r} of {where} both write cells named '{key}__...': "
                "give one of them another label"
            )
        seen[key] = label


def carried(config: Any) -> ScalingRan | None:
    """The scaling a checkpoint's config carries (:func:`ropescale.patching.readback.scaling_of`),
    None for plain RoPE."""
    from ropescale.patching.plan import is_scaled
    from ropescale.patching.readback import scaling_of

    return scaling_of(config) if is_scaled(config) else None


def resolve_saved(suite: Any, config: Any) -> Any:
    """``suite`` with its entries resolved against the model's config: ``saved`` becomes ``none`` on
    an unscaled checkpoint and is labelled by what it runs on a scaled one; a default-labelled
    ``none`` on a scaled checkpoint says ``scaling removed``; on an unscaled checkpoint a default-labelled
    ``saved`` beside ``none`` is dropped (the same cells, run once). Sets ``suite.carries`` (the saved
    scaling's label, None when unscaled).

    Raises:
        SuiteError: two entries end with the same label (``saved`` and ``none`` on an unscaled model).
    """
    from ropescale.patching.readback import scaling_label

    saved = carried(config)
    entries = []
    plain_none = any(m.label == m.method and m.method.lower() in ("none", "default") for m in suite.methods)
    for entry in suite.methods:
        default_label = entry.label == entry.method
        if is_saved(entry.method):
            if saved is None and default_label and plain_none:
                continue  # unscaled: `saved` is the suite's `none`, run once
            if saved is None:
                entry = dataclasses.replace(entry, method="none", label="none" if default_label else entry.label)
            elif default_label:
                entry = dataclasses.replace(entry, label=f"{scaling_label(saved)} ({SAVED})")
        elif saved is not None and default_label and entry.method.lower() in ("none", "default"):
            entry = dataclasses.replace(entry, label=f"none ({REMOVED})")
        entries.append(entry)
    labels = [e.label for e in entries]
    asked = [
        m.label
        for m in suite.methods
        if not (is_saved(m.method) and saved is None and m.label == m.method and plain_none)
    ]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise SuiteError(
                f"methods '{asked[labels.index(label)]}' and '{asked[i]}' both run as '{label}' on model "
                f"'{suite.model}' ({'unscaled' if saved is None else scaling_label(saved)}): keep one"
            )
    check_file_names(labels, f"suite '{suite.name}'")
    out = dataclasses.replace(suite, methods=entries)
    out.carries = None if saved is None else scaling_label(saved)
    return out


def scaling_origin(entry: Any, carries: str | None, same: bool = False) -> str:
    """How a cell's scaling relates to the checkpoint's: ``saved``, ``scaling removed``,
    ``replaces saved yarn x4``, ``same as saved`` (a method named that resolves to the saved scaling
    exactly: ``same``), or ``requested`` (an unscaled checkpoint)."""
    if is_saved(entry.method):
        return SAVED
    if carries is None:
        return "requested"
    if same:
        return f"same as saved {carries}"
    return REMOVED if entry.method.lower() in ("none", "default") else f"replaces saved {carries}"


__all__ = ["REMOVED", "SAVED", "carried", "check_file_names", "is_saved", "resolve_saved", "scaling_origin"]
