"""No code runs from a run folder: optimizer, scheduler and RNG state are written as safetensors with
JSON metadata, and a checkpoint holding a pickle (an earlier version's ``optimizer.pt``, or a payload
someone put there, manifest re-hashed) is refused before anything loads, the payload never run."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.training.checkpoints import list_checkpoints, rng_state, set_rng_state, write_manifest
from ropescale.training.state_files import load_state, save_state
from ropescale.training.trainer import Trainer
from tests.payloads import write_payload
from tests.training.conftest import recipe, repetitive_stream
from tests.training.test_output_lock import recipe_file  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.conftest import tiny_model

    root = tmp_path_factory.mktemp("pickles")
    config = recipe(root, train={"max_steps": 2, "save_every": 1})
    Trainer(
        config, model=tiny_model(attn_implementation="sdpa"), train_tokens=repetitive_stream(), progress=False
    ).train()
    return root


@pytest.mark.parametrize("kind", ["optimizer", "scheduler", "rng-0"])
def test_a_pickled_state_file_is_refused_and_never_run(trained, tmp_path, make_model, kind):
    import shutil

    shutil.copytree(trained / "run-llama", tmp_path / "run-llama")
    config = recipe(tmp_path, train={"max_steps": 3, "save_every": 1})
    marker = tmp_path / "MARKER"
    for step in list_checkpoints(config.output_dir):  # as an earlier version wrote it, manifest re-hashed
        (step / f"{kind}.safetensors").unlink()
        write_payload(step / f"{kind}.pt", marker)
        (step / "manifest.json").unlink()
        write_manifest(step)
    newest = config.output_dir / "checkpoints" / "step-00000001" / f"{kind}.pt"
    with pytest.raises(RopescaleError) as info:
        Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train(resume=True)
    assert str(info.value) == (
        f"checkpoint file '{newest}' is a pickle, which ropescale does not load (loading one can run code); "
        "start again with --overwrite, or resume a checkpoint written by this ropescale version"
    )
    assert "weights_only" not in str(info.value)
    assert not marker.exists()


def test_cli_resume_of_a_pickled_checkpoint_is_one_line(tmp_path, recipe_file, capsys):  # noqa: F811
    run = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run), "--no-progress"]
    assert main(argv) == 0
    step = list_checkpoints(run)[-1]
    marker = tmp_path / "MARKER"
    (step / "optimizer.safetensors").unlink()
    write_payload(step / "optimizer.pt", marker)
    write_manifest(step)
    capsys.readouterr()
    assert main([*argv, "--resume", "train.max_steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ropescale: error: checkpoint file '{step / 'optimizer.pt'}' is a pickle, which ropescale does not load "
        "(loading one can run code); start again with --overwrite, or resume a checkpoint written by this "
        "ropescale version"
    ]
    assert not marker.exists()


def test_rng_state_round_trips_exactly(tmp_path):
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    np.random.normal()  # a cached Gaussian in NumPy's state
    save_state(tmp_path / "rng.safetensors", rng_state())
    want = (random.random(), np.random.normal(), torch.rand(3))
    set_rng_state(load_state(tmp_path / "rng.safetensors"))
    got = (random.random(), np.random.normal(), torch.rand(3))
    assert got[:2] == want[:2] and torch.equal(got[2], want[2])


def test_a_state_file_of_a_newer_format_is_refused(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "optimizer.safetensors"
    save_file({}, str(path), metadata={"format": "ropescale-state", "version": "9", "state": "{}"})
    with pytest.raises(RopescaleError, match=r"written by a newer ropescale \(format 9, this one reads 1\)"):
        load_state(path)
    path.write_bytes(b"\x08\x00")  # damaged: named, not a safetensors traceback
    with pytest.raises(RopescaleError, match=f"state file '{path}' is damaged"):
        load_state(path)


def test_a_model_folder_with_a_pickled_pytorch_model_bin_is_refused(tmp_path, capsys):
    from tests.conftest import tiny_config

    folder = tmp_path / "m"
    folder.mkdir()
    tiny_config("llama").save_pretrained(folder)
    marker = tmp_path / "MARKER"
    write_payload(folder / "pytorch_model.bin", marker)
    code = main(
        ["patch", "--model", str(folder), "--method", "linear", "--factor", "2", "--output", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"ropescale: error: model file '{folder / 'pytorch_model.bin'}' is a pickle, which ropescale does not load "
        "(loading one can run code); ropescale loads weights only from .safetensors files: use a safetensors copy "
        "of the checkpoint"
    ]
    assert "weights_only" not in err and not marker.exists() and not (tmp_path / "o").exists()


def test_fsdp_sharded_state_dicts_are_refused_before_training():
    from types import SimpleNamespace

    from torch.distributed.fsdp import StateDictType

    from ropescale.training.state_files import check_fsdp_state_dict_type

    check_fsdp_state_dict_type(SimpleNamespace(state_dict_type=StateDictType.FULL_STATE_DICT))
    with pytest.raises(
        RopescaleError, match="fsdp_state_dict_type: SHARDED_STATE_DICT saves the optimizer with a pickled"
    ):
        check_fsdp_state_dict_type(SimpleNamespace(state_dict_type=StateDictType.SHARDED_STATE_DICT))
