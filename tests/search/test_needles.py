"""The needle objective: prompts are fixed by their seed with the key where asked, the answer-token NLL
is the model's own log-probabilities of the key, and only the answer decides the score."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

import ropescale
from ropescale.search.needles import (
    MixedObjective,
    NeedleObjective,
    NeedleSettings,
    answer_nll,
    build_needle_prompts,
    build_objective,
    resolve_needles,
)
from ropescale.search.objective import PerplexityObjective, Window, make_windows
from tests.conftest import tiny_model
from tests.search.conftest import word_tokenizer

WORDS = [f"x{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(100)]  # no digits: only keys have them
TOKENIZER = word_tokenizer(WORDS)
HAYSTACK = TOKENIZER.encode(" ".join(random.Random(3).choice(WORDS) for _ in range(1200)), add_special_tokens=False)


def _prompts(seed: int = 0, depths=(0.0, 0.3, 1.0), length: int = 200):
    return build_needle_prompts(TOKENIZER, HAYSTACK, NeedleSettings(len(depths), depths, length, seed), bos_token_id=1)


def test_prompts_are_fixed_by_the_seed_and_the_key_sits_at_the_asked_depth():
    prompts = _prompts()
    assert prompts == _prompts()  # same seed, same prompts: every candidate (and a resume) sees these
    other = _prompts(seed=1)
    assert [p.key for p in other] != [p.key for p in prompts] and all(10**6 <= p.key < 10**7 for p in other)
    assert len({p.key for p in prompts}) == 3
    for i, (p, depth) in enumerate(zip(prompts, (0.0, 0.3, 1.0))):
        assert len(p.input_ids) == 200 and p.input_ids[0] == 1
        assert p.needle_start - p.haystack_start == math.floor(depth * p.n_haystack + 0.5)
        assert TOKENIZER.decode(p.input_ids[p.needle_start : p.needle_end]).startswith(
            "The pass key is " + " ".join(str(p.key))
        )
        # the answer is exactly the key's digits, at the very end, after the question
        assert TOKENIZER.decode(p.input_ids[p.answer_start :]) == " ".join(str(p.key))
        assert TOKENIZER.decode(p.input_ids[p.answer_start - 5 : p.answer_start]) == "? The pass key is"
        # the haystack is the text itself (prompt i from offset i·length), split around the needle
        question = p.needle_end + p.n_haystack - (p.needle_start - p.haystack_start)
        hay = p.input_ids[p.haystack_start : p.needle_start] + p.input_ids[p.needle_end : question]
        assert hay == HAYSTACK[i * 200 : i * 200 + p.n_haystack]
    assert prompts[1].needle_start < prompts[2].needle_start  # deeper = further from the start


def test_settings_defaults_and_bad_input():
    assert resolve_needles("perplexity", None, (), 2, 256, 0) is None
    assert resolve_needles("needle", None, (), 1, 256, 0).depths == (0.5,)  # one per window: depth 0.5
    assert resolve_needles("needle", 4, (), 1, 256, 0).depths == (0.125, 0.375, 0.625, 0.875)
    assert resolve_needles("mixed", None, (0.1, 0.9), 1, 256, 0).prompts == 2  # as many as the depths
    with pytest.raises(ValueError, match="objective must be one of perplexity, needle, mixed"):
        resolve_needles("recall", None, (), 1, 256, 0)
    with pytest.raises(ValueError, match=r"needle depths must be numbers in \[0, 1\]"):
        resolve_needles("needle", None, (1.5,), 1, 256, 0)
    with pytest.raises(ValueError, match="needle prompts must be an integer >= 1"):
        resolve_needles("needle", 0, (), 1, 256, 0)
    with pytest.raises(ValueError, match="need 600"):
        build_needle_prompts(TOKENIZER, HAYSTACK[:500], NeedleSettings(3, (0.5,), 200), 1)
    with pytest.raises(ValueError, match="needle length 20 is too short"):
        build_needle_prompts(TOKENIZER, HAYSTACK, NeedleSettings(1, (0.5,), 20), 1)


@pytest.mark.parametrize("method", [None, "self_extend"])
def test_answer_nll_is_the_models_log_probability_of_the_key(method):
    model = tiny_model()
    if method:  # the attention-level mode is what the objective scores for such a candidate
        ropescale.patch(model, method, factor=4, group_size=6, window=16)
    for prompt in _prompts(length=256):
        total, n = answer_nll(model, prompt)
        ids = torch.tensor([prompt.input_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)  # [T, V]
        positions = range(prompt.answer_start, len(prompt.input_ids))
        expected = -sum(logp[t - 1, prompt.input_ids[t]].item() for t in positions)
        assert n == 7 and total == pytest.approx(expected, rel=1e-5)


class _Oracle(torch.nn.Module):
    """A stand-in model whose hidden state at t is ``confidence[t]`` times the one-hot of the token
    at t + 1 and whose LM head is the identity: its next-token NLL is set per position, by hand."""

    def __init__(self, ids: list[int], confidence: torch.Tensor):
        super().__init__()
        self.ids, self.confidence = ids, confidence
        self.lm_head = torch.nn.Identity()
        self.weight = torch.nn.Parameter(torch.zeros(1))  # model_device() reads the first parameter

    def get_decoder(self):
        def decoder(input_ids, **_):
            nxt = torch.tensor(self.ids[1:] + [0])
            hidden = torch.nn.functional.one_hot(nxt, 128).double() * self.confidence[:, None]  # [T, V]
            return SimpleNamespace(last_hidden_state=hidden[None])

        return decoder


def test_only_the_answer_decides_the_needle_score():
    """Two hand-built models: one predicts the haystack well and the key badly, the other the reverse.
    Perplexity prefers the first, the needle objective the second — it reads the answer tokens only."""
    (prompt,) = _prompts(depths=(0.5,))
    T, answer = len(prompt.input_ids), range(prompt.answer_start - 1, len(prompt.input_ids) - 1)
    text_good = torch.full((T,), 20.0)
    text_good[list(answer)] = 0.0  # uniform over the vocabulary at the answer: log 128 nats per digit
    key_good = torch.full((T,), 0.0)
    key_good[list(answer)] = 20.0
    window = [Window(prompt.input_ids, list(range(T)))]
    scores = {}
    for name, confidence in (("text_good", text_good), ("key_good", key_good)):
        model = _Oracle(prompt.input_ids, confidence)
        scores[name] = (
            NeedleObjective(model, [prompt], "yarn").evaluate(),
            PerplexityObjective(model, window, "yarn").evaluate(),
        )
    (needle_a, ppl_a), (needle_b, ppl_b) = scores["text_good"], scores["key_good"]
    assert ppl_a.ppl < ppl_b.ppl and needle_b.ppl < needle_a.ppl
    assert needle_a.ppl == pytest.approx(128.0, rel=1e-6) and needle_a.tokens == 7
    assert needle_a.objective == "needle" and needle_a.parts["depths"] == [0.5]


def test_mixed_is_the_weighted_sum_of_mean_nlls():
    model = tiny_model()
    windows = make_windows(HAYSTACK, 120, 2, "contiguous", 256, bos_token_id=1)
    settings = NeedleSettings(2, (0.2, 0.8), 256)
    mixed = build_objective("mixed", model, "yarn", HAYSTACK, windows, settings, TOKENIZER, 1, weight=0.3)
    assert isinstance(mixed, MixedObjective)
    score = mixed({"factor": 4.0})
    text = PerplexityObjective(model, windows, "yarn").evaluate()
    answer = NeedleObjective(model, build_needle_prompts(TOKENIZER, HAYSTACK, settings, 1), "yarn").evaluate()
    expected = math.exp(0.7 * math.log(text.ppl) + 0.3 * math.log(answer.ppl))
    assert score.ppl == pytest.approx(expected, rel=1e-9) and score.objective == "mixed"
    assert score.parts["perplexity"] == pytest.approx(text.ppl) and score.parts["needle"] == pytest.approx(answer.ppl)
    with pytest.raises(ValueError, match="needs needle settings and the model's tokenizer"):
        build_objective("needle", model, "yarn", HAYSTACK, needles=settings)
