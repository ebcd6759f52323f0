"""Offline fixtures for the lm-eval integration: a tiny random Llama with a word-level tokenizer over
the passkey prompt's words, saved as a checkpoint (L = 512: yarn x4 reaches 2048, passkey_2k's length)."""

from __future__ import annotations

import pytest

lm_eval = pytest.importorskip("lm_eval")

from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from ropescale.evals.lm_eval import TASKS_DIR  # noqa: E402
from ropescale.models import tiny  # noqa: E402
from tests.conftest import load_script  # noqa: E402

TINY_CONTEXT = 512  # L of the tiny model; yarn x4 -> 2048, the length of passkey_2k
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def task_utils():
    """evals/lm_eval/tasks/utils.py, loaded by path as lm-eval loads it."""
    return load_script(TASKS_DIR / "utils.py", "passkey_task_utils")


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over the passkey prompt's words, digits one per token, BOS prepended."""
    u = task_utils()
    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    words: list[str] = []
    for text in (u.TASK, u.FILLER, u.NEEDLE.format(key=0), u.QUESTION, "0123456789 Remember"):
        for word, _ in pre.pre_tokenize_str(text):
            if word not in words and word not in SPECIALS:
                words.append(word)
    vocab = {tok: i for i, tok in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama (2 layers, hidden 32, L=512) and its tokenizer, saved as a checkpoint."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = word_tokenizer()
    model = tiny.tiny_model(
        shape="narrow",
        vocab_size=len(tok),
        max_position_embeddings=TINY_CONTEXT,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def no_env_report(monkeypatch):
    """simple_evaluate runs torch's collect_env (pip list & co., ~5 s) for its results header: skip it."""
    import lm_eval.evaluator

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)


def make_lm(tiny_dir, **kwargs):
    """The registered ``ropescale`` model on the tiny checkpoint, on the CPU."""
    return lm_eval.api.registry.get_model("ropescale")(pretrained=str(tiny_dir), device="cpu", **kwargs)


def no_defaults_task_manager(runner):
    """A task_manager that never indexes lm-eval's 15k built-in tasks (12 s): unknown names fail fast."""
    from lm_eval.tasks import TaskManager

    def manager(tasks, include_path=None, metadata=None):
        m = TaskManager(include_path=runner._include_paths(include_path), include_defaults=False, metadata=metadata)
        missing = [t for t in tasks if t not in m.all_tasks]
        if missing:
            raise ValueError(f"unknown task(s): {', '.join(missing)}")
        return m

    return manager
