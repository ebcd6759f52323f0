"""A damaged checkpoint never stops a resume with a loader's error: each checkpoint carries a
manifest (sizes, sha256) written last, and ``--resume`` takes the newest complete one, saying which it
skipped and why, or stops naming the file when none is complete. Each file kind is truncated in turn."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from ropescale.errors import RopescaleError
from ropescale.training.checkpoints import MANIFEST, checkpoint_problem, list_checkpoints
from ropescale.training.export import find_checkpoint
from ropescale.training.trainer import Trainer
from tests.training.conftest import recipe, repetitive_stream

KINDS = ["trainable.safetensors", "optimizer.safetensors", "scheduler.safetensors", "rng-0.safetensors", "state.json"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run with checkpoints at steps 1 and 2 (trained once for the module)."""
    from tests.conftest import tiny_model

    root = tmp_path_factory.mktemp("damage")
    config = recipe(root, train={"max_steps": 2, "save_every": 1})
    model = tiny_model(attn_implementation="sdpa")
    Trainer(config, model=model, train_tokens=repetitive_stream(), progress=False).train()
    return root


def _copy(trained, tmp_path):
    shutil.copytree(trained / "run-llama", tmp_path / "run-llama")
    return recipe(tmp_path, train={"max_steps": 2, "save_every": 1})


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def test_checkpoints_carry_a_manifest_of_every_file(trained):
    for step in list_checkpoints(trained / "run-llama"):
        files = json.loads((step / MANIFEST).read_text())["files"]
        assert sorted(files) == sorted(KINDS) and checkpoint_problem(step) is None


@pytest.mark.parametrize("kind", KINDS)
def test_resume_skips_a_damaged_newest_checkpoint(trained, tmp_path, capsys, make_model, kind):
    config = _copy(trained, tmp_path)
    newest = config.output_dir / "checkpoints" / "step-00000002"
    size = (newest / kind).stat().st_size
    _truncate(newest / kind)
    capsys.readouterr()
    result = Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train(resume=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ropescale: resuming from step-00000001, skipped step-00000002: {kind} is {size // 2} bytes, "
        f"its manifest says {size}"
    ]
    assert result.step == 2 and checkpoint_problem(newest) is None  # step 2 trained again, complete
    want = load_file(trained / "run-llama" / "checkpoints" / "step-00000002" / "trainable.safetensors")
    got = load_file(newest / "trainable.safetensors")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_no_complete_checkpoint_stops_naming_the_file(trained, tmp_path, make_model, kind):
    config = _copy(trained, tmp_path)
    for step in list_checkpoints(config.output_dir):
        _truncate(step / kind)
    newest = config.output_dir / "checkpoints" / "step-00000002"
    with pytest.raises(RopescaleError, match=f"no complete checkpoint to resume in .*: {newest / kind} .{kind} is "):
        Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train(resume=True)


def test_flipped_bytes_and_an_unfinished_folder_are_caught(trained, tmp_path, capsys):
    config = _copy(trained, tmp_path)
    newest = config.output_dir / "checkpoints" / "step-00000002"
    data = bytearray((newest / "optimizer.safetensors").read_bytes())
    data[-10] ^= 0xFF
    (newest / "optimizer.safetensors").write_bytes(bytes(data))
    assert checkpoint_problem(newest) == "optimizer.safetensors does not match the sha256 in its manifest"
    (newest / MANIFEST).unlink()
    assert checkpoint_problem(newest) is None  # no manifest, but weights and state: written before manifests
    (newest / "trainable.safetensors").unlink()
    assert checkpoint_problem(newest).startswith("manifest.json is missing")
    capsys.readouterr()
    assert find_checkpoint(config.output_dir) == config.output_dir / "checkpoints" / "step-00000001"
    assert "skipped step-00000002: manifest.json is missing" in capsys.readouterr().err
    with pytest.raises(RopescaleError, match="checkpoint .*step-00000002 is damaged: manifest.json is missing"):
        find_checkpoint(config.output_dir, "2")
