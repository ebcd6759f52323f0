"""Recall sentences: long-range retrieval written into training windows (``data.recall_facts``).

Prose seldom makes a model find one exact token thousands of positions back, so a fine-tune on prose
under new rotations can learn to predict text while it unlearns retrieval (docs/finetuning.md measures
exactly that on the embedded model). Synthetic retrieval mixed into the training data is the field's
remedy: Xiong et al. (arXiv 2406.19292) fine-tune on synthetic key-value lookups and retrieval improves
on real tasks; LongLoRA's supervised stage (arXiv 2309.12307) adds long-document QA for the same reason.

With ``data.recall_facts = n`` every window carries ``n`` sentences such as
"Colonel Ashby's parcel number is 40817." written over its text in the window's first quarter, and the
same sentences again, in another order, in its last quarter. The repeated digits can be predicted only
by finding the first statement, and the names differ within a window, so the model must find the right
one. The loss is the ordinary next-token loss over the whole window.

* **Not the passkey prompt.** No "pass key", no question, no filler, 3 to 7 digits: the passkey cells
  measure a skill this data trains, not this data (say so beside any number it produced).
* **Where.** Window token indices, the same rule with PoSE or without. A sentence never straddles a
  PoSE chunk start: it moves to begin there; one that then no longer fits its quarter is left out
  (with many short chunks, several are). A PoSE window's chunk starts depend on the seed and the
  window length, not on the target, so a scaled fine-tune and its control (same seed, windows and
  chunks) see the same sentences at the same window indices, the fine-tune's quarters often in
  different chunks, thousands of positions apart.
* **Forms** (``data.recall_forms``, default ``[digits]``): ``digits`` repeats the statement word for
  word (the passkey's answer type, copied); ``paraphrase`` asks for the same digits in other words
  ("The number of Colonel Ashby's parcel was 40817."), so the fact must be found by what it says, not
  by a copied span; ``words`` and ``names`` make the answer a made-up word or a person, not digits;
  ``hops`` states a number for one person and, for another, that theirs is the same, then gives the
  second person's number late (two steps back). Each sentence draws its form from the list. None is
  the passkey's or RULER's wording, so tasks other than the passkey judge what they teach.
* **Deterministic.** Names, numbers and places come from the window's own generator (the data
  pipeline seeds one per window), so a resumed run writes the same sentences.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.documents import tokens_after_sentence
from ..errors import RopescaleError

TITLES = ("Mr.", "Mrs.", "Miss", "Captain", "Colonel", "Lady", "Sir", "Dr.", "Admiral", "Major")
SURNAMES = (
    "Ashby", "Carrow", "Denholm", "Ellery", "Fairlie", "Garside", "Halloway", "Ingram", "Jessop", "Kendrew",
    "Lockyer", "Marlowe", "Netherby", "Oakes", "Pennock", "Quarles", "Ridley", "Stainton", "Thursby", "Upton",
    "Varley", "Whitlock", "Yarrow", "Bramhall", "Colville", "Dunstan", "Everard", "Fenwick", "Grantley", "Hesketh",
)  # fmt: skip
THINGS = ("parcel", "ledger", "cabin", "carriage", "account", "locker", "ticket", "room", "box", "letter")
SENTENCE = "{title} {surname}'s {thing} number is {digits}."
#: the forms a recipe may ask for (``data.recall_forms``); each a (first statement, later sentence) pair
FORMS = ("digits", "paraphrase", "words", "names", "hops")
SYLLABLES = ("ba", "ko", "ri", "sel", "tam", "vo", "nu", "pel", "dra", "mi", "zo", "ler", "qua", "fen", "ti", "gor")


class RecallWriter:
    """Writes ``n`` recall sentences and their repetitions into a window's token ids.

    Args:
        tokenizer: the recipe's tokenizer (sentences are tokenized as they are drawn).
        n: sentences per window (≥ 1; at most ``len(SURNAMES)``).
    """

    def __init__(self, tokenizer: Any, n: int, forms: tuple[str, ...] = ("digits",)) -> None:
        if not 1 <= n <= len(SURNAMES):
            raise ValueError(f"recall sentences per window must be in [1, {len(SURNAMES)}], got {n}")
        unknown = [f for f in forms if f not in FORMS]
        if unknown or not forms:
            raise ValueError(f"data.recall_forms must be a non-empty list of {', '.join(FORMS)}; got {list(forms)}")
        self.tokenizer, self.n, self.forms = tokenizer, n, tuple(forms)

    def sentences(self, rng: np.random.Generator) -> list[np.ndarray]:
        """``n`` first statements with distinct surnames, tokenized (the later sentences: :meth:`pairs`)."""
        return [first for first, _ in self.pairs(rng)]

    def pairs(self, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
        """``n`` (first statement, later sentence) pairs with distinct surnames, tokenized; for ``digits``
        both are the same sentence (with one form, no draw is spent choosing it: the sentences of a
        recipe without ``recall_forms`` are those it wrote before forms existed)."""
        out = []
        for surname in rng.choice(len(SURNAMES), size=self.n, replace=False):
            digits = "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(3, 8))))
            who = f"{TITLES[rng.integers(len(TITLES))]} {SURNAMES[surname]}"
            thing = THINGS[rng.integers(len(THINGS))]
            form = self.forms[0] if len(self.forms) == 1 else self.forms[int(rng.integers(len(self.forms)))]
            first, later = self._texts(form, who, thing, digits, rng)
            tokens = [np.asarray(tokens_after_sentence(self.tokenizer, t), np.int64) for t in (first, later)]
            out.append((tokens[0], tokens[0] if later == first else tokens[1]))
        return out

    @staticmethod
    def _texts(form: str, who: str, thing: str, digits: str, rng: np.random.Generator) -> tuple[str, str]:
        if form == "digits":
            text = f"{who}'s {thing} number is {digits}."
            return text, text
        if form == "paraphrase":
            return f"{who}'s {thing} number is {digits}.", f"The number of {who}'s {thing} was {digits}."
        if form == "words":
            word = "".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), size=3))
            return (
                f"{who}'s {thing} is marked with the word {word}.",
                f"The word marked on the {thing} of {who} was {word}.",
            )
        other = f"{TITLES[rng.integers(len(TITLES))]} {SURNAMES[int(rng.integers(len(SURNAMES)))]}"
        if form == "names":
            return f"{who} gave the {thing} to {other}.", f"The {thing} that {who} gave away went to {other}."
        # hops: the number is stated for `other`, `who` is tied to it, and asked of `who` late
        return (
            f"{other}'s {thing} number is {digits}. {who}'s {thing} number is the same as {other}'s.",
            f"So {who}'s {thing} number is {digits}.",
        )

    def write(self, ids: np.ndarray, chunk_starts: np.ndarray, rng: np.random.Generator, first: int) -> None:
        """Overwrite ``ids`` in place with the statements and their repetitions.

        Args:
            ids: the window's token ids. # [seq_len]
            chunk_starts: window indices where a PoSE chunk begins (positions jump there; empty without
                PoSE); no sentence straddles one.
            rng: the window's generator.
            first: the first index that may be written (after the BOS).
        """
        length = ids.size
        pairs = self.pairs(rng)
        sents, later = [p[0] for p in pairs], [p[1] for p in pairs]
        quarter = length // 4
        said = self._place(sents, range(len(sents)), first, quarter, chunk_starts, rng)
        order = [i for i in rng.permutation(len(sents)) if i in said]
        again = self._place(later, order, length - quarter, length, chunk_starts, rng)
        for i, at in again.items():  # only sentences that fit both times are written
            ids[said[i] : said[i] + sents[i].size] = sents[i]
            ids[at : at + later[i].size] = later[i]

    def _place(self, sents, order, lo: int, hi: int, chunk_starts, rng) -> dict[int, int]:
        """Start index of each sentence of ``order`` within ``[lo, hi)``, one after another, each
        at a random place in its share of the range; sentences that do not fit are left out."""
        placed, cursor, share = {}, lo, max(1, (hi - lo) // max(1, len(order)))
        for slot, i in enumerate(order):
            n = sents[i].size
            at = max(cursor, lo + slot * share + int(rng.integers(0, max(1, share - n))))
            while (inside := chunk_starts[(chunk_starts > at) & (chunk_starts < at + n)]).size:
                at = int(inside[-1])  # begin where the chunk begins (and again, where chunks are short)
            if at + n > hi:
                continue
            placed[i], cursor = at, at + n
        return placed


def recall_writer(
    tokenizer: Any, n: int, seq_len: int, forms: tuple[str, ...] | list[str] = ("digits",)
) -> RecallWriter | None:
    """The writer a recipe's ``data.recall_facts = n`` (and ``data.recall_forms``) asks for (None for 0),
    refused when the tokenizer is missing or ``n`` of its longest sentences do not fit a quarter of the window."""
    if not n:
        return None
    if tokenizer is None:
        raise RopescaleError(f"data.recall_facts={n} needs the model's tokenizer, and this run has none")
    who, rng = f"Admiral {max(SURNAMES, key=len)}", np.random.default_rng(0)
    texts = [t for f in forms for t in RecallWriter._texts(f, who, "carriage", "0" * 7, rng)]
    longest = max(texts, key=lambda t: len(tokens_after_sentence(tokenizer, t)))
    need = 4 * n * len(tokens_after_sentence(tokenizer, longest))
    if not set(forms) <= {"digits", "paraphrase"}:
        need += 4 * n * 4  # a made-up word or another name can tokenize longer than the longest drawn here
    if seq_len < need:
        raise RopescaleError(f"data.recall_facts={n} needs data.seq_len >= {need} with this tokenizer, got {seq_len}")
    return RecallWriter(tokenizer, n, tuple(forms))
