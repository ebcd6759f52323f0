"""lm-eval's traps on the ``ropescale`` model: prompts longer than max_length stop the run (lm-eval
would cut them from the left), and a scaled model's RULER run at its 4k default is pointed out."""

from __future__ import annotations

import logging

import pytest
from lm_eval.api.instance import Instance

from ropescale.errors import RopescaleError
from ropescale.evals.lm_eval import checks
from tests.evals.lm_eval.conftest import TINY_CONTEXT, make_lm

SENTENCE = "The grass is green. The sky is blue. "


def _generate(text: str, task: str = "long_task", doc: dict | None = None, max_gen_toks: int = 4) -> Instance:
    return Instance(
        "generate_until", doc or {}, (text, {"until": ["\n"], "max_gen_toks": max_gen_toks}), 0, (task, 0, 1)
    )


def _loglikelihood(context: str, continuation: str = " green") -> Instance:
    return Instance("loglikelihood", {}, (context, continuation), 0, ("ll_task", 0, 1))


@pytest.fixture(scope="module")
def short_lm(tiny_dir):
    """The tiny model with max_length 64: a 10-sentence prompt (~90 tokens) does not fit."""
    return make_lm(tiny_dir, method="yarn", factor=4, max_length=64)


def test_a_prompt_lm_eval_would_truncate_stops_the_run(short_lm):
    n = len(short_lm.tok_encode(SENTENCE * 10))
    assert n > 64
    fits = _generate(SENTENCE, task="short_task")
    with pytest.raises(
        RopescaleError, match=rf"long_task: a prompt of {n} tokens plus 4 to generate exceeds max_length 64"
    ) as info:
        short_lm.generate_until([fits, _generate(SENTENCE * 10)])
    message = str(info.value)
    assert f"set max_length >= {n + 4}" in message and "truncate_prompts=true" in message and "\n" not in message


def test_the_generation_budget_counts(short_lm):
    n = len(short_lm.tok_encode(SENTENCE * 5))
    assert n + 4 <= 64 < n + 32  # fits with 4 tokens to generate, not with 32
    assert len(short_lm.generate_until([_generate(SENTENCE * 5)])) == 1
    with pytest.raises(RopescaleError, match="plus 32 to generate exceeds max_length 64"):
        short_lm.generate_until([_generate(SENTENCE * 5, max_gen_toks=32)])


def test_loglikelihood_requests_are_checked_too(short_lm):
    ((logprob, _),) = short_lm.loglikelihood([_loglikelihood(SENTENCE)])
    assert logprob < 0
    with pytest.raises(RopescaleError, match="a loglikelihood request of .* exceeds max_length 64"):
        short_lm.loglikelihood([_loglikelihood(SENTENCE * 10)])


def test_rolling_windows_never_trip_the_check(short_lm):
    """loglikelihood_rolling cuts long texts into windows of max_length itself: nothing is lost."""
    (nll,) = short_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (SENTENCE * 20,), 0, ("r", 0, 1))])
    assert nll < 0


def test_truncate_prompts_restores_lm_eval_truncation(tiny_dir):
    lm = make_lm(tiny_dir, method="yarn", factor=4, max_length=64, truncate_prompts="true")
    assert len(lm.generate_until([_generate(SENTENCE * 10)])) == 1
    assert len(lm.loglikelihood([_loglikelihood(SENTENCE * 10)])) == 1


def _ruler_doc(length: int) -> dict:
    return {"input": SENTENCE, "outputs": ["1"], "max_length": length, "length": 10, "gen_prefix": ""}


def test_ruler_within_the_trained_context_of_a_scaled_model_warns_once(tiny_dir, caplog):
    lm = make_lm(tiny_dir, method="yarn", factor=4)  # trained 512, scaled 2048
    requests = [_generate(SENTENCE, "niah_single_1", _ruler_doc(256)), _generate(SENTENCE, "passkey_2k")]
    with caplog.at_level(logging.WARNING, logger=checks.__name__):
        lm.generate_until(requests)
    notes = [r.getMessage() for r in caplog.records if r.name == checks.__name__]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert "RULER (niah_single_1) builds prompts of at most 256 tokens here, within the trained context 512" in notes[0]
    assert 'max_seq_lengths": [2048]' in notes[0] and "--metadata max_seq_lengths=[2048]" in notes[0]


@pytest.mark.parametrize(
    ("kwargs", "length"),
    [
        ({"method": "yarn", "factor": 4}, 1024),  # RULER goes beyond the trained context: it tests the scaling
        ({"method": None}, 256),  # the model is not scaled: 256 is as good as any length
    ],
)
def test_no_ruler_note_when_the_lengths_test_the_scaling(tiny_dir, kwargs, length):
    lm = make_lm(tiny_dir, **kwargs)
    assert checks.ruler_note(lm, [_generate(SENTENCE, "niah_single_1", _ruler_doc(length))], TINY_CONTEXT) is None
    assert checks.ruler_note(lm, [_generate(SENTENCE, "passkey_2k")], TINY_CONTEXT) is None  # no RULER task
