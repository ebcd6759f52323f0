"""bench_gguf_llamacpp keeps what each cell measured: the checkpoint's own factor, and no cell of another
checkpoint that shares its folder name is reused (refused before any weights load)."""

from __future__ import annotations

import json

from tests.conftest import load_script
from tests.export.conftest import tiny_llama


def test_a_cell_of_another_checkpoint_with_the_same_folder_name_is_refused_not_reused(tmp_path, capsys):
    bench = load_script("benchmarks/bench_gguf_llamacpp.py")
    out, binary = tmp_path / "out", tmp_path / "llama-perplexity"
    binary.write_text("")
    out.mkdir()
    theirs = {"source": str(tmp_path / "a" / "yarn-export"), "ratio": 1.0}
    (out / "results.json").write_text(json.dumps({"cells": {"yarn-export@16384": theirs, "yarn-export@8192": {}}}))
    mine = str((tmp_path / "b" / "yarn-export").resolve())
    results = json.loads((out / "results.json").read_text())
    keys = ["yarn-export@16384", "yarn-export@8192"]
    assert bench.other_sources(results, keys, mine, checkpoint=True) == keys  # 8192: no source, cannot tell
    assert bench.other_sources(results, keys[:1], theirs["source"], checkpoint=True) == []  # its own: resumed
    assert bench.other_sources(results, keys[1:], bench.MODEL, checkpoint=False) == []  # a method's old cell
    args = ["--checkpoint", mine, "--lengths", "16384", "--llama-perplexity", str(binary), "--output", str(out)]
    assert bench.main(args) == 2
    assert "results.json: yarn-export@16384 measured another model" in capsys.readouterr().err


def test_the_factor_recorded_is_the_one_the_checkpoint_carries(tmp_path):
    from ropescale import patch_config

    bench = load_script("benchmarks/bench_gguf_llamacpp.py")
    yarn = tiny_llama(max_position_embeddings=256).config
    yarn.rope_parameters = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 1e4,
    }
    mine = str((tmp_path / "yarn-export").resolve())
    assert bench.cell_identity(mine, yarn) == {"source": mine, "factor": 4.0}  # not 16384 / 8192
    patched = patch_config(tiny_llama().config, "yarn", factor=2.0)  # the embedded model patched per method
    assert bench.cell_identity(bench.MODEL, patched) == {"source": bench.MODEL, "factor": 2.0}
    assert bench.cell_identity(bench.MODEL, tiny_llama().config)["factor"] == 1.0  # unscaled ("none")


def test_a_checkpoint_re_exported_to_the_same_folder_is_another_checkpoint(tmp_path):
    bench = load_script("benchmarks/bench_gguf_llamacpp.py")
    ckpt = tmp_path / "yarn-export"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights one")
    first = bench.checkpoint_source(ckpt)
    assert (
        first.startswith(f"{ckpt.resolve()} sha256:")
        and bench.checkpoint_source(tmp_path / "." / "yarn-export") == first
    )
    (ckpt / "README.md").write_text("notes")  # not the model: the same checkpoint
    assert bench.checkpoint_source(ckpt) == first
    (ckpt / "model.safetensors").write_bytes(b"weights two")  # the same path, other weights
    results = {"cells": {"yarn-export@16384": {"source": first}}}
    assert bench.other_sources(results, ["yarn-export@16384"], bench.checkpoint_source(ckpt), checkpoint=True)
