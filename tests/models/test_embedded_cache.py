"""The converted embedded model is verified on use and rebuilt from its GGUF when damaged.

The conversion is faked (a tiny random model stands for the GGUF's) by replacing transformers'
loaders, so the real code path runs: convert, use the cache, notice damage, convert again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from ropescale.models import embedded
from tests.conftest import tiny_model


class _Tokenizer:
    def save_pretrained(self, directory):
        (Path(directory) / "tokenizer_config.json").write_text("{}")


@pytest.fixture
def conversions(tmp_path, monkeypatch):
    """Point the cache at a fresh directory and count conversions from the (fake) GGUF."""
    monkeypatch.setenv("ROPESCALE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "pkg" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(embedded, "gguf_path", lambda name="smollm2-135m": gguf)
    calls = []

    def model_from_gguf(*args, **kwargs):
        calls.append(args)
        return tiny_model()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from_gguf)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tokenizer())
    return calls


def _weights(directory):
    return directory / "model.safetensors"


def test_a_sound_cache_is_converted_once(conversions):
    first = embedded.embedded_model_dir("smollm2-135m")
    assert embedded.embedded_model_dir("smollm2-135m") == first
    assert len(conversions) == 1
    assert (first / "config.json").is_file() and _weights(first).is_file()


def test_truncated_weights_are_rebuilt_from_the_gguf(conversions, capsys):
    target = embedded.embedded_model_dir("smollm2-135m")
    size = _weights(target).stat().st_size
    with open(_weights(target), "r+b") as f:
        f.truncate(size // 2)
    assert embedded.embedded_model_dir("smollm2-135m") == target
    assert len(conversions) == 2
    assert _weights(target).stat().st_size == size
    err = capsys.readouterr().err
    assert "is damaged (model.safetensors:" in err and "converting it again" in err


def test_weights_changed_in_place_are_caught_by_their_hash(conversions):
    target = embedded.embedded_model_dir("smollm2-135m")
    data = bytearray(_weights(target).read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes (and a newer modification time)
    _weights(target).write_bytes(bytes(data))
    embedded.embedded_model_dir("smollm2-135m")
    assert len(conversions) == 2
    assert _weights(target).read_bytes() != bytes(data)


def test_a_cache_without_manifest_is_rebuilt(conversions):
    target = embedded.embedded_model_dir("smollm2-135m")
    manifest = target / embedded.MANIFEST
    manifest.unlink()
    embedded.embedded_model_dir("smollm2-135m")
    assert len(conversions) == 2 and manifest.is_file()
