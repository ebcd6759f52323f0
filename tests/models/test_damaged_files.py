"""Damaged model files fail in one line that names the file (RopescaleError; exit 2 in the CLI).

Each file is made from a tiny saved model (or a tiny GGUF written here) and then cut short or
overwritten: a truncated ``model.safetensors``, a truncated ``.gguf``, a ``config.json`` that is
not JSON.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ropescale
from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.models.loading import load_config
from tests.conftest import tiny_model


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "tiny"
    tiny_model().save_pretrained(path)
    return path


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
    return code, lines


def _tiny_gguf(path):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_head_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((128, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keep", [0.5, 100, 4])
def test_truncated_safetensors_is_named(saved, capsys, keep):
    weights = saved / "model.safetensors"
    size = os.path.getsize(weights)
    _truncate(weights, int(size * keep) if keep < 1 else keep)
    with pytest.raises(RopescaleError, match=f"model file '{weights}' is truncated"):
        ropescale.from_pretrained(saved)
    code, lines = _cli(capsys, "patch", "--model", str(saved), "--factor", "4", "--output", str(saved.parent / "o"))
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"ropescale: error: model file '{weights}' is truncated")


def _edit_header(path, edit):
    """Rewrite the JSON header of a .safetensors file in place (same length, padded with spaces)."""
    import json
    import struct

    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    path.write_bytes(data[:8] + text.ljust(n) + data[8 + n :])


def _halve(header):
    entry = header["lm_head.weight"]
    entry["shape"] = [entry["shape"][0] // 2, entry["shape"][1]]


def _gap(header):
    entry = header["lm_head.weight"]
    begin, end = entry["data_offsets"]
    entry["data_offsets"] = [begin + 4, end + 4]
    for other in header.values():  # move every tensor after it too: only its start is wrong
        if isinstance(other, dict) and other is not entry and other.get("data_offsets", [0])[0] >= end:
            other["data_offsets"] = [other["data_offsets"][0] + 4, other["data_offsets"][1] + 4]


@pytest.mark.parametrize(
    "edit, problem",
    [
        (_halve, "tensor 'lm_head.weight' is F32 [64, 64] (16384 bytes) but its data_offsets [0, 32768] hold 32768"),
        (_gap, "tensor 'lm_head.weight' has data_offsets [4, 32772], but the data before it ends at 0"),
    ],
    ids=["shape", "offsets"],
)
def test_a_header_whose_shapes_disagree_with_its_offsets_is_named(saved, capsys, edit, problem):
    """Before: safetensors' "invalid shape, data type, or offset for tensor", exit 1, no file named."""
    weights = saved / "model.safetensors"
    _edit_header(weights, edit)
    line = f"model file '{weights}' has a damaged safetensors header: {problem}; re-download or re-save"
    with pytest.raises(RopescaleError) as err:
        ropescale.from_pretrained(saved)
    assert str(err.value).startswith(line)
    out = saved.parent / "o"
    code, lines = _cli(capsys, "eval", "perplexity", "--model", str(saved), "--lengths", "32", "--output", str(out))
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"ropescale: error: {line}"), lines
    assert not out.exists()


def test_config_that_is_not_json_is_named(saved, capsys):
    config = saved / "config.json"
    config.write_text('{"model_type": "llama", ')
    with pytest.raises(RopescaleError, match=f"config '{config}' is not valid JSON"):
        load_config(saved)
    code, lines = _cli(capsys, "patch", "--model", str(saved), "--factor", "4")
    assert code == 2 and len(lines) == 1 and f"config '{config}' is not valid JSON" in lines[0], lines
    config.write_text("[1, 2]")
    with pytest.raises(RopescaleError, match="holds a JSON list, not an object"):
        load_config(saved)


@pytest.mark.parametrize("keep", [0.5, 40])
def test_truncated_gguf_is_named(tmp_path, capsys, keep):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    _truncate(path, int(os.path.getsize(path) * keep) if keep < 1 else keep)
    code, lines = _cli(capsys, "patch", "--model", str(path), "--factor", "4")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"ropescale: error: GGUF file '{path}' is truncated or damaged")


def test_intact_files_pass(saved, tmp_path):
    from ropescale.models.integrity import check_checkpoint_dir, check_gguf

    check_checkpoint_dir(saved)
    check_gguf(_tiny_gguf(tmp_path / "ok.gguf"))
