"""--overwrite never deletes an input: an output that is, contains or lies inside the model, data,
checkpoint or results it reads is refused in one line before anything is deleted (symlinks resolved);
a folder that does not look like ropescale's is refused rather than replaced; clearing a run folder
unlinks a symlinked entry itself, never what it points at."""

from __future__ import annotations

import json

import pytest

from ropescale.cli.main import main
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.conftest import tiny_model

PATCH = ["--method", "linear", "--factor", "2"]


@pytest.fixture
def models(tmp_path):
    """models/m (a tiny Llama) and a neighbour models/n, both ropescale-looking."""
    root = tmp_path / "models"
    tiny_model("llama").save_pretrained(root / "m")
    assert main(["patch", "--model", str(root / "m"), *PATCH, "--output", str(root / "n")]) == 0
    return root


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_patch_output_containing_the_model_is_refused_and_nothing_deleted(models, capsys):
    before = _tree(models)
    code, _, err = run(capsys, "patch", "--model", str(models / "m"), *PATCH, "--output", str(models), "--overwrite")
    assert_one_line_error(code, err, f"--output '{models}' contains the model '{models / 'm'}'")
    assert "--overwrite would delete it" in err and code == 2
    assert _tree(models) == before


def test_patch_output_that_is_the_model_through_a_symlink_is_refused(models, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(models / "n", target_is_directory=True)
    before = _tree(models)
    code, _, err = run(
        capsys, "patch", "--model", str(models / "n"), *PATCH, "--replace", "--output", str(link), "--overwrite"
    )
    assert_one_line_error(code, err, f"--output '{link}' is the model '{models / 'n'}'")
    assert _tree(models) == before


def test_patch_output_inside_the_model_is_refused(models, capsys):
    inner = models / "m" / "sub"
    assert main(["patch", "--model", str(models / "n"), *PATCH, "--replace", "--output", str(inner)]) == 0
    code, _, err = run(capsys, "patch", "--model", str(models / "m"), *PATCH, "--output", str(inner), "--overwrite")
    assert_one_line_error(code, err, f"--output '{inner}' lies inside the model '{models / 'm'}'", "part of it")
    assert (inner / "config.json").is_file()


def test_a_folder_ropescale_did_not_write_is_not_replaced(models, tmp_path, capsys):
    stranger = tmp_path / "photos"
    stranger.mkdir()
    (stranger / "cat.jpg").write_bytes(b"\xff\xd8")
    code, _, err = run(capsys, "patch", "--model", str(models / "m"), *PATCH, "--output", str(stranger), "--overwrite")
    assert_one_line_error(code, err, f"output directory '{stranger}' does not look like a checkpoint ropescale wrote")
    assert (stranger / "cat.jpg").is_file()
    code, _, _ = run(
        capsys, "patch", "--model", str(models / "m"), *PATCH, "--output", str(models / "n"), "--overwrite"
    )
    assert code == 0  # one of ours is replaced


def test_export_gguf_over_the_model_file_is_refused(tmp_path, capsys):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    link = tmp_path / "out.gguf"
    link.symlink_to(gguf)
    code, _, err = run(capsys, "export-gguf", str(gguf), "--output", str(link), "--overwrite")
    assert_one_line_error(code, err, f"--output '{link}' is the model '{gguf}'")
    assert gguf.read_bytes().startswith(b"GGUF")


def test_search_overwrite_of_the_model_folder_is_refused(models, capsys):
    config = (models / "m" / "config.json").read_text()
    code, _, err = run(
        capsys,
        "search",
        "--model",
        str(models / "m"),
        "--output",
        str(models / "m"),
        "--overwrite",
        "--budget",
        "1",
        "--target-length",
        "256",
    )
    assert_one_line_error(code, err, f"--output '{models / 'm'}' is the model '{models / 'm'}'")
    assert (models / "m" / "config.json").read_text() == config


def test_search_overwrite_of_a_folder_it_did_not_write_is_refused(models, capsys):
    code, _, err = run(
        capsys,
        "search",
        "--model",
        str(models / "m"),
        "--output",
        str(models / "n"),
        "--overwrite",
        "--budget",
        "1",
        "--target-length",
        "256",
    )
    assert_one_line_error(code, err, f"--output '{models / 'n'}' holds config.json but no history.json")
    assert (models / "n" / "config.json").is_file()


def test_a_search_history_of_a_newer_format_is_refused_not_rewritten(models, tmp_path, capsys):
    out = tmp_path / "search"
    out.mkdir()
    history = out / "history.json"
    history.write_text(json.dumps({"format": 2, "settings": {}, "candidates": []}))
    before = history.read_bytes()
    for extra in ([], ["--overwrite"]):
        code, _, err = run(
            capsys,
            "search",
            "--model",
            str(models / "m"),
            "--output",
            str(out),
            "--budget",
            "1",
            "--target-length",
            "256",
            *extra,
        )
        assert_one_line_error(code, err, f"search history '{history}' was written by a newer ropescale (format 2")
        assert history.read_bytes() == before
