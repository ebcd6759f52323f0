"""Windows drawn from a weighted mix of sources (``data.sources``, :mod:`ropescale.data.sources`).

Each source is tokenized into its own packed stream (documents whole, each apart from the next
under ``data.packing: documents``), cached in the run folder as ``data/source-<i>.npy``. Sample
``g`` picks its source with probability ``weight / sum(weights)`` and a window of that source
uniformly, both from the generator seeded ``(seed, g, 3)``: like the single-source windows, a
window is a pure function of ``(seed, g)``, so a resumed run reads what it would have read.
Windows are drawn with replacement (a source's windows are not visited in epochs), so the share
of each source is a binomial draw around its weight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.sources import PYTHON_PREFIX, SourceSpec, mix_documents, parse_sources, python_root
from ..errors import RopescaleError
from .data import (
    StreamKey,
    TokenStream,
    WindowDataset,
    WindowSpec,
    cached_stream,
    stack_samples,
    tokenize_stream,
)
from .packing import resolved_packing


class MixedWindows:
    """Training windows from several :class:`WindowDataset` s, each window's source drawn by weight.

    Args:
        parts: one dataset per source.
        weights: the sources' weights (any positive numbers).
        seed: the run's seed.
    """

    def __init__(self, parts: Sequence[WindowDataset], weights: Sequence[float], seed: int = 0):
        self.parts, self.seed = list(parts), seed
        w = np.asarray(weights, np.float64)
        self.cumulative = np.cumsum(w / w.sum())  # [S]
        self.n_windows = sum(p.n_windows for p in self.parts)

    def __len__(self) -> int:
        return self.n_windows

    def pick(self, index: int) -> tuple[int, int]:
        """``(source, window of that source)`` of global sample ``index``."""
        rng = np.random.default_rng([self.seed, index, 3])
        source = min(int(np.searchsorted(self.cumulative, rng.random(), side="right")), len(self.parts) - 1)
        return source, int(rng.integers(self.parts[source].n_windows))

    @property
    def spec(self) -> WindowSpec:
        return self.parts[0].spec

    def sample(self, index: int, short: bool = False) -> dict[str, torch.Tensor]:
        source, slot = self.pick(index)
        return self.parts[source].window(slot, index, short)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Stacked samples (all short or all long). # each [len(indices), seq_len]"""
        return stack_samples(self, indices)


def source_fingerprint(spec: SourceSpec) -> str | None:
    """A source's content fingerprint for the stream cache: a ``python:`` tree by its files' paths,
    sizes and modification times; a local file or folder by content; a corpus by name (None)."""
    if spec.source.startswith(PYTHON_PREFIX):
        root = python_root(spec.source)
        digest = hashlib.sha256(str(root).encode())
        for path in sorted(root.rglob("*.py")):
            # is_file: a symlink loop named *.py is left out, as python_documents leaves it out
            if "site-packages" not in path.relative_to(root).parts and path.is_file():
                st = path.stat()
                digest.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return digest.hexdigest()
    from ..models.identity import data_identity

    return data_identity(spec.source).get("fingerprint")


def mixed_streams(config: Any, tokenizer: Any, folder: Path) -> list[TokenStream]:
    """One cached token stream per entry of ``data.sources`` (training documents only)."""
    d = config.data
    specs = parse_sources(d.sources)
    packing = resolved_packing(d)
    split = None
    streams = []
    for i, spec in enumerate(specs):

        def build(i: int = i, spec: SourceSpec = spec) -> TokenStream:
            nonlocal split
            if split is None:  # every source is read once, and only if some cache is stale
                split = mix_documents(specs, d.holdout, d.text_field)
            return tokenize_stream(tokenizer, split[i][1], spec.max_tokens, packing, d.chat_loss)

        key = StreamKey(
            source=spec.source,
            content=source_fingerprint(spec),
            holdout=d.holdout,
            max_tokens=spec.max_tokens,
            packing=packing,
            chat_loss=d.chat_loss,
            tokenizer=getattr(tokenizer, "name_or_path", "?"),
            vocab=len(tokenizer),
        )
        streams.append(cached_stream(folder / f"source-{i}.npy", key, build))
    return streams


def mixed_windows(config: Any, tokenizer: Any, folder: Path, spec: WindowSpec, recall: Any = None) -> MixedWindows:
    """The recipe's :class:`MixedWindows` over its ``data.sources``."""
    specs = parse_sources(config.data.sources)
    streams = mixed_streams(config, tokenizer, folder)
    parts = []
    for source, stream in zip(specs, streams):
        try:
            parts.append(WindowDataset(stream, spec, seed=config.train.seed, recall=recall))
        except RopescaleError as exc:
            raise RopescaleError(f"data source '{source.label}': {exc}") from None
    return MixedWindows(parts, [s.weight for s in specs], seed=config.train.seed)


def mixed_heldout(config: Any) -> list[tuple[str, Any]]:
    """The held-out documents of every source of the mix (the evaluation text)."""
    specs = parse_sources(config.data.sources)
    return [doc for _, _, held in mix_documents(specs, config.data.holdout, config.data.text_field) for doc in held]
