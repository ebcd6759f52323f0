"""RULER's synthetic tasks (Hsieh et al., arXiv 2404.06654) as lm-eval generates them, offline.

Every sample comes from lm-eval's own generator (``lm_eval.tasks.ruler``: ``prepare_niah``,
``vt_utils``, ``cwe_utils``, ``fwe_utils``), called with the same arguments as lm-eval's task of
that name, so a ropescale sample *is* lm-eval's sample for the same tokenizer, length and seed
(``tests/evals/test_ruler_tasks.py`` checks each against lm-eval's task function). What lm-eval
leaves to the process, this module pins:

* the seed: lm-eval's generators draw from Python's global ``random`` (and numpy's for variable
  tracking); they are seeded with ``seed`` for the call and given back their previous state after;
* the common-words generator's module-level ``random.Random(42)``, which advances with every call
  in a process: it is put back to its state right after lm-eval imports it, so a cell does not
  depend on which cells ran before it;
* the network: ``prepare_niah`` asks NLTK to download its ``punkt_tab`` sentence model when it is
  imported; ropescale imports it with that download switched off. The needle haystacks
  (``niah_single_1``'s repeated sentences, ``niah_multikey_2/3``'s other needles) need nothing.

The tasks whose haystack is Paul Graham's essays (downloaded by lm-eval) run here on held-out
prose instead, named as a variant: ``niah_single_2[austen]`` is lm-eval's ``niah_single_2`` with
*Emma* (from :mod:`ropescale.data.corpus`) as its haystack and a rule-based sentence splitter in place
of NLTK's punkt model (which downloads). Their numbers are not comparable with published
``niah_single_2`` scores.

The prompt is lm-eval's plain-text context: the sample's ``input``, the task's target delimiter
(a space; two newlines for common words) and its ``gen_prefix`` (the start of the answer). Scoring
is lm-eval's: ``postprocess_pred`` then ``string_match_all`` (the share of the expected strings
found in the output, case-insensitive) per sample.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Any, TypedDict

#: RULER's threshold for a length to count as effective (the score of Llama-2-7B at 4k, in %).
RULER_THRESHOLD = 85.6

_ESSAY = "austen"  # the local haystack that replaces the essays


class NiahArgs(TypedDict, total=False):
    """lm-eval's ``generate_samples`` arguments of a needle task (its haystack, key and value kinds, and
    the counts a variant sets)."""

    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int
    num_needle_v: int
    num_needle_q: int


class RulerDoc(TypedDict, total=False):
    """One of lm-eval's RULER documents (a sample), with the keys read here."""

    input: str
    #: the expected strings
    outputs: list[str]
    gen_prefix: str
    length: int
    max_length: int
    index: int


@dataclass(frozen=True)
class RulerTask:
    """One row of the table: how lm-eval generates, prompts and scores a task."""

    name: str
    family: str  # niah | vt | cwe | fwe
    what: str  # what it measures, for the docs and reports
    max_new_tokens: int  # lm-eval's max_gen_toks
    delimiter: str = " "  # lm-eval's target_delimiter between input and gen_prefix
    niah: NiahArgs = field(default_factory=dict)  # generate_samples arguments (niah tasks)

    @property
    def haystack(self) -> str:
        return self.niah.get("type_haystack", "-")

    @property
    def lm_eval_task(self) -> str:
        """The lm-eval task it reproduces (the variant's base task for the essay ones)."""
        base = self.name.split("[")[0]
        return f"ruler_{base}" if self.family != "niah" else base


def _niah(name: str, what: str, haystack: str, k: str = "words", v: str = "numbers", **counts: int) -> RulerTask:
    args = NiahArgs(type_haystack=haystack, type_needle_k=k, type_needle_v=v, **counts)
    return RulerTask(name, "niah", what, 128, niah=args)


TASKS: dict[str, RulerTask] = {
    t.name: t
    for t in [
        _niah("niah_single_1", "one number keyed by a word, in a repeated-sentence haystack", "repeat"),
        _niah(f"niah_single_2[{_ESSAY}]", "one number keyed by a word, in prose (Emma)", "essay"),
        _niah(f"niah_single_3[{_ESSAY}]", "one UUID keyed by a word, in prose (Emma)", "essay", v="uuids"),
        _niah(f"niah_multikey_1[{_ESSAY}]", "one of 4 keyed numbers, in prose (Emma)", "essay", num_needle_k=4),
        _niah("niah_multikey_2", "one number among a haystack of other keyed numbers", "needle"),
        _niah("niah_multikey_3", "one UUID keyed by a UUID among other UUID needles", "needle", k="uuids", v="uuids"),
        _niah(f"niah_multivalue[{_ESSAY}]", "all 4 numbers of one key, in prose (Emma)", "essay", num_needle_v=4),
        _niah(f"niah_multiquery[{_ESSAY}]", "the numbers of 4 keys, in prose (Emma)", "essay", num_needle_q=4),
        RulerTask("vt", "vt", "variable tracking: every name bound to a value through a 4-hop chain", 30),
        RulerTask("cwe", "cwe", "common words: the 10 most frequent words of a numbered list", 120, "\n\n"),
        RulerTask("fwe", "fwe", "frequent words: the 3 most frequent coded words (Zipf-distributed)", 50),
    ]
}

#: lm-eval's names of the same tasks
ALIASES = {"ruler_vt": "vt", "ruler_cwe": "cwe", "ruler_fwe": "fwe"}

#: lm-eval tasks that download their haystack, and the variant that runs here
_DOWNLOADS = {
    base: f"{base}[{_ESSAY}]"
    for base in ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")
}


def get_task(name: str) -> RulerTask:
    """The task called ``name`` (lm-eval's ``ruler_vt`` & co. accepted).

    Raises:
        ValueError: an unknown name, or an essay task without its local variant's suffix.
    """
    key = ALIASES.get(name.strip(), name.strip())
    if key in TASKS:
        return TASKS[key]
    if key in _DOWNLOADS:
        raise ValueError(
            f"RULER task {key!r} reads Paul Graham's essays, which lm-eval downloads; "
            f"run {_DOWNLOADS[key]!r} (the same generator on held-out Austen prose)"
        )
    raise ValueError(f"unknown RULER task {name!r}; choose from {', '.join(TASKS)}")


# -- lm-eval's generators, offline and seeded ------------------------------------------------------


def _prepare_niah():
    """lm-eval's niah generator module, imported without its NLTK download."""
    if "lm_eval.tasks.ruler.prepare_niah" not in sys.modules:
        import nltk

        download = nltk.download
        nltk.download = lambda *a, **k: False  # its import asks for punkt_tab; nothing is fetched
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                import lm_eval.tasks.ruler.prepare_niah  # noqa: F401
        finally:
            nltk.download = download
    return sys.modules["lm_eval.tasks.ruler.prepare_niah"]


def _cwe_rng_at_import(cwe_utils) -> random.Random:
    """``cwe_utils.RNG`` as lm-eval's import leaves it: ``Random(42)`` after shuffling ``WORDS``
    (a shuffle draws the same numbers whatever the items, so a list of the same length replays it)."""
    rng = random.Random(42)
    rng.shuffle(list(range(len(cwe_utils.WORDS))))
    return rng


@contextlib.contextmanager
def seeded(seed: int):
    """Seed Python's and numpy's global generators for the block, give their states back after, and
    keep lm-eval's progress prints off stdout."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = re.compile(r"\b(Mr|Mrs|Ms|Dr|St|Col|Capt|Esq)\.$")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after ``.``/``!``/``?`` (and closing quotes) before an
    upper-case letter or a digit, not after a title such as ``Mrs.`` — the stand-in for NLTK's
    punkt model, which downloads."""
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if _ABBREVIATIONS.search(text[start : m.start()]):
            continue  # "Mrs. Weston": the sentence goes on
        if text[start : m.end()].strip():
            out.append(text[start : m.end()].strip())
        start = m.end()
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def essay_haystack(text: str) -> list[str]:
    """A prose haystack as lm-eval's ``get_haystack("essay")`` shapes the essays: its words."""
    return re.sub(r"\s+", " ", text).split(" ")


def generate_samples(
    task: RulerTask, tokenizer: Any, length: int, samples: int, seed: int, essay: list[str] | None = None
) -> list[RulerDoc]:
    """lm-eval's samples of ``task`` at ``length`` tokens: the first ``samples`` of what lm-eval's
    task function generates after ``random.seed(seed)`` (and ``numpy.random.seed(seed)``).

    Args:
        task: a row of :data:`TASKS`.
        tokenizer: the evaluated model's tokenizer (lm-eval sizes every prompt with it).
        length: lm-eval's ``max_seq_length``: prompt plus the tokens to generate.
        samples: how many samples.
        seed: the seed of the global generators.
        essay: the haystack's words for the essay variants (:func:`essay_haystack`).

    Returns:
        lm-eval's documents: ``input``, ``outputs`` (the expected strings), ``gen_prefix``,
        ``length``, ``max_length``, ``index``.
    """
    check_fits(task, tokenizer, length, essay)
    docs = _generate(task, tokenizer, length, samples, seed, essay)
    if any(not d["outputs"] for d in docs):
        raise ValueError(
            f"RULER task {task.name} at {length} tokens: lm-eval's generator left a sample without an answer"
        )
    return docs


def _generate(task: RulerTask, tokenizer: Any, length: int, samples: int, seed: int, essay: list[str] | None):
    with seeded(seed):
        if task.family == "niah":
            return _niah_samples(task, tokenizer, length, samples, essay)
        if task.family == "vt":
            from lm_eval.tasks.ruler import vt_utils

            icl = vt_utils.sys_vartrack_w_noise_random(  # as vt_utils.get_dataset: its one-shot example first
                tokenizer=tokenizer, num_samples=1, max_seq_length=500, incremental=5
            )[0]
            return vt_utils.sys_vartrack_w_noise_random(
                tokenizer=tokenizer, num_samples=samples, max_seq_length=length, icl_example=icl
            )
        if task.family == "cwe":
            from lm_eval.tasks.ruler import cwe_utils

            saved = cwe_utils.RNG.getstate()
            cwe_utils.RNG.setstate(_cwe_rng_at_import(cwe_utils).getstate())
            try:
                return cwe_utils.sys_word_pair_random(num_samples=samples, max_seq_length=length, tokenizer=tokenizer)
            finally:
                cwe_utils.RNG.setstate(saved)
        from lm_eval.tasks.ruler import fwe_utils

        return fwe_utils.sys_kwext(tokenizer=tokenizer, max_seq_length=length, num_samples=samples)


def check_fits(task: RulerTask, tokenizer: Any, length: int, essay: list[str] | None = None) -> None:
    """Refuse a length too short for lm-eval's variable-tracking, common- or frequent-word generator:
    their retry loops (a bare ``except`` around "shrink until it fits") never end when the smallest
    prompt does not fit, and nothing, not even Ctrl-C inside the loop, stops them. The smallest
    prompt is measured with lm-eval's own builder (10 % margin for its random content).

    A needle task's smallest prompt (its needles in the fewest haystack units lm-eval's generator
    tries, plus the tokens it keeps for the answer) is measured too: below it, lm-eval generates no
    sample and says "Raise `max_seq_lengths`", a name of its own, after the weights. ``essay`` is the
    prose haystack of the ``[austen]`` tasks (without it their check is left to the generator).

    Raises:
        ValueError: naming the task, the length and the smallest prompt's size.
    """
    if task.family == "niah":
        smallest = _niah_smallest(task, tokenizer, length, essay)
        if smallest is not None and smallest > length:
            raise ValueError(
                f"RULER task {task.name} at {length} tokens: its smallest prompt (the needles in the fewest haystack "
                f"units lm-eval's generator tries, and {task.max_new_tokens} tokens for the answer) takes {smallest} tokens "
                f"with this tokenizer; use a length of at least {int(smallest / 0.9) + 1} (its random keys vary)"
            )
        return
    n = _count(tokenizer)
    with seeded(0):
        if task.family == "vt":
            from lm_eval.tasks.ruler import vt_utils

            shot = n(vt_utils.generate_input_output(5, 1, 4, is_icl=True)[0]) + 30
            if shot > 0.9 * 500:
                need = f"its one-shot example alone takes {shot} of lm-eval's fixed 500 tokens with this tokenizer"
                raise ValueError(f"RULER task vt cannot run: {need} (lm-eval's generator would loop forever)")
            smallest = n(vt_utils.generate_input_output(10, 1, 4)[0]) + 30 + shot
        elif task.family == "cwe":
            from lm_eval.tasks.ruler import cwe_utils

            example, text, answer = cwe_utils.generate_input_output(10, length)
            smallest = n(example + "\n" + text + " " + " ".join(answer)) + 120
        else:
            from lm_eval.tasks.ruler import fwe_utils

            smallest = n(fwe_utils.TEMPLATE) + 50 + 10
    if smallest > 0.9 * length:
        raise ValueError(
            f"RULER task {task.name} at {length} tokens: its smallest prompt takes about {smallest} tokens with "
            f"this tokenizer; use a length of at least {int(smallest / 0.9) + 1} (lm-eval's generator would loop forever)"
        )


def _niah_smallest(task: RulerTask, tokenizer: Any, length: int, essay: list[str] | None) -> int | None:
    """Tokens of the smallest prompt lm-eval's ``generate_samples`` tries at ``length``, with the
    answer's tokens; None for an essay task without its essay."""
    args = dict(task.niah)
    kind = args.pop("type_haystack")
    if kind == "essay" and not essay:
        return None
    prepare = _prepare_niah()
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    k = max(args.pop("num_needle_k", 1), args.get("num_needle_q", 1))
    v = args.pop("num_needle_v", 1)
    # lm-eval sizes the haystack from `step` units up while a prompt and the answer fit; when the first
    # does not, it falls back to one unit per needle (its loop never runs at a length within the answer's)
    step = 500 if kind == "essay" else (25 if length >= 4096 else 5)
    units = k * v if length > task.max_new_tokens else max(step, k * v)
    haystack = essay if kind == "essay" else prepare.get_haystack(type_haystack=kind)
    saved = prepare.cached_sent_tokenize
    prepare.cached_sent_tokenize = split_sentences  # NLTK's punkt downloads
    try:
        with seeded(0):
            text, _, _ = prepare.generate_input_output(
                units, haystack, type_haystack=kind, template=TEMPLATE, num_needle_k=k, num_needle_v=v, **args
            )
    finally:
        prepare.cached_sent_tokenize = saved
    return _count(tokenizer)(text) + task.max_new_tokens


def _count(tokenizer: Any):
    return lambda text: len(tokenizer(text).input_ids)


def _niah_samples(task: RulerTask, tokenizer: Any, length: int, samples: int, essay: list[str] | None):
    prepare = _prepare_niah()
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    kind = task.niah["type_haystack"]
    if kind == "essay":
        if not essay:
            raise ValueError(f"{task.name} needs a prose haystack (essay_haystack of a held-out text)")
        saved = prepare.cached_sent_tokenize
        prepare.cached_sent_tokenize = split_sentences  # NLTK's punkt downloads
        try:
            return prepare.generate_samples(
                essay, TOKENIZER=tokenizer, max_seq_length=length, template=TEMPLATE, num_samples=samples, **task.niah
            )
        finally:
            prepare.cached_sent_tokenize = saved
    return prepare.generate_samples(
        prepare.get_haystack(type_haystack=kind),
        TOKENIZER=tokenizer,
        max_seq_length=length,
        template=TEMPLATE,
        num_samples=samples,
        **task.niah,
    )


# -- prompt and score ----------------------------------------------------------------------------


def prompt_text(task: RulerTask, doc: RulerDoc) -> str:
    """lm-eval's plain-text context of ``doc``: its input, the task's delimiter where neither side
    has whitespace at the join (lm-eval's ``requires_delimiter``), and the ``gen_prefix``."""
    text, prefix = doc["input"], doc["gen_prefix"]
    joins = bool(text) and not (text[-1].isspace() or prefix[:1].isspace())
    return text + (task.delimiter if joins else "") + prefix


def score(prediction: str, expected: list[str]) -> float:
    """lm-eval's per-sample RULER score: ``string_match_all`` of the post-processed output."""
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    return string_match_all(postprocess_pred([prediction]), [list(expected)])


__all__ = [
    "ALIASES",
    "RULER_THRESHOLD",
    "TASKS",
    "RulerTask",
    "check_fits",
    "essay_haystack",
    "generate_samples",
    "get_task",
    "prompt_text",
    "score",
    "seeded",
    "split_sentences",
]
