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


class RecallWriter:
    """Writes ``n`` recall sentences and their repetitions into a window's token ids.

    Args:
        tokenizer: the recipe's tokenizer (sentences are tokenized as they are drawn).
        n: sentences per window (≥ 1; at most ``len(SURNAMES)``).
    """

    def __init__(self, tokenizer: Any, n: int) -> None:
        if not 1 <= n <= len(SURNAMES):
            raise ValueError(f"recall sentences per window must be in [1, {len(SURNAMES)}], got {n}")
        self.tokenizer, self.n = tokenizer, n

    def sentences(self, rng: np.random.Generator) -> list[np.ndarray]:
        """``n`` sentences with distinct surnames, tokenized."""
        out = []
        for surname in rng.choice(len(SURNAMES), size=self.n, replace=False):
            digits = "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(3, 8))))
            text = SENTENCE.format(
                title=TITLES[rng.integers(len(TITLES))],
                surname=SURNAMES[surname],
                thing=THINGS[rng.integers(len(THINGS))],
                digits=digits,
            )
            out.append(np.asarray(tokens_after_sentence(self.tokenizer, text), np.int64))
        return out

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
        sents = self.sentences(rng)
        quarter = length // 4
        said = self._place(sents, range(len(sents)), first, quarter, chunk_starts, rng)
        order = [i for i in rng.permutation(len(sents)) if i in said]
        again = self._place(sents, order, length - quarter, length, chunk_starts, rng)
        for i, at in again.items():  # only sentences that fit both times are written
            ids[said[i] : said[i] + sents[i].size] = sents[i]
            ids[at : at + sents[i].size] = sents[i]

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


def recall_writer(tokenizer: Any, n: int, seq_len: int) -> RecallWriter | None:
    """The writer a recipe's ``data.recall_facts = n`` asks for (None for 0), refused when the
    tokenizer is missing or ``n`` of its longest sentences do not fit a quarter of the window."""
    if not n:
        return None
    if tokenizer is None:
        raise RopescaleError(f"data.recall_facts={n} needs the model's tokenizer, and this run has none")
    longest = SENTENCE.format(title="Admiral", surname=max(SURNAMES, key=len), thing="carriage", digits="0" * 7)
    need = 4 * n * len(tokens_after_sentence(tokenizer, longest))
    if seq_len < need:
        raise RopescaleError(f"data.recall_facts={n} needs data.seq_len >= {need} with this tokenizer, got {seq_len}")
    return RecallWriter(tokenizer, n)
