"""A tokenizer for the RULER tests: byte-level BPE trained on lm-eval's RULER wording, so that its
prompts are as compact as a real tokenizer's (the 400-token one of conftest.py cannot fit variable
tracking's one-shot example in lm-eval's fixed 500 tokens)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def ruler_corpus() -> list[str]:
    from lm_eval.tasks.ruler import cwe_utils, fwe_utils, vt_utils
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    lines = [vt_utils.TEMPLATE, cwe_utils.TEMPLATE, fwe_utils.TEMPLATE, TEMPLATE, noise]
    lines += ["One of the special magic numbers for quiet-lantern is: 1234567.", "VAR ABCDE = 12345"]
    lines += [" ".join(cwe_utils.WORDS[i : i + 40]) for i in range(0, 4000, 40)]
    lines += ["Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition."]
    return lines * 3


def save_ruler_model(path, tok: PreTrainedTokenizerFast, seed: int = 0) -> str:
    """A tiny random Llama whose vocabulary and special tokens are ``tok``'s (1,024 positions, SDPA), saved
    with ``tok`` into ``path``, as a user's checkpoint folder; returns the path. ``seed``: other weights."""
    from tests.conftest import tiny_model

    model = tiny_model(
        seed=seed,
        vocab_size=len(tok),
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        attn_implementation="sdpa",
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def ruler_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=list(SPECIAL.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(ruler_corpus(), trainer)
    bos = tok.token_to_id(SPECIAL["bos_token"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
