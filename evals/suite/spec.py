"""A suite as read: its methods (:class:`MethodEntry`), its task blocks (:class:`Suite`) and the YAML form
a results folder keeps beside its cells (:func:`suite_dict`).

Reading and checking a suite file is :mod:`.parse`; running it, :mod:`.runner`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ropescale.evals.tasks import task_table
from ropescale.models.runtime import ATTENTIONS as RUNTIME_ATTENTIONS
from ropescale.models.runtime import DTYPES as RUNTIME_DTYPES
from ropescale.scaling import Scaling

DTYPES = ("auto", *RUNTIME_DTYPES)
ATTENTIONS = ("auto", *RUNTIME_ATTENTIONS)


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
    #: which context L and S took and where each came from, where the suite file wrote relative lengths
    #: (:func:`.lengths.prepare`); printed by the dry run, not kept in the results folder
    contexts: str | None = None
    #: the context the checkpoint serves as shipped, where config.json and the family table are wrong (the
    #: suite's ``shipped_context:`` key, ``--shipped-context``): its S, its composed methods' start, its baseline
    shipped_context: int | None = None

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


def suite_dict(suite: Suite) -> dict[str, Any]:
    """The suite as ``suite.yaml`` of its results folder records it: every key resolved (lengths, labels)."""
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
        **({"shipped_context": suite.shipped_context} if suite.shipped_context else {}),
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
