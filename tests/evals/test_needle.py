"""The needle run loop: a (length, depth) grid on a tiny model and an oracle, results, bad input, heatmap."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ropescale.evals.tasks import needle as needle_mod
from ropescale.evals.tasks.needle import (
    RULER_THRESHOLD,
    TASKS,
    NeedleResult,
    NeedleTrial,
    build_needle_prompt,
    plot_needle_heatmap,
    run_needle,
    string_match_all,
)
from tests.evals.test_needle_prompt import HAYSTACK

TASK_NAMES = list(TASKS)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tiny model gains nothing from threads, and on a busy 2-core machine OpenMP spinning made
    its forward passes ~40x slower; restore the setting for the other test modules."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- run loop


class OracleModel:
    """Reads the needles from the prompt and answers: all queried values, some, or a distractor's."""

    def __init__(self, tokenizer, mode: str = "all", answer_below: int | None = None):
        self.tokenizer, self.mode, self.answer_below = tokenizer, mode, answer_below

    def parameters(self):
        return iter([torch.zeros(1)])

    def generate(self, input_ids, attention_mask, do_sample, max_new_tokens, pad_token_id):
        assert do_sample is False and attention_mask.shape == input_ids.shape
        rows = []
        for row in input_ids.tolist():
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            found = dict(re.findall(r"numbers? for ([a-z]+-[a-z]+) is: (\d+)", text))
            pairs = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d+)\.", text)
            question = text[text.rindex("\nWhat") :]
            asked = [v for k, v in pairs if k in question]
            other = [v for k, v in pairs if k not in question]
            answer = {"all": asked, "half": asked[: max(1, len(asked) // 2)], "distractor": other[:1]}[self.mode]
            if self.answer_below is not None and len(row) >= self.answer_below:
                answer = []
            assert found  # the prompt decodes to readable needles
            new = self.tokenizer.encode(" " + ", ".join(answer) + ". The", add_special_tokens=False)[:max_new_tokens]
            rows.append(row + new + [pad_token_id] * (max_new_tokens - len(new)))
        return torch.tensor(rows)


def test_run_needle_on_tiny_model_is_well_formed(tiny_llama, bytelevel_tokenizer, tmp_path):
    lengths, depths = [400, 520], [0.0, 0.5, 1.0]
    res = run_needle(
        tiny_llama,
        bytelevel_tokenizer,
        "niah_multikey",
        lengths,
        depths,
        trials=2,
        haystack=HAYSTACK,
        max_new_tokens=5,
        progress=False,
        batch_size=3,
    )
    assert isinstance(res, NeedleResult) and res.task == "niah_multikey" and res.threshold == RULER_THRESHOLD
    assert len(res.records) == 2 * 3 * 2
    for r in res.records:
        assert isinstance(r, NeedleTrial) and len(r.expected) == 1 and len(r.distractor_keys) == 3
        assert r.query_keys[0] not in r.distractor_keys
        assert isinstance(r.output, str) and r.score == string_match_all(r.output, r.expected)
        assert r.correct == (r.score == 1.0) and 0.0 <= r.actual_depth <= 1.0
    grid = res.accuracy_grid
    assert len(grid) == 2 and all(len(row) == 3 for row in grid)
    assert all(0.0 <= a <= 1.0 for row in grid for a in row)
    assert res.effective_context is None or res.effective_context in lengths
    d = json.loads(json.dumps(res.to_dict()))
    assert d["lengths"] == lengths and d["depths"] == depths and len(d["records"]) == 12
    assert set(d["length_accuracy"]) == {"400", "520"} and d["task"] == "niah_multikey" and d["metric"] == "all"
    assert {"accuracy", "effective_context", "threshold", "trials", "seed", "max_new_tokens", "elapsed_s"} <= set(d)

    out = plot_needle_heatmap(res, tmp_path / "plots" / "needle.png")
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 1000
    assert [p.name for p in out.parent.iterdir()] == ["needle.png"]


def test_batching_matches_single_prompts(tiny_llama, bytelevel_tokenizer):
    kw = dict(
        task="niah_single",
        lengths=[300],
        depths=[0.25, 0.75],
        trials=2,
        haystack=HAYSTACK,
        max_new_tokens=4,
        progress=False,
    )
    a = run_needle(tiny_llama, bytelevel_tokenizer, **kw)
    b = run_needle(tiny_llama, bytelevel_tokenizer, batch_size=4, **kw)
    assert [r.output for r in a.records] == [r.output for r in b.records]
    assert [r.expected for r in a.records] == [r.expected for r in b.records]
    default = run_needle(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, **{**kw, "max_new_tokens": None})
    assert a.max_new_tokens == 4 and default.max_new_tokens == TASKS["niah_single"].max_new_tokens == 32


@pytest.mark.parametrize(
    "task, mode, score",
    [
        ("niah_single", "all", 1.0),
        ("niah_multikey", "all", 1.0),
        ("niah_multikey", "distractor", 0.0),
        ("niah_multivalue", "all", 1.0),
        ("niah_multivalue", "half", 0.5),
        ("niah_multiquery", "all", 1.0),
        ("niah_multiquery", "half", 0.5),
    ],
)
def test_oracle_scores(bytelevel_tokenizer, task, mode, score):
    res = run_needle(
        OracleModel(bytelevel_tokenizer, mode),
        bytelevel_tokenizer,
        task,
        [450, 600],
        [0.0, 0.5, 1.0],
        trials=2,
        haystack=HAYSTACK,
        progress=False,
        batch_size=2,
    )
    assert all(r.score == score for r in res.records)
    assert res.accuracy_grid == [[score] * 3] * 2
    assert res.effective_context == (600 if score == 1.0 else None)


def test_effective_context_is_largest_length_at_ruler_threshold(bytelevel_tokenizer):
    oracle = OracleModel(bytelevel_tokenizer, answer_below=500)
    res = run_needle(
        oracle, bytelevel_tokenizer, "niah_single", [400, 600], [0.5], trials=2, haystack=HAYSTACK, progress=False
    )
    assert res.length_accuracy == {400: 1.0, 600: 0.0} and res.effective_context == 400

    def records(length, scores):
        return [
            NeedleTrial(length, 0.5, t, ["a-b"], ["1234567"], [], "", s, s == 1.0, 0, 0.5, "x", 0)
            for t, s in enumerate(scores)
        ]

    res = NeedleResult("niah_multivalue", [100, 200, 300], [0.5], 4, 0, 64)
    res.records = records(100, [1, 1, 0.75, 0.5]) + records(200, [1, 1, 1, 0.5]) + records(300, [1, 0.75, 0.75, 0.75])
    assert res.length_accuracy == {100: 0.8125, 200: 0.875, 300: 0.8125}
    assert res.effective_context == 200  # 0.875 >= 0.856; shorter lengths need not pass
    res.records = records(100, [1, 1, 0.75, 0.5]) + records(200, [1, 1, 0.75, 0.5]) + records(300, [0, 0, 0, 0])
    assert res.effective_context is None
    with pytest.raises(ValueError, match="no trials at length 999"):
        res.accuracy(999)


# --------------------------------------------------------------------------- bad input


def test_unknown_task_lists_known_ones(bytelevel_tokenizer):
    known = "known tasks: niah_single, niah_multikey, niah_multivalue, niah_multiquery"
    with pytest.raises(
        ValueError, match=r"unknown needle task 'niah_multikeys' \(did you mean 'niah_multikey'\?\); " + known
    ):
        build_needle_prompt(bytelevel_tokenizer, "niah_multikeys", 300, 0.5, haystack=HAYSTACK)
    with pytest.raises(ValueError, match="unknown needle task 'vt'; known tasks: niah_single"):
        run_needle(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, "vt", [300], [0.5], 1, haystack=HAYSTACK)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(haystack=[]), "haystack must contain at least one text"),
        (dict(haystack=["fine text.", 3]), r"haystack\[1\] must be a non-empty string"),
        (dict(haystack=["  \n"]), r"haystack\[0\] must be a non-empty string"),
        (dict(haystack=42), "haystack must be a list of texts, got int"),
        (dict(lengths=[]), "lengths must not be empty"),
        (dict(lengths=[400, 400]), "lengths must be distinct"),
        (dict(lengths=[0]), "length must be a positive integer"),
        (dict(depths=[0.5, 1.5]), r"depth must be a number in \[0, 1\]"),
        (dict(depths=[]), "depths must not be empty"),
        (dict(trials=0), "trials must be a positive integer"),
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(batch_size=0), "batch_size must be a positive integer"),
        (dict(lengths=[400, 50]), "length 50 is too short for niah_single"),
    ],
)
def test_run_needle_rejects_bad_input(bytelevel_tokenizer, kwargs, message):
    args = dict(task="niah_single", lengths=[400], depths=[0.5], trials=1, haystack=HAYSTACK, progress=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        run_needle(OracleModel(bytelevel_tokenizer), bytelevel_tokenizer, **args)


def test_run_needle_leaves_the_thread_count_alone(bytelevel_tokenizer):
    """A library call must not change torch's global settings (tests set threads in fixtures)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_needle(
            OracleModel(bytelevel_tokenizer),
            bytelevel_tokenizer,
            "niah_single",
            [400],
            [0.5],
            trials=1,
            haystack=HAYSTACK,
            progress=False,
        )
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_needle_heatmap_names_the_effective_context(bytelevel_tokenizer, tmp_path, monkeypatch):
    res = run_needle(
        OracleModel(bytelevel_tokenizer),
        bytelevel_tokenizer,
        "niah_single",
        [400],
        [0.5],
        trials=1,
        haystack=HAYSTACK,
        progress=False,
    )
    seen = {}
    monkeypatch.setattr(needle_mod, "plot_accuracy_heatmap", lambda result, path, **kw: seen.update(kw, result=result))
    plot_needle_heatmap(res, tmp_path / "n.png")
    assert seen["result"] is res and res.effective_context == 400  # read directly, no adapter
    assert seen["context_label"] == "effective context (≥ 0.856)" and seen["title"] == "RULER niah_single"


# --------------------------------------------------------------------------- spread needles (jitter)


def test_jittered_needles_spread_over_the_band_and_jitter_0_is_the_fixed_grid(bytelevel_tokenizer):
    from ropescale.evals.tasks.passkey import placed_depth

    tok = bytelevel_tokenizer
    kw = dict(task="niah_multikey", lengths=[600], depths=[0.25, 0.75], trials=4, haystack=HAYSTACK, progress=False)

    def placed(jitter: float) -> list[tuple]:
        res = run_needle(OracleModel(tok), tok, **kw, jitter=jitter)
        assert [r.depth for r in res.records] == [d for d in kw["depths"] for _ in range(4)]  # nominal depths kept
        return [(r.depth, r.trial, r.needle_start, r.actual_depth, r.start_char, r.expected) for r in res.records]

    def built(depth_of) -> list[tuple]:
        out = []
        for d in kw["depths"]:
            for t in range(4):
                p = build_needle_prompt(tok, kw["task"], 600, depth_of(d, t), 0, t, HAYSTACK)
                out.append((d, t, p.needle_start, p.actual_depth, p.start_char, list(p.expected)))
        return out

    fixed = placed(0)
    assert fixed == built(lambda d, t: d)  # jitter 0: exactly the prompts of the fixed grid, as before
    spread = placed(0.125)
    assert spread == placed(0.125)  # deterministic for a seed
    assert spread == built(lambda d, t: placed_depth(0, 600, d, t, 0.125, "needle"))  # the passkey's rule
    draws = [placed_depth(0, 600, d, t, 0.125, "needle") for d in kw["depths"] for t in range(4)]
    assert all(abs(x - d) <= 0.125 for x, d in zip(draws, [0.25] * 4 + [0.75] * 4))
    assert len({round(x, 6) for x in draws}) == len(draws)  # each trial a depth of its own
    assert draws != [placed_depth(0, 600, d, t, 0.125) for d in kw["depths"] for t in range(4)]  # not the passkey's
    moved = [s[2] != f[2] for s, f in zip(spread, fixed)]
    assert sum(moved) >= 4  # the needles moved off the grid point (up to the nearest sentence boundary)
    assert [s[5] for s in spread] == [f[5] for f in fixed]  # the same keys and values, placed elsewhere
    with pytest.raises(ValueError, match="jitter must be a number in \\[0, 0.5\\]"):
        run_needle(OracleModel(tok), tok, **kw, jitter=0.6)
