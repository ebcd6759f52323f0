"""Fixtures for the training tests: tiny random Llama/Mistral checkpoints, a character tokenizer,
repetitive text, and recipes small enough to train in a second."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ropescale.training.config import config_from_dict
from tests.conftest import tiny_model

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]  # 4 + 96 ids < the tiny models' 128


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )


def repetitive_stream(n: int = 4000, period: int = 13, seed: int = 0) -> np.ndarray:
    """A token stream that repeats one random phrase: easy to learn, so the loss must fall."""
    rng = np.random.default_rng(seed)
    phrase = rng.integers(4, 128, size=period)
    return np.tile(phrase, n // period + 1)[:n].astype(np.int32)


def recipe(tmp_path, arch: str = "llama", **sections) -> object:
    """A tiny recipe (override any section with a dict)."""
    raw = {
        "name": f"tiny-{arch}",
        "model": {"name": f"tiny-{arch}", "attn_implementation": "sdpa"},
        "scaling": {"method": "yarn", "factor": 4},
        "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
        "data": {"seq_len": 32},
        "optim": {"lr": 1e-2, "warmup_steps": 1, "schedule": "constant"},
        "train": {
            "max_steps": 4,
            "save_every": 0,
            "output_dir": str(tmp_path / f"run-{arch}"),
            "gradient_checkpointing": False,
        },
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw)


@pytest.fixture
def make_model():
    def make(arch: str = "llama", seed: int = 0, **overrides):
        return tiny_model(arch, seed=seed, **{"attn_implementation": "sdpa", **overrides})

    return make


@pytest.fixture
def model_dir(tmp_path):
    """A saved tiny Llama with the character tokenizer beside it."""
    path = tmp_path / "tiny-llama"
    tiny_model("llama", attn_implementation="sdpa").save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _cpu_accelerator(monkeypatch):
    """The trainer's Accelerator places the model on the CPU on every machine: the tests feed CPU
    tensors to it and compare with CPU numbers (GPU training is tested in test_gpu.py)."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine spinning OpenMP threads
    make them many times slower; restored after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
