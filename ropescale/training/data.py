"""Training data: documents packed into one token stream and cut into windows (optionally PoSE).

* **Packing.** Documents are tokenized without special tokens and joined as
  ``BOS doc EOS BOS doc EOS ...`` (one separator token when BOS and EOS are the same token), so
  a window that crosses a document boundary sees where one ends and the next begins. Attention
  is not blocked at the boundary (as in YaRN's and LongLoRA's packed PG19 chunks).
* **Windows.** Window ``k`` takes the stream's text from ``k × stride`` on; with
  ``bos_each_window`` every window starts with BOS, as every window of the perplexity evaluation
  does. With PoSE the window's tokens come from a span of up to ``target_length`` text tokens and
  carry the skipped position ids (:mod:`ropescale.training.pose`).
* **Recall sentences** (``data.recall_facts``): written over each window's text after it is cut
  (:mod:`ropescale.training.recall`).
* **Order.** A window is a pure function of ``(seed, global sample index)``: the epoch's
  permutation comes from ``seed + epoch``, a PoSE layout from ``(seed, index)``. Resuming at step
  ``s`` therefore needs nothing but ``s``; each data-parallel rank reads its own slice of every
  global batch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write_json
from ..errors import RopescaleError
from ..scoring.nll import IGNORE_INDEX
from .pose import pose_layout, pose_text_offsets
from .recall import RecallWriter


def pack_documents(docs: Sequence[Sequence[int]], bos_token_id: int | None, eos_token_id: int | None) -> np.ndarray:
    """``BOS d1 EOS BOS d2 EOS ...`` as one int32 array; when BOS and EOS are the same token,
    one separator between documents (``X d1 X d2 X``). Missing special tokens are left out."""
    head = np.asarray([] if bos_token_id is None else [bos_token_id], np.int32)
    same = bos_token_id is not None and bos_token_id == eos_token_id
    tail = np.asarray([] if eos_token_id is None or same else [eos_token_id], np.int32)
    parts = []
    for doc in docs:
        parts += [head, np.asarray(doc, np.int32), tail]
    if same and len(docs):
        parts.append(head)  # the last document's EOS
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def split_holdout(
    documents: list[tuple[str, str]], holdout: Any
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training documents, held-out documents): ``holdout`` is a list of titles or a count of last documents."""
    if isinstance(holdout, int):
        if holdout >= len(documents):
            raise RopescaleError(f"data.holdout={holdout} leaves no training documents (the data has {len(documents)})")
        return documents[: len(documents) - holdout], documents[len(documents) - holdout :]
    wanted = {str(t).strip().lower() for t in holdout}
    titles = {title.lower() for title, _ in documents}
    missing = sorted(wanted - titles)
    if missing:
        known = ", ".join(t for t, _ in documents[:12])
        raise RopescaleError(f"data.holdout title '{missing[0]}' is not in the data (documents: {known})")
    train = [d for d in documents if d[0].lower() not in wanted]
    if not train:
        raise RopescaleError("data.holdout leaves no training documents")
    return train, [d for d in documents if d[0].lower() in wanted]


def tokenize_stream(tokenizer: Any, documents: list[tuple[str, str]], max_tokens: int | None = None) -> np.ndarray:
    """Token ids of the packed training stream (see :func:`pack_documents`), at most ``max_tokens``
    document tokens (the last document is cut)."""
    docs, total = [], 0
    for _, text in documents:
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
        if max_tokens is not None:
            ids = ids[: max(0, max_tokens - total)]
        if ids.size:
            docs.append(ids)
            total += int(ids.size)
        if max_tokens is not None and total >= max_tokens:
            break
    return pack_documents(docs, tokenizer.bos_token_id, tokenizer.eos_token_id)


def cached_stream(path: Path, key: dict[str, Any], build) -> np.ndarray:
    """The token stream stored at ``path`` (``.npy`` + ``.json`` key), rebuilt when the key differs.

    A resumed run reads back exactly the tokens it started with, without re-tokenizing.
    """
    meta = path.with_suffix(".json")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    if path.is_file() and meta.is_file():
        try:
            if json.loads(meta.read_text()).get("digest") == digest:
                return np.load(path, mmap_mode="r", allow_pickle=False)  # a multi-GB stream stays on disk
        except (ValueError, OSError):
            pass
    stream = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npy")
    np.save(tmp, stream)
    tmp.replace(path)
    atomic_write_json(meta, {"digest": digest, "key": key, "tokens": int(stream.size)})
    return stream


def training_stream(config: Any, tokenizer: Any, path: Path) -> np.ndarray:
    """The recipe's packed training stream (``data.source`` minus ``data.holdout``), tokenized once
    into ``path`` and read back while the recipe's data section and the tokenizer are unchanged."""
    from ..data.documents import load_documents

    d = config.data

    def build() -> np.ndarray:
        train, _ = split_holdout(load_documents(d.source, text_field=d.text_field), d.holdout)
        return tokenize_stream(tokenizer, train, d.max_tokens)

    from ..models.identity import data_identity

    key = {
        "source": d.source,
        "content": data_identity(d.source).get("fingerprint"),  # a file edited in place is tokenized again
        "holdout": d.holdout,
        "max_tokens": d.max_tokens,
        "tokenizer": getattr(tokenizer, "name_or_path", "?"),
        "vocab": len(tokenizer),
    }
    return cached_stream(path, key, build)


@dataclass
class WindowSpec:
    """How windows are cut: length, BOS, and PoSE settings (``target_length`` None: no PoSE)."""

    seq_len: int
    bos_token_id: int | None = None
    target_length: int | None = None
    chunks: int = 2
    content: str = "skip"

    @property
    def pose(self) -> bool:
        return self.target_length is not None

    @property
    def bos(self) -> int:
        return int(self.bos_token_id is not None)

    @property
    def stride(self) -> int:
        """Text tokens consumed per window (windows' first chunks never overlap)."""
        return self.seq_len - self.bos

    @property
    def text_span(self) -> int:
        """Text tokens a window may reach from its start."""
        if self.pose and self.content == "skip":
            return self.target_length - self.bos
        return self.seq_len - self.bos


class WindowDataset:
    """Deterministic training windows over a packed token stream.

    ``dataset.sample(g)`` for global sample index ``g`` returns ``input_ids``, ``position_ids``
    and ``labels`` (``IGNORE_INDEX`` where a token is not predicted from its predecessor: the
    first token of a PoSE chunk whose text skipped). # each [seq_len]
    """

    def __init__(self, stream: np.ndarray, spec: WindowSpec, seed: int = 0, recall: RecallWriter | None = None):
        self.stream, self.spec, self.seed, self.recall = np.asarray(stream), spec, seed, recall
        span = spec.text_span
        if self.stream.size < span:
            what = (
                f"PoSE target {spec.target_length} with content=skip"
                if spec.pose and spec.content == "skip"
                else f"seq_len {spec.seq_len}"
            )
            raise RopescaleError(
                f"training text has {self.stream.size} tokens, fewer than one window needs ({span} for {what}); "
                "add data" + (" or use pose.content=contiguous" if spec.pose and spec.content == "skip" else "")
            )
        self.n_windows = (self.stream.size - span) // spec.stride + 1
        self._perm_epoch, self._perm = -1, None

    def __len__(self) -> int:
        return self.n_windows

    def _slot(self, index: int) -> int:
        epoch, k = divmod(index, self.n_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._perm_epoch = epoch
        return int(self._perm[k])

    def sample(self, index: int) -> dict[str, torch.Tensor]:
        spec = self.spec
        base = self._slot(index) * spec.stride
        labels_mask = np.ones(spec.seq_len, dtype=bool)
        chunk_starts = np.zeros(0, np.int64)
        if spec.pose:
            layout = pose_layout(
                spec.seq_len, spec.target_length, spec.chunks, np.random.default_rng([self.seed, index, 1])
            )
            positions = layout.position_ids()  # [seq_len]
            offsets = pose_text_offsets(layout, spec.content)  # [seq_len]
            chunk_starts = layout.starts[1:]
            if spec.content == "skip":
                jumped = layout.starts[1:][np.diff(layout.skips) > 0]
                labels_mask[jumped] = False  # the text jumped: not predictable from the previous token
        else:
            positions = np.arange(spec.seq_len, dtype=np.int64)
            offsets = positions
        text_index = base + offsets[spec.bos :] - spec.bos  # [seq_len - bos]
        ids = np.asarray(self.stream[text_index], np.int64)
        if spec.bos:
            ids = np.concatenate([[spec.bos_token_id], ids])
        if self.recall is not None:  # the same window indices with PoSE or without (training/recall.py)
            self.recall.write(ids, chunk_starts, np.random.default_rng([self.seed, index, 2]), first=spec.bos)
        labels = np.where(labels_mask, ids, IGNORE_INDEX)
        return {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "position_ids": torch.from_numpy(positions.astype(np.int64)),
            "labels": torch.from_numpy(labels.astype(np.int64)),
        }

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Stacked samples. # each [len(indices), seq_len]"""
        samples = [self.sample(i) for i in indices]
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def micro_batch_indices(step: int, micro: int, spec: tuple[int, int, int], rank: int) -> list[int]:
    """Global sample indices of one rank's micro-batch.

    Args:
        step: optimizer step (0-based) being computed.
        micro: micro-batch within the step (0 .. grad_accum-1).
        spec: ``(batch_size, grad_accum, world_size)``.
        rank: this process's rank.
    """
    batch_size, grad_accum, world = spec
    first = ((step * grad_accum + micro) * world + rank) * batch_size
    return list(range(first, first + batch_size))
