"""PoSE layouts and training windows: positions increasing and within the target, chunks covering the
window, text taken where the positions say, BOS/EOS packing, deterministic order for resume."""

from __future__ import annotations

import numpy as np
import pytest

from ropescale.training.data import (
    IGNORE_INDEX,
    WindowDataset,
    WindowSpec,
    micro_batch_indices,
    pack_documents,
    split_holdout,
)
from ropescale.training.pose import pose_layout, pose_text_offsets


@pytest.mark.parametrize(
    "length, target, chunks", [(64, 1024, 2), (64, 1024, 3), (2048, 32768, 2), (16, 16, 2), (50, 400, 1)]
)
def test_pose_positions_increase_within_target_and_chunks_cover_the_window(length, target, chunks):
    rng = np.random.default_rng(0)
    for _ in range(300):
        layout = pose_layout(length, target, chunks, rng)
        pos = layout.position_ids()
        assert pos.shape == (length,) and pos[0] == 0
        assert np.all(np.diff(pos) >= 1)  # strictly increasing
        assert pos[-1] < target and layout.span == pos[-1] + 1
        # chunks: start at 0, sorted, inside the window; consecutive positions within each chunk
        starts = layout.starts
        assert starts[0] == 0 and np.all(np.diff(starts) >= 1) and starts[-1] < length and len(starts) == chunks
        chunk_of = np.searchsorted(starts, np.arange(length), side="right") - 1  # every token in exactly one chunk
        assert np.array_equal(np.bincount(chunk_of, minlength=chunks), np.diff(np.append(starts, length)))
        jumps = np.flatnonzero(np.diff(pos) != 1) + 1
        assert set(jumps) <= set(starts[1:])
        assert np.array_equal(pos - np.arange(length), layout.skips[chunk_of])


def test_pose_reaches_the_far_end_of_the_target():
    """Over many windows the relative distances cover (almost) the whole target length."""
    rng = np.random.default_rng(1)
    spans = [pose_layout(64, 1024, 2, rng).span for _ in range(400)]
    assert max(spans) > 0.95 * 1024 and min(spans) < 0.2 * 1024


def test_pose_with_one_chunk_or_no_room_is_plain_positions():
    rng = np.random.default_rng(0)
    assert np.array_equal(pose_layout(32, 512, 1, rng).position_ids(), np.arange(32))
    assert np.array_equal(pose_layout(32, 32, 3, rng).position_ids(), np.arange(32))
    with pytest.raises(ValueError):
        pose_layout(32, 16, 2, rng)


def test_text_offsets():
    layout = pose_layout(40, 400, 2, np.random.default_rng(3))
    assert np.array_equal(pose_text_offsets(layout, "skip"), layout.position_ids())
    assert np.array_equal(pose_text_offsets(layout, "contiguous"), np.arange(40))


def test_packing_puts_bos_and_eos_between_documents():
    assert pack_documents([[5, 6], [7]], 1, 2).tolist() == [1, 5, 6, 2, 1, 7, 2]
    assert pack_documents([[5, 6], [7]], 0, 0).tolist() == [0, 5, 6, 0, 7, 0]  # SmolLM2: BOS == EOS
    assert pack_documents([[5, 6], [7]], None, 2).tolist() == [5, 6, 2, 7, 2]


def test_holdout_by_title_or_count():
    docs = [("Emma", "a"), ("Persuasion", "b"), ("Northanger Abbey", "c")]
    assert split_holdout(docs, ["emma"]) == (docs[1:], docs[:1])
    assert split_holdout(docs, 1) == (docs[:2], docs[2:])
    with pytest.raises(Exception, match="not in the data"):
        split_holdout(docs, ["Ulysses"])


STREAM = np.arange(1000, 1000 + 5000, dtype=np.int32)  # token value = 1000 + its index in the stream


@pytest.mark.parametrize("content", ["skip", "contiguous"])
def test_pose_windows_take_text_where_positions_say(content):
    spec = WindowSpec(seq_len=32, bos_token_id=1, target_length=256, chunks=2, content=content)
    ds = WindowDataset(STREAM, spec, seed=0)
    for g in range(50):
        s = ds.sample(g)
        ids, pos, labels = s["input_ids"].numpy(), s["position_ids"].numpy(), s["labels"].numpy()
        assert ids[0] == 1 and pos[0] == 0 and pos[-1] < 256
        text = ids[1:] - 1000  # stream index of each text token
        if content == "skip":
            assert np.array_equal(text - text[0], pos[1:] - pos[1])  # distance in text == distance in positions
            starts = np.flatnonzero(np.diff(pos) > 1) + 1
            assert np.all(labels[starts] == IGNORE_INDEX)  # not predictable across a text gap
            assert np.sum(labels == IGNORE_INDEX) == len(starts)
        else:
            assert np.array_equal(np.diff(text), np.ones(30))  # unbroken text, skipped positions
            assert np.all(labels == ids)


def test_plain_windows_tile_the_stream_and_epochs_reshuffle():
    spec = WindowSpec(seq_len=33, bos_token_id=1)
    ds = WindowDataset(STREAM, spec, seed=0)
    assert len(ds) == 5000 // 32
    firsts = sorted(int(ds.sample(g)["input_ids"][1]) - 1000 for g in range(len(ds)))
    assert firsts == list(range(0, 32 * len(ds), 32))  # one epoch = every window once
    assert np.array_equal(ds.sample(0)["position_ids"].numpy(), np.arange(33))
    epoch2 = [int(ds.sample(len(ds) + g)["input_ids"][1]) for g in range(10)]
    assert epoch2 != [int(ds.sample(g)["input_ids"][1]) for g in range(10)]


def test_windows_are_a_function_of_seed_and_index():
    spec = WindowSpec(seq_len=32, bos_token_id=1, target_length=256)
    a, b = WindowDataset(STREAM, spec, seed=7), WindowDataset(STREAM, spec, seed=7)
    for g in (5, 0, 300, 5):  # any order: a resumed run reads the same windows
        for key in ("input_ids", "position_ids", "labels"):
            assert np.array_equal(a.sample(g)[key], b.sample(g)[key])
    assert not np.array_equal(
        WindowDataset(STREAM, spec, seed=8).sample(5)["position_ids"], a.sample(5)["position_ids"]
    )


def test_ranks_and_micro_batches_read_disjoint_samples():
    seen = [
        i
        for step in range(3)
        for micro in range(2)
        for rank in range(4)
        for i in micro_batch_indices(step, micro, (2, 2, 4), rank)
    ]
    assert sorted(seen) == list(range(3 * 2 * 2 * 4))


def test_too_little_text_is_a_clear_error():
    with pytest.raises(Exception, match="use pose.content=contiguous"):
        WindowDataset(STREAM[:100], WindowSpec(seq_len=32, bos_token_id=1, target_length=1024), seed=0)
