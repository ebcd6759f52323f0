"""The shared greedy generation loop and argument checks of the retrieval evals."""

from __future__ import annotations

import json

import pytest
import torch

from ropescale.evals.tasks.generation import (
    PromptJournal,
    check_depth,
    check_grid,
    check_positive_int,
    greedy_generate,
    model_device,
)


class EchoModel:
    """Writes each prompt's last token ``max_new_tokens`` times and records the batch shapes."""

    def __init__(self):
        self.shapes: list[tuple[int, int]] = []
        self.pad_ids: list[int | None] = []

    def parameters(self):
        return iter([torch.zeros(1)])

    def generate(self, input_ids, attention_mask, do_sample, max_new_tokens, pad_token_id):
        assert do_sample is False and bool(attention_mask.all()) and attention_mask.shape == input_ids.shape
        self.shapes.append(tuple(input_ids.shape))
        self.pad_ids.append(pad_token_id)
        new = input_ids[:, -1:].repeat(1, max_new_tokens)  # [b, new]
        return torch.cat([input_ids, new], dim=1)  # [b, L + new]


class DigitTokenizer:
    pad_token_id = None
    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids if not (skip_special_tokens and i == 0))


def test_batches_hold_consecutive_prompts_of_one_length():
    model = EchoModel()
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 2, 3, 4], [5, 6, 7, 8], [9, 9]]
    texts = greedy_generate(model, DigitTokenizer(), prompts, max_new_tokens=2, batch_size=2)
    assert texts == ["33", "66", "99", "44", "88", "99"]
    assert model.shapes == [(2, 3), (1, 3), (2, 4), (1, 2)]
    assert model.pad_ids == [0] * 4  # no pad token: the EOS id pads


def test_batch_size_one_generates_each_prompt_alone(bytelevel_tokenizer):
    model = EchoModel()
    ids = bytelevel_tokenizer.encode("The grass is green.", add_special_tokens=False)
    texts = greedy_generate(model, bytelevel_tokenizer, [ids, ids[:-1], ids], max_new_tokens=1)
    assert model.shapes == [(1, len(ids)), (1, len(ids) - 1), (1, len(ids))]
    assert texts[0] == texts[2] == bytelevel_tokenizer.decode(ids[-1:])
    assert model.pad_ids[0] == bytelevel_tokenizer.pad_token_id
    assert greedy_generate(model, bytelevel_tokenizer, [], max_new_tokens=1) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(batch_size=True), "batch_size must be a positive integer"),
        (dict(prompts=[[1], []]), "prompts must not be empty"),
    ],
)
def test_greedy_generate_rejects_bad_input(kwargs, message):
    args = dict(prompts=[[1, 2]], max_new_tokens=1, batch_size=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        greedy_generate(EchoModel(), DigitTokenizer(), **args)


def test_checks():
    assert check_depth(1) == 1.0 and isinstance(check_depth(0), float)
    for bad in (True, -0.1, 1.5, "0.5", None):
        with pytest.raises(ValueError, match=r"depth must be a number in \[0, 1\]"):
            check_depth(bad)
    assert check_positive_int("n", 3) == 3
    for bad in (0, -1, 2.0, False):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            check_positive_int("n", bad)
    assert check_grid((100, 200), (0, 0.5)) == ([100, 200], [0.0, 0.5])
    with pytest.raises(ValueError, match="depths must be distinct"):
        check_grid([100], [0.5, 0.5])
    assert model_device(EchoModel()) == torch.device("cpu") and model_device(object()) == torch.device("cpu")


def test_prompt_token_helpers(bytelevel_tokenizer):
    from ropescale.evals.tasks.generation import bos_prefix, encode, tokenizer_adds_bos

    bos = bytelevel_tokenizer.bos_token_id
    assert tokenizer_adds_bos(bytelevel_tokenizer) and bos_prefix(bytelevel_tokenizer, None) == [bos]
    assert bos_prefix(bytelevel_tokenizer, False) == [] and bos_prefix(bytelevel_tokenizer, True) == [bos]
    assert bos not in encode(bytelevel_tokenizer, "The sky is blue.")
    no_bos = DigitTokenizer()
    assert not tokenizer_adds_bos(no_bos) and bos_prefix(no_bos, None) == []
    with pytest.raises(ValueError, match="add_bos=True but the tokenizer has no BOS token"):
        bos_prefix(no_bos, True)


def test_accuracy_heatmap_reads_the_grid(tmp_path, monkeypatch):
    from ropescale.evals.tasks import generation
    from ropescale.plots import grids

    class Result(generation.GridResult):
        lengths, depths, trials, threshold = [8192, 4096], [0.5, 0.0], 2, 0.5
        records = [
            type("R", (), {"length": n, "depth": d, "score": float(n == 4096)})()
            for n in (8192, 4096)
            for d in (0.5, 0.0)
        ]

    seen = {}
    monkeypatch.setattr(grids, "plot_accuracy_grid", lambda *args: seen.update(args=args) or args[3])
    out = generation.plot_accuracy_heatmap(Result(), tmp_path / "h.png", "Passkey", "passkey context")
    lengths, depths, grid, path, title = seen["args"]
    assert out == path == tmp_path / "h.png" and (lengths, depths) == ([4096, 8192], [0.0, 0.5])
    assert grid == [[1.0, 0.0], [1.0, 0.0]] and title == "Passkey\n2 trials/cell, passkey context: 4k"


def test_wilson_interval_matches_the_textbook_values():
    from ropescale.evals.tasks.proportions import wilson_interval

    for (k, n), (low, high) in {
        (5, 10): (0.236593, 0.763407),
        (1, 10): (0.017876, 0.404150),
        (6, 6): (0.609666, 1.0),
        (0, 6): (0.0, 0.390334),
    }.items():
        assert wilson_interval(k, n) == pytest.approx((low, high), abs=1e-6)
    assert wilson_interval(0, 6)[0] == 0.0 and wilson_interval(6, 6)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert (
        wilson_interval(30, 60)[1] - wilson_interval(30, 60)[0] < wilson_interval(5, 10)[1] - wilson_interval(5, 10)[0]
    )


def test_grid_results_carry_trials_and_intervals_per_cell_and_length():
    from ropescale.evals.tasks.passkey import PasskeyResult, PasskeyTrial
    from ropescale.evals.tasks.proportions import wilson_interval

    result = PasskeyResult([100, 200], [0.25, 0.75], trials=3, seed=0, max_new_tokens=4)
    for length, depth, correct in [(100, 0.25, [1, 1, 1]), (100, 0.75, [1, 0, 1]), (200, 0.25, [0, 0, 0])]:
        for t, ok in enumerate(correct):
            result.records.append(PasskeyTrial(length, depth, t, 11111, "", bool(ok), 5))
    result.records.append(PasskeyTrial(200, 0.75, 0, 11111, "", True, 5))  # an unequal cell: 1 trial
    d = result.to_dict()
    assert d["cell_trials"] == [[3, 3], [3, 1]] and d["length_trials"] == {"100": 6, "200": 4}
    assert d["interval"][0][1] == pytest.approx(list(wilson_interval(2, 3)))
    assert d["length_interval"]["100"] == pytest.approx(list(wilson_interval(5, 6)))
    assert d["length_interval"]["200"] == pytest.approx(list(wilson_interval(1, 4)))
    assert result.interval(100, 0.25) == (pytest.approx(0.438503, abs=1e-6), 1.0)


def test_difference_interval_excludes_zero_only_beyond_the_noise():
    from ropescale.evals.tasks.proportions import difference_interval

    assert difference_interval(6, 6, 5, 6) == pytest.approx((-0.2469, 0.5635), abs=1e-4)
    assert difference_interval(6, 6, 2, 6)[0] == pytest.approx(0.1311, abs=1e-4)
    low, high = difference_interval(5, 10, 5, 10)
    assert low == pytest.approx(-high) and low < 0


class CrashingEcho(EchoModel):
    """An :class:`EchoModel` that raises on its ``crash_on``-th generate call."""

    def __init__(self, crash_on=None):
        super().__init__()
        self.crash_on = crash_on

    def generate(self, input_ids, **kwargs):
        if len(self.shapes) + 1 == self.crash_on:
            raise KeyboardInterrupt
        return super().generate(input_ids, **kwargs)


PROMPTS = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 2, 3, 4], [5, 6, 7, 8]]


def test_an_interrupted_run_resumes_at_its_first_unfinished_prompt(tmp_path):
    expected = greedy_generate(EchoModel(), DigitTokenizer(), PROMPTS, max_new_tokens=2)
    journal = PromptJournal(tmp_path / "cell.partial.jsonl", {"method": "yarn", "factor": 4})
    with pytest.raises(KeyboardInterrupt):
        greedy_generate(CrashingEcho(crash_on=4), DigitTokenizer(), PROMPTS, max_new_tokens=2, journal=journal)
    model = EchoModel()
    again = PromptJournal(tmp_path / "cell.partial.jsonl", {"factor": 4, "method": "yarn"})  # same fingerprint
    assert greedy_generate(model, DigitTokenizer(), PROMPTS, max_new_tokens=2, batch_size=2, journal=again) == expected
    assert model.shapes == [(2, 4)]  # only the prompts the crash left, batched among themselves

    model = EchoModel()  # everything recorded: nothing is decoded again
    assert greedy_generate(model, DigitTokenizer(), PROMPTS, max_new_tokens=2, journal=again) == expected
    assert model.shapes == []
    model = EchoModel()  # another max_new_tokens is another prompt
    greedy_generate(model, DigitTokenizer(), PROMPTS[:1], max_new_tokens=3, journal=again)
    assert model.shapes == [(1, 3)]
    again.remove()
    assert not (tmp_path / "cell.partial.jsonl").exists()


def test_a_journal_from_other_settings_is_set_aside_and_a_torn_line_ignored(tmp_path):
    path = tmp_path / "cell.partial.jsonl"
    greedy_generate(EchoModel(), DigitTokenizer(), PROMPTS[:2], max_new_tokens=2, journal=PromptJournal(path, {"f": 2}))
    model = EchoModel()
    greedy_generate(model, DigitTokenizer(), PROMPTS[:2], max_new_tokens=2, journal=PromptJournal(path, {"f": 4}))
    assert model.shapes == [(1, 3), (1, 3)]  # another fingerprint: decoded again, the old file kept aside
    assert (tmp_path / "cell.partial.jsonl.stale").is_file()

    with open(path, "a") as f:
        f.write('{"prompt": "ab')  # a crash in the middle of a write
    model = EchoModel()
    journal = PromptJournal(path, {"f": 4})
    assert greedy_generate(model, DigitTokenizer(), PROMPTS, max_new_tokens=2, journal=journal)[2:] == [
        "99",
        "44",
        "88",
    ]
    assert model.shapes == [(1, 3), (1, 4), (1, 4)]
    model = EchoModel()  # the records written after the torn line read back
    greedy_generate(model, DigitTokenizer(), PROMPTS, max_new_tokens=2, journal=PromptJournal(path, {"f": 4}))
    assert model.shapes == []


def _tiny_generator(vocab_size: int):
    from ropescale.models.tiny import tiny_model

    model = tiny_model(vocab_size=vocab_size, seed=3)
    model.generation_config.eos_token_id = None  # a random model: never stop on a chance EOS
    return model


def test_finished_stops_each_prompt_at_the_first_token_whose_text_passes(bytelevel_tokenizer):
    tok = bytelevel_tokenizer
    model = _tiny_generator(len(tok))
    prompts = [tok.encode(s, add_special_tokens=False) for s in ("The sky is blue.", "A cat sat here.")]
    full = greedy_generate(model, tok, prompts, max_new_tokens=16)
    assert all(len(t) > 4 for t in full)
    # Each prompt's test passes once its text holds the first few characters of the full text.
    targets = [t[:4] for t in full]
    tests = [lambda text, target=target: target in text for target in targets]
    early = greedy_generate(model, tok, prompts, max_new_tokens=16, finished=tests)
    for e, f, target in zip(early, full, targets):
        assert target in e and f.startswith(e) and len(e) < len(f)
    # ... and not one token later than needed: the text minus its last token fails the test.
    ids = [tok.encode(e, add_special_tokens=False) for e in early]
    assert all(target not in tok.decode(i[:-1]) for i, target in zip(ids, targets))
    # A test that never passes decodes everything, as without one.
    never = greedy_generate(model, tok, prompts, max_new_tokens=16, finished=[lambda t: False] * 2)
    assert never == full


def test_finished_needs_one_test_per_prompt():
    with pytest.raises(ValueError, match="one test per prompt"):
        greedy_generate(EchoModel(), DigitTokenizer(), [[1], [2]], max_new_tokens=1, finished=[lambda t: True])


def test_generating_past_the_context_gives_no_transformers_reminder(bytelevel_tokenizer):
    """An unscaled baseline past its context is the point of a passkey cell: transformers' "friendly
    reminder ... exceeded the model's predefined maximum length" was printed in the middle of the table."""
    import logging

    from tests.conftest import tiny_model

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    model = tiny_model(vocab_size=len(bytelevel_tokenizer))  # max_position_embeddings 64
    logging.Logger.warning_once.cache_clear()  # transformers says it once per process
    handler = Keep()
    logging.getLogger("transformers").addHandler(handler)
    try:
        greedy_generate(model, bytelevel_tokenizer, [[5] * 70], max_new_tokens=2)
        logger = logging.getLogger("transformers.generation.stopping_criteria")
        logger.warning("exceeded the model's predefined maximum length (outside greedy_generate)")
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert seen == ["exceeded the model's predefined maximum length (outside greedy_generate)"]  # only there


def test_a_journal_keeps_what_each_prompt_cost_so_a_resumed_cell_can_say_it(tmp_path):
    """Each journaled prompt keeps its decoding seconds and the load average it finished under; what the
    prompts already journaled cost is read back before the rest are decoded. A journal written before
    those keys gives ``seconds: None`` (unknown), never 0."""
    path = tmp_path / "cell.partial.jsonl"
    journal = PromptJournal(path, {"f": 4})
    assert journal.journaled(PROMPTS, 2) is None  # nothing journaled yet
    with pytest.raises(KeyboardInterrupt):
        greedy_generate(CrashingEcho(crash_on=4), DigitTokenizer(), PROMPTS, max_new_tokens=2, journal=journal)
    rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert len(rows) == 3 and all(r["seconds"] >= 0 and "load" in r for r in rows)  # the crash came at the 4th
    got = PromptJournal(path, {"f": 4}).journaled(PROMPTS, 2)
    assert got["prompts"] == 3 and got["seconds"] == pytest.approx(sum(r["seconds"] for r in rows))
    loads = [r["load"] for r in rows if r["load"] is not None]
    assert got["load_avg"] == ([min(loads), max(loads)] if loads else None)
    assert PromptJournal(path, {"f": 4}).journaled(PROMPTS, 3) is None  # another max_new_tokens: not these prompts

    older = tmp_path / "older.partial.jsonl"
    older.write_text(
        json.dumps({"fingerprint": {"f": 4}})
        + "\n"
        + json.dumps({"prompt": PromptJournal.digest(PROMPTS[0]), "max_new_tokens": 2, "text": "33"})
        + "\n"
    )
    assert PromptJournal(older, {"f": 4}).journaled(PROMPTS, 2) == {"prompts": 1, "seconds": None, "load_avg": None}
    damaged = {
        "prompt": PromptJournal.digest(PROMPTS[1]),
        "max_new_tokens": 2,
        "text": "66",
        "seconds": "long",
        "load": "x",
    }
    with open(older, "a") as f:
        f.write(json.dumps(damaged) + "\n")
    assert PromptJournal(older, {"f": 4}).journaled(PROMPTS, 2) == {"prompts": 2, "seconds": None, "load_avg": None}
