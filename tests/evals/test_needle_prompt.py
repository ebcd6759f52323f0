"""Needle prompts: sentence splitting, exact lengths, needles between sentences at depth, seeds,
haystack sources, and the lengths too short for a task or a haystack."""

from __future__ import annotations

import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ropescale.data.corpus import CorpusNotInstalledError, Document
from ropescale.evals.tasks import needle_prompt
from ropescale.evals.tasks.needle_prompt import build_needle_prompt, sentence_boundaries
from ropescale.evals.tasks.needle_tasks import (
    ADJECTIVES,
    ANSWER_PREFIX,
    INTRO,
    NEEDLE,
    NOUNS,
    QUESTION,
    TASKS,
    get_task,
)

# Made-up prose (not the corpus): paragraphs, dialogue, titles and initials that must not end a
# sentence, and a two-line verse.
PARAGRAPHS = [
    "The village of Little Brambling lay in a fold of green hills. Its people kept bees and grew "
    "pears. Every spring a fair came to the common, and the children ran to see the tents.",
    '"Oh! what a morning," said Mrs. Pim, opening the shutters. "Is the baker late again?" '
    "Mr. Pim did not answer; he was reading a letter from J. Tolley about the new mill.",
    "The mill stood by the river. It had a wheel of oak and a roof of slate. Nobody could "
    "remember who had built it, but everybody had an opinion about who should mend it.",
    "By noon the fair was busy. A man sold ribbons, a woman sold honey cakes, and a boy with a "
    "drum marched up and down. The vicar bought a jar of plums and looked very pleased with it!",
    "Down by the water, where the willows lean,\nThe miller sings of things he has not seen.",
    "In the evening the lamps were lit along the lane. Mrs. Pim counted the coins in her apron. "
    '"Forty," she said. "Forty, and a button." Then she laughed, and the day was done.',
    "Winter came early that year. Snow lay on the hills for weeks, and the river froze at the "
    "bend. The miller let his wheel rest. He mended nets by the fire and told the same story "
    "about the great flood to anyone who would sit still long enough to hear it.",
    "Dr. Hale walked from farm to farm with his black bag. He drank a great deal of tea. "
    "At the Tolley house he found the baby well, the grandmother cross, and the cat asleep in "
    "the bread basket. He wrote all of this down in a small green book.",
    '"Will the fair come back in spring?" asked the youngest Pim. "It always does," said her '
    "mother. The child did not believe her. She counted the days on the kitchen wall with a "
    "stub of chalk, and every morning she rubbed one mark away.",
    "When the thaw came, the lane turned to mud. Carts stuck fast and horses sulked. The vicar "
    "preached a long sermon on patience, which nobody remembered by dinner time. Still, the "
    "pear trees put out their first white flowers, and the bees woke up.",
    "At last the tents appeared on the common again. The drum boy had grown a whole head taller. "
    "The honey cakes were as good as ever, and the ribbons were brighter. Little Brambling "
    "forgot the winter in a single afternoon, as villages do.",
]
HAYSTACK = "\n\n".join(PARAGRAPHS) + "\n"
TASK_NAMES = list(TASKS)


def _train_metaspace() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE (Metaspace, digits split) that knows every character used here.

    The shared conftest tokenizers are trained on the passkey text only: the metaspace one has no
    ':', '-', '"' or newline, which the needles and the haystack need.
    """
    special = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(prepend_scheme="first"), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    texts = [HAYSTACK, NEEDLE, "0 1 2 3 4 5 6 7 8 9", " ".join(ADJECTIVES), " ".join(NOUNS), "a-b, c, and d."]
    texts += list(INTRO.values()) + list(QUESTION.values()) + list(ANSWER_PREFIX.values())
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(special.values()), show_progress=False)
    tok.train_from_iterator(texts * 5, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


@pytest.fixture(scope="module")
def needle_metaspace_tokenizer() -> PreTrainedTokenizerFast:
    return _train_metaspace()


@pytest.fixture(params=["bytelevel", "metaspace"])
def tok(request, bytelevel_tokenizer, needle_metaspace_tokenizer):
    """Both tokenizer styles: byte-level BPE (conftest) and SentencePiece-like (above)."""
    return bytelevel_tokenizer if request.param == "bytelevel" else needle_metaspace_tokenizer


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _norm(text: str) -> str:
    return " ".join(text.split())


def _without_needles(p) -> list[int]:
    """The prompt's haystack tokens with the needles cut out."""
    ids, out, cursor = p.input_ids, [], p.haystack_start
    for n in p.needles:
        out += ids[cursor : n.start]
        cursor = n.end
    return out + ids[cursor : p.question_start]


def _fixed_tokens(tokenizer, task: str) -> int:
    """Tokens a prompt needs besides the haystack (from a roomy prompt)."""
    p = build_needle_prompt(tokenizer, task, 1000, 0.5, haystack=HAYSTACK)
    return p.length - p.n_haystack


# --------------------------------------------------------------------------- sentences


def test_sentence_boundaries_skip_titles_initials_and_lower_case_continuations():
    text = 'Mr. Pim came. "Oh!" said she. J. Tolley wrote! Did he? Yes.\nA line\nanother\n\n'
    starts = sentence_boundaries(text)
    pieces = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text.rstrip())])]
    assert pieces == [
        "Mr. Pim came.",
        ' "Oh!" said she.',
        " J. Tolley wrote!",
        " Did he?",
        " Yes.",
        "\nA line",
        "\nanother",
    ]
    assert sentence_boundaries("no end at all") == [0]


# --------------------------------------------------------------------------- prompt


@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_prompt_has_exact_length_and_intact_needles_at_depth(tok, task, depth):
    spec = get_task(task)
    fixed = _fixed_tokens(tok, task)
    for length in (fixed + 37, fixed + 400):
        p = build_needle_prompt(tok, task, length, depth, seed=3, trial=1, haystack=HAYSTACK)
        ids = p.input_ids
        assert len(ids) == p.length == length
        assert ids[0] == tok.bos_token_id and tok.bos_token_id not in ids[1:]  # tokenizer adds BOS itself
        assert p.n_haystack == p.question_start - p.haystack_start - sum(n.end - n.start for n in p.needles)
        # Every needle is intact at its offsets and readable in the decoded prompt.
        assert len(p.needles) == spec.num_needles
        full = _decode(tok, ids)
        for n in p.needles:
            sentence = NEEDLE.format(key=n.key, value=n.value)
            assert _decode(tok, ids[n.start : n.end]).strip() == sentence
            assert sentence in full
        assert [n.start for n in p.needles] == sorted(n.start for n in p.needles)
        # The needle at depth is a queried one carrying the first expected value.
        (at_depth,) = [n for n in p.needles if n.start == p.needle_start]
        assert at_depth.queried and at_depth.value == p.expected[0] and at_depth.key == p.query_keys[0]
        # Depth: haystack tokens before it = the sentence boundary nearest to depth * n.
        in_needle = {i for n in p.needles for i in range(n.start, n.end)}
        before = sum(1 for i in range(p.haystack_start, p.needle_start) if i not in in_needle)
        assert before == p.haystack_before and p.actual_depth == before / p.n_haystack
        sentence_tokens = max(len(tok.encode(s, add_special_tokens=False)) for s in HAYSTACK.split(".")) + 2
        assert abs(before - depth * p.n_haystack) <= sentence_tokens
        hay = _without_needles(p)
        if 0 < before < p.n_haystack:  # a sentence (or line) ended just before, one starts after
            hay_before = _decode(tok, hay[:before]).rstrip()
            assert re.search(r"[.!?][\"']?$", hay_before) or re.search(rf"{re.escape(hay_before[-8:])}\n", HAYSTACK)
            assert tok.convert_ids_to_tokens(hay[before])[0] in "\u0120\u010a\u2581\n "  # Ġ Ċ ▁: leading whitespace
        if depth == 0.0:
            assert p.needle_start == p.haystack_start
        if depth == 1.0:  # after the whole haystack (other needles may share the spot in a tiny one)
            assert before == p.n_haystack
            assert at_depth.end == p.question_start or len(set(re.findall(r"[.!?]", _decode(tok, hay)))) < 3
        # Intro first, question and answer prefix last; the question names the queried keys only.
        one = spec.num_queries * spec.num_values == 1
        assert _decode(tok, ids[: p.haystack_start]).strip() == INTRO[one]
        query = ", ".join(p.query_keys[:-1]) + ", and " + p.query_keys[-1] if len(p.query_keys) > 1 else p.query_keys[0]
        tail = _decode(tok, ids[p.question_start :]).strip()
        assert tail == QUESTION[one].format(query=query) + " " + ANSWER_PREFIX[one].format(query=query)


def test_haystack_is_consecutive_document_text(tok):
    docs = [("long", HAYSTACK), ("short", "Too short. Far too short.")]
    for trial in range(4):
        p = build_needle_prompt(tok, "niah_multikey", 500, 0.5, trial=trial, haystack=docs)
        assert p.document == "long"  # the only text long enough
        hay = _norm(_decode(tok, _without_needles(p)))
        source = _norm(HAYSTACK[p.start_char :])
        assert source.startswith(hay) and len(hay) > 100
        assert p.start_char == 0 or HAYSTACK[p.start_char] == "\n"  # starts at a paragraph


def test_keys_values_and_distractors(tok):
    lengths = {"niah_single": 300, "niah_multikey": 700, "niah_multivalue": 700, "niah_multiquery": 800}
    for trial in range(3):
        ps = {
            t: build_needle_prompt(tok, t, n, 0.4, seed=7, trial=trial, haystack=HAYSTACK) for t, n in lengths.items()
        }
        for p in ps.values():
            values = [n.value for n in p.needles]
            assert all(re.fullmatch(r"[1-9]\d{6}", v) for v in values) and len(set(values)) == len(values)
            assert all(re.fullmatch(r"[a-z]+-[a-z]+", n.key) for n in p.needles)
        mk = ps["niah_multikey"]
        queried = [n for n in mk.needles if n.queried]
        distractors = [n for n in mk.needles if not n.queried]
        assert len(queried) == 1 and len(distractors) == 3 and mk.query_keys == (queried[0].key,)
        assert len({n.key for n in mk.needles}) == 4 and mk.expected == (queried[0].value,)
        question = _decode(tok, mk.input_ids[mk.question_start :])
        assert queried[0].key in question and not any(d.key in question for d in distractors)
        mv = ps["niah_multivalue"]
        assert {n.key for n in mv.needles} == set(mv.query_keys) and len(mv.expected) == 4
        assert sorted(mv.expected) == sorted(n.value for n in mv.needles)
        mq = ps["niah_multiquery"]
        assert all(n.queried for n in mq.needles) and len(mq.query_keys) == 4
        assert sorted(mq.expected) == sorted(n.value for n in mq.needles)
        assert ", and " in _decode(tok, mq.input_ids[mq.question_start :])
        # The needles sit at different sentence boundaries.
        for p in (mk, mv, mq):
            gaps = [b.start - a.end for a, b in zip(p.needles, p.needles[1:])]
            assert all(g > 0 for g in gaps)


def test_prompts_are_seeded_and_depths_share_text_and_needles(bytelevel_tokenizer):
    def build(depth=0.5, seed=0, trial=0):
        return build_needle_prompt(
            bytelevel_tokenizer, "niah_multikey", 450, depth, seed=seed, trial=trial, haystack=HAYSTACK
        )

    a = build()
    assert build().input_ids == a.input_ids
    for depth in (0.0, 0.2, 1.0):
        b = build(depth)
        assert (b.query_keys, b.expected, b.start_char) == (a.query_keys, a.expected, a.start_char)
        assert {(n.key, n.value) for n in b.needles} == {(n.key, n.value) for n in a.needles}
        assert _without_needles(b) == _without_needles(a)  # same haystack, needles moved
    assert build(trial=1).expected != a.expected
    assert build(seed=1).expected != a.expected


def test_bos_follows_tokenizer_or_argument(bytelevel_tokenizer):
    p = build_needle_prompt(bytelevel_tokenizer, "niah_single", 300, 0.5, haystack=HAYSTACK, add_bos=False)
    assert len(p.input_ids) == 300 and bytelevel_tokenizer.bos_token_id not in p.input_ids
    assert p.haystack_start == len(bytelevel_tokenizer.encode(INTRO[True], add_special_tokens=False))


def test_default_haystack_is_the_corpus(bytelevel_tokenizer, monkeypatch):
    # The tests run with an empty cache: the corpus is reported as not installed, with the command.
    with pytest.raises(CorpusNotInstalledError, match="corpus install"):
        build_needle_prompt(bytelevel_tokenizer, "niah_single", 300, 0.5)
    monkeypatch.setattr(needle_prompt, "load_corpus", lambda name: [Document("Little Brambling", HAYSTACK)])
    p = build_needle_prompt(bytelevel_tokenizer, "niah_single", 300, 0.5)
    assert p.document == "Little Brambling"


def test_too_short_length_and_haystack(bytelevel_tokenizer):
    message = r"length 100 is too short for niah_multikey: BOS, instructions, 4 needles and question take (\d+) tokens"
    with pytest.raises(ValueError, match=message) as info:
        build_needle_prompt(bytelevel_tokenizer, "niah_multikey", 100, 0.5, haystack=HAYSTACK)
    assert "\n" not in str(info.value) and int(re.search(r"take (\d+)", str(info.value)).group(1)) > 300
    with pytest.raises(ValueError, match="too short for niah_single: BOS, instructions, 1 needle and question"):
        build_needle_prompt(bytelevel_tokenizer, "niah_single", 100, 0.5, haystack=HAYSTACK)

    n_tokens = needle_prompt._Document.build(bytelevel_tokenizer, "t", HAYSTACK).n_tokens
    with pytest.raises(
        ValueError,
        match=r"haystack too short: length 5000 needs \d+ haystack tokens for niah_multikey, "
        rf"but the longest haystack text \(haystack\[0\]\) has only {n_tokens} tokens",
    ):
        build_needle_prompt(bytelevel_tokenizer, "niah_multikey", 5000, 0.5, haystack=[HAYSTACK, "Short."])
    # Near the limit: a length works exactly when its haystack part fits in the text's tokens.
    fixed = _fixed_tokens(bytelevel_tokenizer, "niah_single")
    outcomes = []
    for length in range(fixed + n_tokens - 6, fixed + n_tokens + 7):
        try:
            p = build_needle_prompt(bytelevel_tokenizer, "niah_single", length, 1.0, haystack=HAYSTACK)
        except ValueError as e:
            needs = int(re.search(r"needs (\d+) haystack tokens", str(e)).group(1))
            assert needs > n_tokens
            outcomes.append(False)
        else:
            assert p.length == length and p.n_haystack <= n_tokens and p.start_char == 0
            outcomes.append(True)
    assert outcomes[0] and not outcomes[-1]
