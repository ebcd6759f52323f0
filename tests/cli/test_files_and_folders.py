"""Files and folders that are not what a flag expects fail in one line naming them, before any
conversion or weights: binary ``--data`` (eval and train), ``ROPESCALE_CACHE`` on a file, a model
folder without tokenizer files."""

from __future__ import annotations

import re

import pytest
import transformers
import yaml

from ropescale.cli.main import main
from ropescale.data.documents import load_documents
from ropescale.errors import RopescaleError
from tests.conftest import tiny_model
from tests.training.conftest import char_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ff") / "tiny"
    tiny_model(attn_implementation="sdpa").save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def no_weights(monkeypatch):
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights were loaded")
    )


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and "%|" not in ln]
    return code, err


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"good text\n" * 5 + b"\x9c\x00\xff binary", "is not UTF-8 text (byte 0x9c at offset 50)"),
        (b"\x00\x01\x02\x03" * 10, "holds a NUL byte at offset 0 (a binary file?)"),
    ],
)
def test_binary_data_is_refused_with_its_offset(tmp_path, content, fragment):
    path = tmp_path / "data.bin"
    path.write_bytes(content)
    with pytest.raises(RopescaleError, match=re.escape(f"data file '{path}' {fragment}")):
        load_documents(path)
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("fine")
    (folder / "b.txt").write_bytes(content)
    with pytest.raises(RopescaleError, match=f"data file '{folder / 'b.txt'}'"):
        load_documents(folder)


def test_binary_data_in_eval_and_train(tmp_path, model_dir, capsys, no_weights):
    data = tmp_path / "blob.dat"
    data.write_bytes(bytes(range(128, 256)) * 8)
    out = tmp_path / "out"
    code, err = _cli(
        capsys, "eval", "perplexity", "--model", model_dir, "--lengths", "32", "--data", data, "--output", out
    )
    assert code == 2 and err == [
        f"ropescale: error: data file '{data}' is not UTF-8 text (byte 0x80 at offset 0); give a text file, "
        "a folder of .txt files or a JSONL/Parquet file"
    ]
    assert not out.exists()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
                "scaling": {"method": "yarn", "factor": 4},
                "data": {"source": str(data), "seq_len": 32},
                "train": {"max_steps": 2},
            }
        )
    )
    code, err = _cli(capsys, "train", "--config", recipe, "--output-dir", out)
    assert code == 2 and len(err) == 1 and f"data file '{data}' is not UTF-8 text" in err[0], err
    assert not out.exists()


def test_cache_on_a_file_is_refused_before_converting(tmp_path, capsys, monkeypatch):
    from ropescale.models import embedded

    monkeypatch.setattr(embedded, "gguf_path", lambda *a, **k: pytest.fail("converted"))
    file = tmp_path / "cache"
    file.write_text("")
    for value, what in ((file, "is a file"), (file / "sub", f"lies under the file '{file}'")):
        monkeypatch.setenv("ROPESCALE_CACHE", str(value))
        code, err = _cli(capsys, "patch", "--factor", "4")
        assert code == 2 and err == [
            f"ropescale: error: ROPESCALE_CACHE = '{value}' {what}, not a folder; point ROPESCALE_CACHE at a folder"
        ]


def test_model_folder_without_tokenizer_is_named(tmp_path, capsys, no_weights):
    folder = tmp_path / "bare"
    tiny_model().save_pretrained(folder)
    code, err = _cli(capsys, "eval", "perplexity", "--model", folder, "--lengths", "32", "--output", tmp_path / "o")
    assert code == 2 and len(err) == 1, err
    assert f"model folder '{folder}' has no tokenizer files (tokenizer.json, tokenizer.model, vocab.json...)" in err[0]
