"""Recall sentences in training windows: each statement repeated verbatim later in the window and
predicted there, the same sentences at the same window indices for a PoSE fine-tune and its control,
never across a chunk start, deterministic for resume, and refused when they cannot be written."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ropescale.errors import RopescaleError
from ropescale.training.config import ConfigError
from ropescale.training.data import IGNORE_INDEX, WindowDataset, WindowSpec
from ropescale.training.recall import RecallWriter, recall_writer
from ropescale.training.trainer import Trainer
from tests.training.conftest import char_tokenizer, recipe, repetitive_stream

SEQ, TARGET = 512, 8192
SENTENCE = re.compile(r" [A-Z][a-z]+\.? [A-Z][a-z]+'s [a-z]+ number is (\d+)\.")
STREAM = np.random.default_rng(0).integers(4, 90, size=40_000).astype(np.int32)  # ids of letters, no sentences


def _windows(target: int | None, n: int = 3, seed: int = 0, chunks: int = 2) -> WindowDataset:
    spec = WindowSpec(SEQ, 1, target, chunks, "skip")
    return WindowDataset(STREAM, spec, seed=seed, recall=RecallWriter(char_tokenizer(), n))


def _sentences(tok, ids: np.ndarray) -> list[tuple[int, str]]:
    chars = tok.convert_ids_to_tokens(ids.tolist())  # the character tokenizer: a character a token
    text = "".join(c if c and len(c) == 1 else "#" for c in chars)  # <s>, ids past the vocabulary: one "#"
    return [(m.start(), m.group(0)) for m in SENTENCE.finditer(text)]


def test_every_statement_is_repeated_later_in_the_window_and_predicted_there():
    tok, data = char_tokenizer(), _windows(TARGET)
    for index in range(20):
        sample = data.sample(index)
        ids, labels = sample["input_ids"].numpy(), sample["labels"].numpy()
        found = _sentences(tok, ids)
        said = [s for at, s in found if at < SEQ // 4]
        again = [s for at, s in found if at >= SEQ - SEQ // 4]
        assert len(found) == len(said) + len(again) and sorted(said) == sorted(again) and said
        assert len({re.sub(r"'s.*", "", s) for s in said}) == len(said)  # names differ within a window
        for at, s in found:
            if at >= SEQ - SEQ // 4:
                span = slice(at + 1, at + len(s))  # the repetition's tokens after its first
                assert np.array_equal(labels[span], ids[span])


def test_a_fine_tune_and_its_control_see_the_same_sentences_at_the_same_indices():
    # the control's PoSE reaches only the trained context; its windows cut at the same indices
    tok, scaled, control = char_tokenizer(), _windows(TARGET), _windows(2 * SEQ)
    for index in range(10):
        a, b = scaled.sample(index), control.sample(index)
        assert _sentences(tok, a["input_ids"].numpy()) == _sentences(tok, b["input_ids"].numpy())


@pytest.mark.parametrize("chunks", [2, 6])
def test_sentences_never_straddle_a_chunk_start_and_far_pairs_occur(chunks):
    tok, data = char_tokenizer(), _windows(TARGET, n=4, chunks=chunks)
    far = 0
    for index in range(40):
        sample = data.sample(index)
        pos = sample["position_ids"].numpy()
        jumps = set((np.flatnonzero(np.diff(pos) != 1) + 1).tolist())
        found = _sentences(tok, sample["input_ids"].numpy())
        for at, s in found:
            assert not any(at < j < at + len(s) for j in jumps), (index, at, s)
        far += max(pos[at] for at, _ in found) - min(pos[at] for at, _ in found) > SEQ
    assert far >= 10  # the two quarters often lie in different chunks, more than a window apart


def test_the_same_window_index_writes_the_same_sentences_and_another_seed_others():
    a, b, c = _windows(TARGET), _windows(TARGET), _windows(TARGET, seed=1)
    assert np.array_equal(a.sample(7)["input_ids"], b.sample(7)["input_ids"])
    assert not np.array_equal(a.sample(7)["input_ids"], c.sample(7)["input_ids"])


def test_without_recall_sentences_the_window_is_the_text():
    plain = WindowDataset(STREAM, WindowSpec(SEQ, 1, TARGET, 2, "skip"), seed=0)
    written = _windows(TARGET)
    ids, base = written.sample(3)["input_ids"].numpy(), plain.sample(3)["input_ids"].numpy()
    changed = np.flatnonzero(ids != base)
    assert changed.size and _sentences(char_tokenizer(), base) == []
    assert np.array_equal(written.sample(3)["position_ids"], plain.sample(3)["position_ids"])
    assert np.all(written.sample(3)["labels"].numpy()[changed] != IGNORE_INDEX)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"recall_facts": -1}, "data.recall_facts"),
        ({"recall_facts": 2, "seq_len": 128}, "data.recall_facts=2 needs data.seq_len >= 256"),
    ],
)
def test_impossible_recall_settings_are_refused_naming_the_key(tmp_path, data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        recipe(tmp_path, data=data)


def test_recall_needs_a_tokenizer_and_room_for_its_sentences(tmp_path, make_model):
    assert recall_writer(None, 0, 128) is None
    with pytest.raises(RopescaleError, match=r"data.recall_facts=2 needs data.seq_len >= 3\d\d with this tokenizer"):
        recall_writer(char_tokenizer(), 2, 256)  # 48-character sentences: a quarter of 256 holds none twice
    config = recipe(tmp_path, data={"seq_len": 128, "recall_facts": 1})
    with pytest.raises(RopescaleError, match=r"data.recall_facts=1 needs the model's tokenizer"):
        Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()
    assert not (tmp_path / "run-llama").exists()  # a refused setup leaves no folder behind


def test_a_tiny_run_trains_on_recall_windows(tmp_path, make_model):
    config = recipe(tmp_path, data={"seq_len": 256, "recall_facts": 1}, train={"max_steps": 2})
    trainer = Trainer(
        config, model=make_model(), tokenizer=char_tokenizer(), train_tokens=repetitive_stream(), progress=False
    )
    trainer.train()
    assert trainer.step == 2
    assert _sentences(char_tokenizer(), trainer.dataset.sample(0)["input_ids"].numpy())  # what it trained on


def _text(tok, ids: np.ndarray) -> str:
    return "".join(c if c and len(c) == 1 else "#" for c in tok.convert_ids_to_tokens(ids.tolist())).strip()


def test_without_recall_forms_the_sentences_are_the_ones_written_before_forms():
    """One form spends no draw choosing it: a digits-only writer gives, for the same generator, exactly the
    sentences of the writer before forms existed (a transliteration of its draw order)."""
    tok = char_tokenizer()
    from ropescale.training import recall as R

    def before(rng, n):  # the pre-forms writer's draws, in its order
        out = []
        for surname in rng.choice(len(R.SURNAMES), size=n, replace=False):
            digits = "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(3, 8))))
            title, thing = R.TITLES[rng.integers(len(R.TITLES))], R.THINGS[rng.integers(len(R.THINGS))]
            out.append(f"{title} {R.SURNAMES[surname]}'s {thing} number is {digits}.")
        return out

    got = RecallWriter(tok, 5).pairs(np.random.default_rng(7))
    want = before(np.random.default_rng(7), 5)
    assert [_text(tok, first) for first, _ in got] == want
    assert all(first is later for first, later in got)  # digits: the statement itself, repeated


@pytest.mark.parametrize("form", ["paraphrase", "words", "names", "hops"])
def test_each_form_asks_again_in_other_words_with_the_same_answer(form):
    tok = char_tokenizer()
    for first, later in RecallWriter(tok, 4, (form,)).pairs(np.random.default_rng(3)):
        a, b = _text(tok, first), _text(tok, later)
        assert a != b and not a.startswith(b) and not a.endswith(b)  # not a copied span
        answer = b.rstrip(".").split()[-1]  # the later sentence ends on the answer
        assert answer in a  # ... which only the earlier statement gives
        if form == "hops":  # the answer is stated for another person, tied to the one asked about
            asked = b.split("So ")[1].split("'s")[0]
            assert a.index(answer) < a.index(f"{asked}'s") and "the same as" in a


def test_unknown_recall_forms_are_refused_naming_the_key(tmp_path):
    from ropescale.training.config import load_config

    with pytest.raises(ConfigError, match=r"data.recall_forms must be a non-empty list of digits, paraphrase"):
        load_config("smollm2-135m/yarn_x4", ["data.recall_facts=2", "data.recall_forms=[digit]"])
