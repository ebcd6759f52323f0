"""Passkey retrieval: prompt construction, scoring, the run loop and the heatmap."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

from ropescale.evals.tasks.passkey import (
    FILLER,
    NEEDLE,
    QUESTION,
    TASK,
    PasskeyResult,
    PasskeyTrial,
    build_passkey_prompt,
    passkey_key,
    placed_depth,
    plot_passkey_heatmap,
    run_passkey,
    score_passkey,
)

LENGTHS = [90, 131, 157, 256, 1000]  # the fixed parts take 86 tokens with the byte-level tokenizer
DEPTHS = [0.0, 0.1, 0.5, 0.77, 1.0]


def _text(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


# --------------------------------------------------------------------------- prompt


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("depth", DEPTHS)
def test_prompt_has_exact_length_and_intact_needle_at_depth(tokenizer, length, depth):
    key = 40000 + length
    p = build_passkey_prompt(tokenizer, length, depth, key)
    ids = p.input_ids
    assert len(ids) == p.length == length
    assert ids[0] == tokenizer.bos_token_id  # the tokenizer adds BOS itself, so the prompt does too
    # The needle is intact and the key can be read back from it.
    needle = _text(tokenizer, ids[p.needle_start : p.needle_end]).strip()
    assert needle == NEEDLE.format(key=key)
    assert score_passkey(needle.removeprefix("The pass key is"), key)
    full = _text(tokenizer, ids)
    assert re.search(r"The pass key is (\d+)\. Remember it\.", full).group(1) == str(key)
    # Depth: fraction of the filler tokens that precede the needle, rounded to whole tokens.
    n_before = p.needle_start - p.filler_start
    assert n_before == math.floor(depth * p.n_filler + 0.5)
    assert abs(p.actual_depth - depth) <= 0.5 / p.n_filler + 1e-12
    assert p.n_filler == (p.needle_start - p.filler_start) + (p.question_start - p.needle_end)
    # Task first, question last.
    assert _text(tokenizer, ids[: p.filler_start]).strip() == TASK
    assert _text(tokenizer, ids[p.question_start :]).strip() == QUESTION
    if depth == 0.0:
        assert p.needle_start == p.filler_start
    if depth == 1.0:
        assert p.needle_end == p.question_start


def test_filler_is_one_token_stream_cut_around_the_needle(tokenizer):
    streams = []
    for depth in (0.0, 0.3, 1.0):
        p = build_passkey_prompt(tokenizer, 300, depth, 12345)
        ids = p.input_ids
        streams.append(ids[p.filler_start : p.needle_start] + ids[p.needle_end : p.question_start])
    assert streams[0] == streams[1] == streams[2]
    text = _text(tokenizer, streams[0])
    assert text.strip().startswith(FILLER)
    assert FILLER + " " + FILLER in text


def test_prompt_without_bos(tokenizer):
    p = build_passkey_prompt(tokenizer, 120, 0.5, 55555, add_bos=False)
    assert len(p.input_ids) == 120 and tokenizer.bos_token_id not in p.input_ids
    assert p.filler_start == len(tokenizer.encode(TASK, add_special_tokens=False))


def test_five_digit_keys_round_trip(tokenizer):
    for key in (10000, 99999, 31337, passkey_key(0, 100, 0.5, 0)):
        ids = tokenizer.encode(f" {key}", add_special_tokens=False)
        assert score_passkey(tokenizer.decode(ids), key)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(length=30, depth=0.5, key=12345), "length 30 is too short for the passkey prompt"),
        (dict(length=0, depth=0.5, key=12345), "length must be a positive integer"),
        (dict(length=200, depth=-0.1, key=12345), r"depth must be a number in \[0, 1\]"),
        (dict(length=200, depth=1.5, key=12345), r"depth must be a number in \[0, 1\]"),
        (dict(length=200, depth=0.5, key=-7), "key must be a non-negative integer"),
    ],
)
def test_prompt_rejects_bad_input(bytelevel_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        build_passkey_prompt(bytelevel_tokenizer, **kwargs)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    "text, correct",
    [
        ("12345", True),
        (" 12345.", True),
        ("  12345 is the pass key", True),
        ("\n12345\n", True),
        ("is 12345", True),
        ("012345", True),
        ("1234", False),
        ("123456", False),
        ("1234 5", False),
        ("54321 12345", False),
        ("12,345", False),
        ("", False),
        ("no digits at all", False),
        ("The grass is green.", False),
        ("-12345", True),  # the sign is not part of the digits
        ("x12345y", True),
    ],
)
def test_score_passkey(text, correct):
    assert score_passkey(text, 12345) is correct


# --------------------------------------------------------------------------- run loop


class OracleModel:
    """Stands in for a model that always reads the key from the prompt (or never does)."""

    def __init__(self, tokenizer, answer_below: int | None = None):
        self.tokenizer = tokenizer
        self.answer_below = answer_below  # answer correctly only for prompts shorter than this

    def parameters(self):
        return iter([torch.zeros(1)])

    def generate(self, input_ids, attention_mask, do_sample, max_new_tokens, pad_token_id):
        assert do_sample is False and attention_mask.shape == input_ids.shape
        rows = []
        for row in input_ids.tolist():
            key = re.search(r"The pass key is (\d+)", self.tokenizer.decode(row)).group(1)
            if self.answer_below is not None and len(row) >= self.answer_below:
                key = "7"
            new = self.tokenizer.encode(f" {key}. The grass", add_special_tokens=False)[:max_new_tokens]
            rows.append(row + new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.tensor(rows)


def test_run_passkey_on_tiny_model_is_well_formed(tiny_llama, bytelevel_tokenizer, tmp_path):
    lengths, depths = [100, 240], [0.0, 0.5, 1.0]
    res = run_passkey(
        tiny_llama, bytelevel_tokenizer, lengths, depths, trials=2, max_new_tokens=6, progress=False, batch_size=3
    )
    assert len(res.records) == 2 * 3 * 2
    for r in res.records:
        assert isinstance(r, PasskeyTrial) and 10000 <= r.key <= 99999
        assert isinstance(r.output, str) and r.correct == score_passkey(r.output, r.key)
    grid = res.accuracy_grid
    assert len(grid) == 2 and all(len(row) == 3 for row in grid)
    assert all(0.0 <= a <= 1.0 for row in grid for a in row)
    assert res.passkey_context is None or res.passkey_context in lengths
    d = json.loads(json.dumps(res.to_dict()))
    assert d["lengths"] == lengths and d["depths"] == depths and len(d["records"]) == 12
    assert set(d["length_accuracy"]) == {"100", "240"}

    out = plot_passkey_heatmap(res, tmp_path / "plots" / "passkey.png")
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    assert [p.name for p in out.parent.iterdir()] == ["passkey.png"]  # no temporary file left


def test_run_passkey_keys_are_seeded_and_batching_is_consistent(tiny_llama, bytelevel_tokenizer):
    kw = dict(lengths=[110], depths=[0.25, 0.75], trials=3, max_new_tokens=4, progress=False)
    a = run_passkey(tiny_llama, bytelevel_tokenizer, seed=1, **kw)
    b = run_passkey(tiny_llama, bytelevel_tokenizer, seed=1, batch_size=4, **kw)
    c = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, seed=2, **kw)
    assert [r.key for r in a.records] == [r.key for r in b.records]
    assert [r.key for r in a.records] != [r.key for r in c.records]
    assert len({r.key for r in a.records}) == 6
    assert [r.output for r in a.records] == [r.output for r in b.records]


def test_oracle_model_scores_perfectly(bytelevel_tokenizer):
    oracle = OracleModel(bytelevel_tokenizer)
    res = run_passkey(oracle, bytelevel_tokenizer, [100, 200], [0.0, 0.5, 1.0], trials=2, progress=False, batch_size=3)
    assert all(r.correct for r in res.records)
    assert res.accuracy_grid == [[1.0] * 3, [1.0] * 3]
    assert res.passkey_context == 200


def test_effective_context_is_the_passkey_context(bytelevel_tokenizer):
    oracle = OracleModel(bytelevel_tokenizer, answer_below=150)
    res = run_passkey(oracle, bytelevel_tokenizer, [100, 200], [0.5], trials=1, progress=False)
    assert res.effective_context == res.passkey_context == 100
    d = res.to_dict()
    assert d["effective_context"] == d["passkey_context"] == 100 and d["threshold"] == 0.8


def test_passkey_context_is_largest_length_at_threshold(bytelevel_tokenizer):
    oracle = OracleModel(bytelevel_tokenizer, answer_below=150)
    res = run_passkey(oracle, bytelevel_tokenizer, [100, 200], [0.5], trials=2, progress=False)
    assert res.length_accuracy == {100: 1.0, 200: 0.0}
    assert res.passkey_context == 100

    def records(length, hits, total):
        return [PasskeyTrial(length, 0.5, t, 11111, "", t < hits, 0) for t in range(total)]

    res = PasskeyResult([100, 200, 300], [0.5], 5, 0, 10)
    res.records = records(100, 2, 5) + records(200, 4, 5) + records(300, 3, 5)
    assert res.passkey_context == 200  # 0.8 passes; not required to hold at every shorter length
    res.records = records(100, 3, 5) + records(200, 3, 5) + records(300, 1, 5)
    assert res.passkey_context is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lengths=[], depths=[0.5], trials=1), "lengths must not be empty"),
        (dict(lengths=[100, 100], depths=[0.5], trials=1), "lengths must be distinct"),
        (dict(lengths=[100], depths=[0.5, 2.0], trials=1), r"depth must be a number in \[0, 1\]"),
        (dict(lengths=[100], depths=[0.5], trials=0), "trials must be a positive integer"),
        (dict(lengths=[20], depths=[0.5], trials=1), "length 20 is too short"),
    ],
)
def test_run_passkey_rejects_bad_input(bytelevel_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, progress=False, **kwargs)


def test_heatmap_for_the_eye(bytelevel_tokenizer, tmp_path):
    oracle = OracleModel(bytelevel_tokenizer, answer_below=1500)
    res = run_passkey(oracle, bytelevel_tokenizer, [1024, 2048], [0.0, 0.5, 1.0], trials=1, progress=False)
    out = plot_passkey_heatmap(res, tmp_path / "heat.png", title="oracle")
    assert out.stat().st_size > 1000


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_heatmap_gets_the_usual_permissions(bytelevel_tokenizer, tmp_path, umask, mode):
    res = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, [100], [0.5], trials=1, progress=False)
    old = os.umask(umask)
    try:
        out = plot_passkey_heatmap(res, tmp_path / "heat.png")
        plot_passkey_heatmap(res, out)  # replacing an existing file too
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["heat.png"]


def test_a_cell_is_decoded_trial_by_trial_and_recorded_depth_by_depth(bytelevel_tokenizer, monkeypatch):
    """Every depth once, then again: a cell cut short has sampled every depth alike."""
    import ropescale.evals.tasks.passkey as passkey

    seen = []

    def fake_generate(model, tokenizer, prompts, max_new_tokens, *args, **kwargs):
        seen.extend(prompts)
        return [""] * len(prompts)

    monkeypatch.setattr(passkey, "greedy_generate", fake_generate)
    res = run_passkey(None, bytelevel_tokenizer, [110, 130], [0.25, 0.75], trials=2, progress=False)
    keys = [passkey_key(0, n, d, t) for n in (110, 130) for t in range(2) for d in (0.25, 0.75)]
    assert seen == [
        build_passkey_prompt(bytelevel_tokenizer, n, d, k).input_ids
        for (n, d), k in zip([(n, d) for n in (110, 130) for t in range(2) for d in (0.25, 0.75)], keys)
    ]
    assert [(r.length, r.depth, r.trial) for r in res.records] == [
        (n, d, t) for n in (110, 130) for d in (0.25, 0.75) for t in range(2)
    ]


def test_jitter_spreads_a_depths_trials_over_its_band_with_the_same_keys(bytelevel_tokenizer):
    kw = dict(lengths=[300], depths=[0.0, 0.5, 1.0], trials=6, progress=False)
    fixed = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, **kw)
    spread = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, jitter=0.125, **kw)
    assert [r.key for r in fixed.records] == [r.key for r in spread.records]
    assert [r.depth for r in fixed.records] == [r.depth for r in spread.records]  # nominal depths kept
    for depth in kw["depths"]:
        at = {r.needle_start for r in fixed.records if r.depth == depth}
        assert len(at) == 1  # the papers' placement: one position per depth
        starts = [r.needle_start for r in spread.records if r.depth == depth]
        assert len(set(starts)) >= 4  # six trials, (almost) six positions
    prompt = build_passkey_prompt(bytelevel_tokenizer, 300, 0.5, 12345)
    for r in spread.records:  # each inside its band, cut to [0, 1]
        placed = (r.needle_start - prompt.filler_start) / prompt.n_filler
        assert max(0.0, r.depth - 0.125) - 0.01 <= placed <= min(1.0, r.depth + 0.125) + 0.01
    assert placed_depth(0, 300, 0.5, 0, 0.0) == 0.5
    assert placed_depth(0, 300, 0.5, 0, 0.125) == placed_depth(0, 300, 0.5, 0, 0.125)
    assert placed_depth(1, 300, 0.5, 0, 0.125) != placed_depth(0, 300, 0.5, 0, 0.125)


@pytest.mark.parametrize("jitter", [-0.1, 0.6, True, "0.1"])
def test_bad_jitter_is_named(bytelevel_tokenizer, jitter):
    with pytest.raises(ValueError, match=r"jitter must be a number in \[0, 0.5\]"):
        run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, [100], [0.5], 1, jitter=jitter)


def test_a_passkey_cell_resumed_from_its_journal_says_what_its_journaled_prompts_cost(bytelevel_tokenizer, tmp_path):
    """As a RULER cell (tests/evals/test_ruler_resume.py): a passkey run finished from an interrupted run's
    journal gives ``resumed`` and counts the journaled prompts' seconds in ``elapsed_s``; a run from
    nothing has no ``resumed`` key."""
    from ropescale.evals.tasks.generation import PromptJournal

    kw = dict(lengths=[100], depths=[0.0, 1.0], trials=1, progress=False)
    first = PromptJournal(tmp_path / "cell.partial.jsonl", {"f": 1})
    fresh = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, journal=first, **kw)
    assert fresh.resumed is None and "resumed" not in fresh.to_dict()
    lines = (tmp_path / "cell.partial.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    rows[0]["seconds"] = 300.0  # the first prompt took five minutes in the interrupted run
    (tmp_path / "cell.partial.jsonl").write_text("\n".join([lines[0], json.dumps(rows[0])]) + "\n")
    again = run_passkey(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, journal=first, **kw)
    assert again.resumed["prompts"] == 1 and again.resumed["seconds"] == 300.0
    assert 300.0 <= again.elapsed_s < 360.0 and again.to_dict()["resumed"] == again.resumed
    assert [r.correct for r in again.records] == [r.correct for r in fresh.records]
