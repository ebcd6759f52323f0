"""Training data: documents packed into one token stream and cut into windows (optionally PoSE).

* **Packing** (``data.packing``). Documents are tokenized without special tokens and joined as
  ``BOS doc EOS BOS doc EOS ...``. ``documents`` (the default for folders, JSONL and Parquet)
  keeps them apart inside a window: positions restart and attention stops at every document's
  first token (:mod:`.packing`). ``stream`` (the default for the embedded corpora, whose
  documents are whole novels) trains the window as one sequence, one separator token between
  documents when BOS and EOS are the same token, attention not blocked at the boundary (as in
  YaRN's and LongLoRA's packed PG19 chunks).
* **Chat** (JSONL rows with ``messages``): each conversation is one document rendered by the
  tokenizer's chat template, trained on every token or on the assistant's turns only
  (``data.chat_loss``, :mod:`ropescale.data.chat`).
* **Windows.** Window ``k`` takes the stream's text from ``k × stride`` on; with
  ``bos_each_window`` every window starts with BOS, as every window of the perplexity evaluation
  does (with ``documents`` packing, a window that starts at a document's own BOS takes no
  second one). With PoSE the window's tokens come from a span of up to ``target_length`` text tokens and
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
from typing import Any, TypedDict

import numpy as np
import torch

from .._io import atomic_write_json
from ..errors import RopescaleError
from ..scoring.nll import IGNORE_INDEX
from .packing import document_segments, resolved_packing
from .pose import pose_layout, pose_text_offsets
from .recall import RecallWriter
from .short import is_short, split_short


@dataclass
class TokenStream:
    """Packed training text: its tokens, where each document starts, and which tokens are trained on.

    Attributes:
        tokens: the packed token ids. # [T] int32
        starts: stream offset of each document's first token (``documents`` packing); None: one
            stream whose documents are not kept apart. # [D] int64
        loss: 1 where a token is a training target (chat with ``data.chat_loss: assistant``);
            None: every token. # [T] uint8
    """

    tokens: np.ndarray
    starts: np.ndarray | None = None
    loss: np.ndarray | None = None


def pack_stream(
    docs: Sequence[Sequence[int]],
    bos_token_id: int | None,
    eos_token_id: int | None,
    documents: bool = False,
    masks: Sequence[np.ndarray | None] | None = None,
) -> TokenStream:
    """``BOS d1 EOS BOS d2 EOS ...`` with each document's start; missing special tokens are left out.

    With ``documents=False`` and BOS the same token as EOS, one separator between documents
    (``X d1 X d2 X``: the stream as the shipped experiments trained on it). ``masks``: per document,
    1 where a token is trained on (None: all); a document's EOS is trained on as its last token is.
    """
    head = np.asarray([] if bos_token_id is None else [bos_token_id], np.int32)
    same = not documents and bos_token_id is not None and bos_token_id == eos_token_id
    tail = np.asarray([] if eos_token_id is None or same else [eos_token_id], np.int32)
    parts, loss, starts, at = [], [], [], 0
    for i, doc in enumerate(docs):
        ids = np.asarray(doc, np.int32)
        mask = np.ones(ids.size, np.uint8) if masks is None or masks[i] is None else np.asarray(masks[i], np.uint8)
        starts.append(at)
        parts += [head, ids, tail]
        loss += [np.zeros(head.size, np.uint8), mask, np.full(tail.size, mask[-1] if mask.size else 1, np.uint8)]
        at += head.size + ids.size + tail.size
    if same and len(docs):
        parts.append(head)  # the last document's EOS
        loss.append(np.ones(1, np.uint8))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    has_mask = masks is not None and any(m is not None for m in masks)
    return TokenStream(
        tokens,
        np.asarray(starts, np.int64) if documents else None,
        np.concatenate(loss) if has_mask else None,
    )


def pack_documents(docs: Sequence[Sequence[int]], bos_token_id: int | None, eos_token_id: int | None) -> np.ndarray:
    """The tokens of :func:`pack_stream`'s ``stream`` packing (one separator when BOS == EOS)."""
    return pack_stream(docs, bos_token_id, eos_token_id).tokens


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


def tokenize_stream(
    tokenizer: Any,
    documents: list[tuple[str, Any]],
    max_tokens: int | None = None,
    packing: str = "stream",
    chat_loss: str = "assistant",
) -> TokenStream:
    """The packed training stream (see :func:`pack_stream`), at most ``max_tokens`` document tokens
    (the last document is cut). A document is text, or a chat conversation (a list of messages,
    rendered by the tokenizer's chat template: :func:`ropescale.data.chat.chat_tokens`)."""
    from ..data.chat import chat_tokens

    docs, masks, total = [], [], 0
    for title, payload in documents:
        mask = None
        if isinstance(payload, str):
            ids = np.asarray(tokenizer(payload, add_special_tokens=False)["input_ids"], np.int32)
        else:
            ids, mask = chat_tokens(tokenizer, payload, chat_loss, where=title)
        if max_tokens is not None:
            ids = ids[: max(0, max_tokens - total)]
            mask = None if mask is None else mask[: ids.size]
        if ids.size:
            docs.append(ids)
            masks.append(mask)
            total += int(ids.size)
        if max_tokens is not None and total >= max_tokens:
            break
    stream = pack_stream(docs, tokenizer.bos_token_id, tokenizer.eos_token_id, packing == "documents", masks)
    if stream.loss is not None and not stream.loss.any():  # every step would have loss 0 and gradient 0
        raise RopescaleError(
            "no token of the training text is a target: no conversation has an assistant turn under "
            "data.chat_loss=assistant; add assistant turns or set data.chat_loss=all"
        )
    return stream


class _StreamKeyOptions(TypedDict, total=False):
    packing: str  # in the key where it is not the stream packing of the first caches (theirs stay valid)
    chat_loss: str


class StreamKey(_StreamKeyOptions):
    """What a cached token stream was made from: a stream is tokenized again when any of it changes."""

    source: str
    content: str | None  # the source's content fingerprint (a file edited in place changes it)
    holdout: list[str] | int
    max_tokens: int | None
    tokenizer: str
    vocab: int


def _extra(path: Path, name: str) -> Path:
    return path.with_name(f"{path.stem}.{name}.npy")


def cached_stream(path: Path, key: StreamKey, build) -> TokenStream:
    """The token stream stored at ``path`` (``.npy`` + ``.json`` key, and ``.starts.npy`` /
    ``.loss.npy`` where it has them), rebuilt when the key differs.

    A resumed run reads back exactly the tokens it started with, without re-tokenizing.
    """
    meta = path.with_suffix(".json")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    if path.is_file() and meta.is_file():
        try:
            stored = json.loads(meta.read_text())
            if stored.get("digest") == digest:
                extras = {
                    n: np.load(_extra(path, n), allow_pickle=False) if n in stored.get("extras", []) else None
                    for n in ("starts", "loss")
                }
                return TokenStream(
                    np.load(path, mmap_mode="r", allow_pickle=False), **extras
                )  # a multi-GB stream stays on disk
        except (ValueError, OSError):
            pass
    stream = build()
    stream = stream if isinstance(stream, TokenStream) else TokenStream(np.asarray(stream))
    path.parent.mkdir(parents=True, exist_ok=True)
    extras = [n for n in ("starts", "loss") if getattr(stream, n) is not None]
    for name, target in [("tokens", path), *((n, _extra(path, n)) for n in extras)]:
        tmp = target.with_name(f".{target.name}.tmp.npy")
        np.save(tmp, stream.tokens if name == "tokens" else getattr(stream, name))
        tmp.replace(target)
    atomic_write_json(meta, {"digest": digest, "key": key, "tokens": int(stream.tokens.size), "extras": extras})
    return stream


def training_stream(config: Any, tokenizer: Any, path: Path) -> TokenStream:
    """The recipe's packed training stream (``data.source`` minus ``data.holdout``), tokenized once
    into ``path`` and read back while the recipe's data section and the tokenizer are unchanged."""
    from ..data.documents import load_documents

    d = config.data
    packing = resolved_packing(d)  # resolved when the recipe loads; here for configs built by hand

    def build() -> TokenStream:
        train, _ = split_holdout(load_documents(d.source, text_field=d.text_field), d.holdout)
        return tokenize_stream(tokenizer, train, d.max_tokens, packing, d.chat_loss)

    from ..models.identity import data_identity

    key = StreamKey(
        source=d.source,
        content=data_identity(d.source).get("fingerprint"),  # a file edited in place is tokenized again
        holdout=d.holdout,
        max_tokens=d.max_tokens,
        tokenizer=getattr(tokenizer, "name_or_path", "?"),
        vocab=len(tokenizer),
    )
    if packing != "stream" or d.chat_loss != "assistant":  # the key of a stream cached before these keys stays
        key.update(packing=packing, chat_loss=d.chat_loss)
    return cached_stream(path, key, build)


@dataclass
class WindowSpec:
    """How windows are cut: length, BOS, and PoSE settings (``target_length`` None: no PoSE)."""

    seq_len: int
    bos_token_id: int | None = None
    target_length: int | None = None
    chunks: int = 2
    content: str = "skip"
    documents: bool = False  # keep the stream's documents apart (needs its starts)
    short_share: float = 0.0  # share of micro-batches at the original positions (training/short.py)
    short_len: int = 0  # their pieces' length: min(original context, seq_len)

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
    first token of a PoSE chunk whose text skipped, of a document, or a token outside the chat
    turns trained on), and with ``documents`` packing ``seq_ids`` (each token's document in the
    window, :mod:`.packing`). # each [seq_len]
    """

    def __init__(
        self,
        stream: np.ndarray | TokenStream,
        spec: WindowSpec,
        seed: int = 0,
        recall: RecallWriter | None = None,
    ):
        stream = stream if isinstance(stream, TokenStream) else TokenStream(np.asarray(stream))
        self.stream, self.spec, self.seed, self.recall = np.asarray(stream.tokens), spec, seed, recall
        self.loss = stream.loss
        self.starts = stream.starts if spec.documents else None
        if spec.documents and self.starts is None:
            self.starts = np.zeros(1, np.int64)  # a stream handed in as one document
        # documents: a window at a document's own BOS takes no second one, and reads one token further
        span = spec.text_span + (spec.bos if self.starts is not None else 0)
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

    def window(self, slot: int, index: int, short: bool = False) -> dict[str, torch.Tensor]:
        """Window ``slot`` of the stream, its PoSE layout and recall sentences drawn for sample ``index``;
        ``short``: contiguous, in pieces at the original positions (:mod:`.short`)."""
        spec = self.spec
        base = slot * spec.stride
        labels_mask = np.ones(spec.seq_len, dtype=bool)
        chunk_starts = np.zeros(0, np.int64)
        if spec.pose and not short:
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
        bos = spec.bos
        if (
            self.starts is not None
            and bos
            and self.starts[min(np.searchsorted(self.starts, base), self.starts.size - 1)] == base
        ):
            bos = 0  # the window starts at a document's own BOS
        virtual = base - bos + offsets  # [seq_len] stream offset of each token (a prepended BOS: base - 1)
        ids = np.asarray(self.stream[virtual[bos:]], np.int64)
        if bos:
            ids = np.concatenate([[spec.bos_token_id], ids])
        seq_ids = None
        if self.starts is not None:
            positions, seq_ids, first = document_segments(self.starts, virtual, positions, offsets)
            labels_mask[first] = False  # a document's first token is not predicted (from another's text)
        if short:
            positions, seq_ids = split_short(positions, seq_ids, spec.short_len)
        if self.loss is not None:
            labels_mask[bos:] &= self.loss[virtual[bos:]].astype(bool)
        if self.recall is not None:  # the same window indices with PoSE or without (training/recall.py)
            self.recall.write(ids, chunk_starts, np.random.default_rng([self.seed, index, 2]), first=spec.bos)
        labels = np.where(labels_mask, ids, IGNORE_INDEX)
        out = {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "position_ids": torch.from_numpy(positions.astype(np.int64)),
            "labels": torch.from_numpy(labels.astype(np.int64)),
        }
        if seq_ids is not None:
            out["seq_ids"] = torch.from_numpy(seq_ids)
        return out

    def sample(self, index: int, short: bool = False) -> dict[str, torch.Tensor]:
        return self.window(self._slot(index), index, short)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Stacked samples, with ``short`` where the micro-batch is short (:mod:`.short`). # each [len(indices), seq_len]"""
        return stack_samples(self, indices)


def stack_samples(dataset: Any, indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """A micro-batch of ``dataset.sample`` s (all short or all long). # each [len(indices), seq_len]"""
    short = is_short(dataset.seed, indices[0], dataset.spec.short_share)
    samples = [dataset.sample(i, short) for i in indices]
    out = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
    if short:
        out["short"] = torch.ones(len(indices), dtype=torch.bool)
    return out


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
