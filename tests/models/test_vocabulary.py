"""A tokenizer with ids the checkpoint has no embedding row for (``vocab_size`` below the tokenizer's
size) is refused when the tokenizer loads, naming config.json, before the weights and before any output
folder (before: ``IndexError: index out of range in self``, exit 1, a results folder left behind)."""

from __future__ import annotations

import pytest

from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.models.loading import load_tokenizer
from tests.conftest import tiny_model
from tests.export.conftest import tiny_tokenizer
from tests.models.test_config_check import no_weights  # noqa: F401 - fixture


@pytest.fixture
def small_vocab(tmp_path):
    path = tmp_path / "m"
    tiny_model(vocab_size=100).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # 264 tokens
    return path


@pytest.mark.usefixtures("no_weights")
def test_a_tokenizer_larger_than_the_vocabulary_is_one_line_before_weights(small_vocab, tmp_path, capsys):
    line = (
        f"{small_vocab}/config.json: vocab_size = 100 is below the tokenizer's 264 tokens (ids 100 to 263 have no "
        "embedding row); give the model the tokenizer it was trained with, or resize its embeddings"
    )
    with pytest.raises(RopescaleError) as err:
        load_tokenizer(small_vocab)
    assert str(err.value) == line
    out = tmp_path / "out"
    data = tmp_path / "t.txt"
    data.write_text("The cat sat on the mat. " * 100)
    argv = ["eval", "perplexity", "--model", str(small_vocab), "--lengths", "64", "--data", str(data)]
    capsys.readouterr()
    assert main([*argv, "--output", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"ropescale: error: {line}"]
    assert not out.exists()


def test_a_vocabulary_larger_than_the_tokenizer_is_fine(tmp_path):
    """Padded embeddings (Qwen's 151936 rows for 151665 tokens) are not an error."""
    path = tmp_path / "m"
    tiny_model(vocab_size=300).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    assert len(load_tokenizer(path)) == 264
