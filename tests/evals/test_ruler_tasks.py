"""RULER's tasks: each generator against lm-eval's own task function for the same tokenizer, length
and seed; the prompt against lm-eval's context builder; the score against lm-eval's."""

from __future__ import annotations

import contextlib
import io
import random

import numpy as np
import pytest
from transformers import AutoTokenizer

from ropescale.evals.tasks.ruler.tasks import (
    TASKS,
    _cwe_rng_at_import,
    _prepare_niah,
    essay_haystack,
    generate_samples,
    get_task,
    prompt_text,
    score,
    split_sentences,
)
from tests.evals.ruler_fixtures import ruler_tokenizer

FIELDS = ("index", "input", "outputs", "length", "max_length", "gen_prefix")
SEED, N = 3, 4


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ruler-tok")
    ruler_tokenizer().save_pretrained(path)
    return str(path)


def _reference(make, seed=SEED):
    """lm-eval's task function run as lm-eval runs it after seeding the global generators."""
    random.seed(seed)
    np.random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        docs = make()
    return [{k: d[k] for k in FIELDS} for d in docs[:N]]


def _ours(name, tok_dir, length, essay=None):
    docs = generate_samples(TASKS[name], AutoTokenizer.from_pretrained(tok_dir), length, N, SEED, essay)
    return [{k: d[k] for k in FIELDS} for d in docs]


@pytest.mark.parametrize(
    ("name", "length"), [("niah_single_1", 1024), ("niah_multikey_2", 1024), ("niah_multikey_3", 1024)]
)
def test_niah_equals_lm_eval(name, length, tok_dir):
    _prepare_niah()  # imported without its NLTK download before lm-eval's task module imports it
    from lm_eval.tasks.ruler import niah_utils

    ours = _ours(name, tok_dir, length)
    theirs = _reference(
        lambda: niah_utils.__dict__[name](tokenizer=tok_dir, max_seq_lengths=[length])["test"].to_list()
    )
    assert ours == theirs and len(ours) == N
    assert all(d["outputs"][0] in d["input"] for d in ours)


def _prose() -> str:
    words = ["orchard", "letter", "carriage", "ball", "harp", "riddle", "picnic", "sermon"]
    return " ".join(
        f'Mrs. Weston spoke of the {words[i % 8]} at Hartfield on day {i}. Emma smiled!  "Was it so?" she asked.'
        for i in range(300)
    )


@pytest.mark.parametrize("name", ["niah_single_2[austen]", "niah_multivalue[austen]", "niah_multiquery[austen]"])
def test_essay_variant_is_lm_eval_with_a_local_haystack(name, tok_dir, monkeypatch):
    """The essay tasks are lm-eval's task functions with its downloaded haystack and NLTK splitter swapped."""
    prepare = _prepare_niah()
    from lm_eval.tasks.ruler import niah_utils

    essay = essay_haystack(_prose())
    ours = _ours(name, tok_dir, 1024, essay)
    monkeypatch.setattr(niah_utils, "get_haystack", lambda type_haystack: essay)
    monkeypatch.setattr(prepare, "cached_sent_tokenize", split_sentences)
    base = name.split("[")[0]
    theirs = _reference(lambda: niah_utils.__dict__[base](tokenizer=tok_dir, max_seq_lengths=[1024])["test"].to_list())
    assert ours == theirs
    assert prepare.cached_sent_tokenize is split_sentences  # (monkeypatched here; ours put lm-eval's back)


def test_essay_variant_restores_lm_evals_splitter(tok_dir):
    prepare = _prepare_niah()
    before = prepare.cached_sent_tokenize
    _ours("niah_single_2[austen]", tok_dir, 1024, essay_haystack(_prose()))
    assert prepare.cached_sent_tokenize is before


def test_vt_equals_lm_eval(tok_dir):
    from lm_eval.tasks.ruler import vt_utils

    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert _ours("vt", tok_dir, 1024) == _reference(lambda: vt_utils.get_dataset(tok, seq=1024))


def test_cwe_equals_lm_eval_from_its_import_state(tok_dir, monkeypatch):
    from lm_eval.tasks.ruler import cwe_utils

    # the module RNG as lm-eval's import leaves it: Random(42) after shuffling WORDS
    rng = random.Random(42)
    words = sorted({item for x in ["noun", "adjective", "verb"] for item in cwe_utils.r._categories[x]})
    rng.shuffle(words)
    assert words == cwe_utils.WORDS and rng.getstate() == _cwe_rng_at_import(cwe_utils).getstate()
    tok = AutoTokenizer.from_pretrained(tok_dir)
    cwe_utils.RNG.random()  # advanced by an earlier call in this process: ours does not depend on it
    ours = _ours("cwe", tok_dir, 2048)
    monkeypatch.setattr(cwe_utils, "RNG", rng)
    assert ours == _reference(lambda: cwe_utils.get_dataset(tok, seq=2048))


def test_fwe_equals_lm_eval(tok_dir):
    from lm_eval.tasks.ruler import fwe_utils

    tok = AutoTokenizer.from_pretrained(tok_dir)
    assert _ours("fwe", tok_dir, 1024) == _reference(lambda: fwe_utils.get_dataset(tok, max_seq_length=1024))


def test_seed_changes_samples_and_global_state_is_kept(tok_dir):
    tok = AutoTokenizer.from_pretrained(tok_dir)
    random.seed(123)
    expected = random.random()
    random.seed(123)
    a = generate_samples(TASKS["fwe"], tok, 1024, 2, 0)
    assert random.random() == expected  # the caller's global generator is given back
    b = generate_samples(TASKS["fwe"], tok, 1024, 2, 1)
    assert a == generate_samples(TASKS["fwe"], tok, 1024, 2, 0) and a != b


def test_too_short_lengths_are_refused_not_looped_forever(bytelevel_tokenizer, tok_dir):
    with pytest.raises(ValueError, match="vt cannot run: its one-shot example"):
        generate_samples(TASKS["vt"], bytelevel_tokenizer, 4096, 1, 0)  # lm-eval's vt loops forever here
    with pytest.raises(ValueError, match=r"cwe at 1024 tokens: .* use a length of at least"):
        generate_samples(TASKS["cwe"], AutoTokenizer.from_pretrained(tok_dir), 1024, 1, 0)


@pytest.mark.parametrize("name", ["niah_single_1", "niah_multikey_3", "niah_single_2[austen]"])
@pytest.mark.parametrize("length", [64, 200])
def test_a_needle_length_below_the_smallest_prompt_is_refused_in_our_words(name, length):
    """lm-eval's generator agrees: at the length it makes no sample ("Raise `max_seq_lengths`", its own
    name, said after the weights had loaded), and at the length the line advises it makes them."""
    import re

    from ropescale.evals.tasks.ruler.tasks import _generate, check_fits

    tok, task = ruler_tokenizer(), TASKS[name]
    essay = essay_haystack(_prose()) if "austen" in name else None
    with pytest.raises(ValueError, match="Raise `max_seq_lengths`"):
        _generate(task, tok, length, 2, 0, essay)  # lm-eval's own words, which the check now says first
    with pytest.raises(ValueError) as err:
        check_fits(task, tok, length, essay)
    line = str(err.value)
    assert line.startswith(f"RULER task {name} at {length} tokens: its smallest prompt (the needles in the fewest ")
    assert "max_seq_lengths" not in line
    least = int(re.search(r"use a length of at least (\d+) \(its random keys vary\)$", line)[1])
    assert len(generate_samples(task, tok, least, 2, 0, essay)) == 2


def test_prompt_is_lm_evals_context():
    from lm_eval.api.task import ConfigurableTask

    for task in (TASKS["vt"], TASKS["cwe"], TASKS["niah_single_1"]):
        doc = {"input": "Some text.\nQuestion?", "gen_prefix": "Answer: they are:"}
        msgs = ConfigurableTask.build_qa_turn(
            None, q=doc["input"], gen_prefix=doc["gen_prefix"], tgt_delim=task.delimiter, few_delim=""
        )
        assert prompt_text(task, doc) == "".join(m.to_text() for m in msgs)
    assert prompt_text(TASKS["cwe"], {"input": "x", "gen_prefix": "A:"}) == "x\n\nA:"


def test_score_is_lm_evals_string_match_all():
    from lm_eval.tasks.ruler.common_utils import process_results

    cases = [
        (" 1234567.", ["1234567"], 1.0),
        ("the values: 11, 22", ["11", "22", "33", "44"], 0.5),
        ("\x00 ABCDE and fghij", ["abcde", "FGHIJ"], 1.0),
        ("nothing", ["7"], 0.0),
    ]
    for pred, outputs, expected in cases:
        assert score(pred, outputs) == expected
        assert process_results({"max_length": 4096, "outputs": outputs}, [pred])["4096"] == expected


def test_stopping_once_answered_cannot_change_the_score():
    """The cell stops decoding once every expected string is in the output (evals/tasks/ruler/cell.py):
    exact only while lm-eval's score can never fall, nor rise past 1, as the text grows."""
    from ropescale.evals.tasks.ruler.cell import RulerCell, _answered

    outputs = ["4430567", "uuid-ab12", "Tree"]
    text = " 4430567 and uuid-AB12, then tree.\nThe grass is green. 999"
    first = next(n for n in range(len(text) + 1) if _answered(text[:n], outputs))
    assert text[:first].endswith("tree") and not _answered(text[: first - 1], outputs)
    assert all(score(text[:n], outputs) == 1.0 for n in range(first, len(text) + 1))
    for n in range(len(text)):  # below the stop, the score of a prefix is never above the full text's
        assert score(text[:n], outputs) <= score(text, outputs)
    cell = RulerCell("vt", 1024, 1, 0, 30, "ruler_vt", "-").to_dict()
    assert cell["stop"] == "answered"
    del cell["stop"]  # a cell written before the rule decoded every token
    assert RulerCell.from_dict(cell).stop == "max_new_tokens"


def test_task_names():
    assert get_task("ruler_vt") is TASKS["vt"] and get_task(" cwe ") is TASKS["cwe"]
    with pytest.raises(ValueError, match=r"downloads; run 'niah_single_2\[austen\]'"):
        get_task("niah_single_2")
    with pytest.raises(ValueError, match="unknown RULER task 'niah_x'"):
        get_task("niah_x")
    assert {t.lm_eval_task for t in TASKS.values()} >= {"niah_single_1", "niah_multikey_2", "ruler_vt", "ruler_fwe"}


def test_split_sentences():
    assert split_sentences('Mrs. Weston came. "Is it so?" said he. Mr. Knightley left! 12 went.') == [
        "Mrs. Weston came.",
        '"Is it so?" said he.',
        "Mr. Knightley left!",
        "12 went.",
    ]
