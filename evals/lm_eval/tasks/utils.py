"""Passkey retrieval documents for the lm-eval tasks in this folder, generated locally (no Hub data).

The prompt is the standard one (Mohtashami & Jaggi, as used by PI / YaRN / LongLoRA)::

    TASK
    filler sentences before the needle
    NEEDLE ("The pass key is K. Remember it. K is the pass key.")
    filler sentences after the needle
    QUESTION ("What is the pass key? The pass key is")

lm-eval passes prompts to the model as *text*, so the filler is cut at sentence granularity (the
five sentences of "The grass is green. The sky is blue. ..." cycled), not at token granularity:

* With a tokenizer (the ``tokenizer`` or ``pretrained`` entry of the task metadata, which
  ``ropescale eval harness`` / ``run_harness`` always sets, and lm-eval's CLI takes from
  ``--model_args``/``--metadata``), each prompt is measured with it and holds the most filler
  sentences that keep it at or under ``length - passkey_gen_toks`` tokens (BOS counted when the
  tokenizer adds one): prompt + answer fit in the nominal length, so ``max_length=length`` never
  truncates it. It falls short of that by less than one filler sentence (~5 tokens).
* Without one, lengths are *estimated* at 1.3 tokens per word (the SmolLM2/Llama BPE ratio on
  this filler is 1.26) and are only approximate; each document says which (``sizing``).

Depths follow the van der Corput sequence (0.5, 0.25, 0.75, 0.125, ...), so the first documents
(``--limit N``) already spread over the context. Keys are 5-digit integers drawn from a
``random.Random`` seeded with ``passkey_seed`` and the length: the documents are the same on every
run and machine. The metric ``acc`` is 1 when the first integer of the generation equals the key.

Settings read from the task metadata (``--metadata passkey_samples=20``): ``passkey_samples``
(documents per length, default 10, YaRN's trial count), ``passkey_seed`` (default 0) and
``passkey_gen_toks`` (room left for the answer, default 16, = the tasks' ``max_gen_toks``).
"""

from __future__ import annotations

import functools
import logging
import math
import random
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

# The standard prompt (Mohtashami & Jaggi), shared with ropescale's own passkey engine.
from ropescale.evals.tasks.passkey import FILLER, NEEDLE, QUESTION, TASK  # noqa: E402
from ropescale.evals.tasks.records import JSONValue  # noqa: E402

if TYPE_CHECKING:
    import datasets


class PasskeyDoc(TypedDict):
    """One passkey document (:func:`make_docs`), a row of the task's dataset."""

    input: str
    #: the pass key, as the text the model must write
    key: str
    length: int
    depth: float
    n_tokens: int
    n_filler_sentences: int
    #: "tokenizer" (sized with the model's) or "estimate" (1.3 tokens a word)
    sizing: str


FILLER_SENTENCES = [s if s.endswith(".") else s + "." for s in FILLER.split(". ")]
DEFAULT_SAMPLES = 10
DEFAULT_SEED = 0
DEFAULT_GEN_TOKS = 16
TOKENS_PER_WORD = 1.3  # estimate used only when no tokenizer is available
_FIRST_INTEGER = re.compile(r"[0-9]+")

log = logging.getLogger(__name__)


def van_der_corput(i: int, base: int = 2) -> float:
    """The ``i``-th (1-based) element of the van der Corput sequence: 0.5, 0.25, 0.75, 0.125, ..."""
    value, denom = 0.0, 1.0
    while i:
        denom *= base
        i, digit = divmod(i, base)
        value += digit / denom
    return value


def build_text(n_filler: int, depth: float, key: int) -> str:
    """The passkey prompt with ``n_filler`` filler sentences, ``round(depth * n)`` of them before the needle."""
    before = math.floor(depth * n_filler + 0.5)
    sentences = [FILLER_SENTENCES[i % len(FILLER_SENTENCES)] for i in range(n_filler)]
    parts = [TASK, " ".join(sentences[:before]), NEEDLE.format(key=key), " ".join(sentences[before:]), QUESTION]
    return "\n".join(p for p in parts if p)


def estimate_tokens(text: str) -> int:
    """Approximate token count (no tokenizer available)."""
    return math.ceil(TOKENS_PER_WORD * len(text.split()))


@functools.lru_cache(maxsize=8)
def _load_tokenizer(name: str) -> Any:
    import ropescale

    return ropescale.load_tokenizer(name)


def tokenizer_counter(name: str) -> Callable[[str], int]:
    """A token counter for the tokenizer ``name`` (embedded model name, directory, .gguf or Hub id).

    Counts as lm-eval's HF model encodes a prompt by default (``add_special_tokens`` left to the
    tokenizer, so a BOS it adds is counted).
    """
    try:
        tok = _load_tokenizer(str(name))
    except Exception as exc:  # noqa: BLE001 - one line, naming what was asked for
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"passkey tasks: could not load tokenizer '{name}' to size the prompts: {first}") from None
    return lambda text: len(tok(text)["input_ids"])


def _fit(count: Callable[[str], int], target: int, depth: float, key: int, start: int) -> tuple[int, int]:
    """Largest filler-sentence count ``n`` with ``count(build_text(n)) <= target``, searching from ``start``."""
    n = max(start, 0)
    tokens = count(build_text(n, depth, key))
    while tokens > target and n > 0:
        n -= 1
        tokens = count(build_text(n, depth, key))
    if tokens > target:
        raise ValueError(f"passkey length {target} tokens is too short for the prompt without filler ({tokens} tokens)")
    while True:
        nxt = count(build_text(n + 1, depth, key))
        if nxt > target:
            return n, tokens
        n, tokens = n + 1, nxt


def _first_guess(count: Callable[[str], int], target: int) -> int:
    """Filler-sentence count near ``target`` tokens from two measurements (tokens grow ~linearly)."""
    base = count(build_text(0, 0.5, 12345))
    probe = 200
    per_sentence = max((count(build_text(probe, 0.5, 12345)) - base) / probe, 1e-6)
    return max(int((target - base) / per_sentence), 0)


def make_docs(
    length: int,
    samples: int = DEFAULT_SAMPLES,
    seed: int = DEFAULT_SEED,
    gen_toks: int = DEFAULT_GEN_TOKS,
    tokenizer: str | None = None,
) -> list[PasskeyDoc]:
    """Passkey documents for one nominal ``length`` (see module docstring)."""
    for name, value in (("passkey_length", length), ("passkey_samples", samples), ("passkey_gen_toks", gen_toks)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"passkey_seed must be an integer, got {seed!r}")
    if gen_toks >= length:
        raise ValueError(f"passkey_gen_toks ({gen_toks}) must be smaller than the length ({length})")
    if tokenizer:
        count, sizing = tokenizer_counter(tokenizer), "tokenizer"
    else:
        log.warning("passkey tasks: no tokenizer in the task metadata; prompt lengths are estimated (1.3 tokens/word)")
        count, sizing = estimate_tokens, "estimate"
    target = length - gen_toks
    rng = random.Random(seed * 1_000_003 + length)
    guess = _first_guess(count, target)
    docs: list[PasskeyDoc] = []
    for i in range(samples):
        depth = van_der_corput(i + 1)
        key = rng.randint(10000, 99999)
        n, tokens = _fit(count, target, depth, key, guess)
        guess = n
        docs.append(
            PasskeyDoc(
                input=build_text(n, depth, key),
                key=str(key),
                length=length,
                depth=depth,
                n_tokens=tokens,
                n_filler_sentences=n,
                sizing=sizing,
            )
        )
    return docs


def _tokenizer_name(metadata: dict[str, JSONValue]) -> str | None:
    for key in ("tokenizer", "pretrained"):
        value = metadata.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def passkey_dataset(passkey_length: int, **metadata: JSONValue) -> dict[str, datasets.Dataset]:
    """``custom_dataset`` for the passkey tasks: ``{"test": Dataset}`` of :func:`make_docs` documents.

    lm-eval calls it with the task's ``dataset_kwargs`` (``passkey_length``) and its metadata
    (the YAML's, the run's ``--metadata`` and, on lm-eval's CLI, the ``--model_args``).
    """
    import datasets

    docs = make_docs(
        passkey_length,
        samples=metadata.get("passkey_samples", DEFAULT_SAMPLES),
        seed=metadata.get("passkey_seed", DEFAULT_SEED),
        gen_toks=metadata.get("passkey_gen_toks", DEFAULT_GEN_TOKS),
        tokenizer=_tokenizer_name(metadata),
    )
    return {"test": datasets.Dataset.from_list(docs)}


def first_integer(text: str) -> str | None:
    """The first run of digits in ``text``, or None."""
    match = _FIRST_INTEGER.search(text)
    return match.group(0) if match else None


def process_results(doc: PasskeyDoc, results: list[str]) -> dict[str, float]:
    """``acc`` = 1.0 when the first integer the model generated equals the pass key."""
    found = first_integer(results[0] if results else "")
    return {"acc": 1.0 if found is not None and int(found) == int(doc["key"]) else 0.0}
