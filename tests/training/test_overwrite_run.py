"""--overwrite of a run folder never deletes an input: the run's checkpoints under ``train export``,
a model trained from this run's ``merged/``; a symlinked entry is unlinked itself, never followed
(what it points at stays), and the run does not crash on it."""

from __future__ import annotations

import os
import shutil

from ropescale.cli.main import main
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.training.test_output_lock import recipe_file  # noqa: F401 (a fixture)


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_train_export_over_the_run_is_refused(tmp_path, recipe_file, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(recipe_file), "--output-dir", str(run_dir), "--no-progress"]) == 0
    before = _tree(run_dir)
    code, _, err = run(capsys, "export", str(run_dir), "--output", str(run_dir), "--overwrite")
    assert_one_line_error(code, err, f"--output '{run_dir}' contains the checkpoints '{run_dir / 'checkpoints'}'")
    assert _tree(run_dir) == before


def test_train_overwrite_unlinks_symlinked_entries_and_keeps_their_targets(tmp_path, recipe_file, capsys):  # noqa: F811
    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run_dir), "--no-progress"]
    assert main(argv) == 0
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run_dir / "adapter", elsewhere / "adapter")
    (elsewhere / "metrics.jsonl").write_text("{}\n")
    shutil.rmtree(run_dir / "adapter")
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "adapter").symlink_to(elsewhere / "adapter", target_is_directory=True)
    (run_dir / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")
    (run_dir / "merged").symlink_to(tmp_path / "gone", target_is_directory=True)  # a dangling link
    before = _tree(elsewhere)
    assert main([*argv, "--overwrite"]) == 0, capsys.readouterr().err
    assert _tree(elsewhere) == before and (elsewhere / "metrics.jsonl").read_text() == "{}\n"
    assert not (run_dir / "adapter").is_symlink() and (run_dir / "adapter" / "adapter_config.json").is_file()
    assert not os.path.lexists(run_dir / "merged")


def test_train_overwrite_of_a_run_whose_merged_model_is_the_input_is_refused(tmp_path, recipe_file, capsys):  # noqa: F811
    import yaml

    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run_dir), "--no-progress"]
    assert main([*argv, "--merge"]) == 0
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["model"]["name"] = str(run_dir / "merged")
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(recipe))
    before = _tree(run_dir)
    code, _, err = run(
        capsys, "train", "--config", str(second), "--output-dir", str(run_dir), "--overwrite", "--no-progress"
    )
    assert_one_line_error(code, err, f"run folder entry '{run_dir / 'merged'}' is the model '{run_dir / 'merged'}'")
    assert _tree(run_dir) == before


def test_merge_over_the_model_this_run_reads_is_refused(tmp_path, recipe_file, capsys):  # noqa: F811
    import yaml

    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(recipe_file), "--output-dir", str(run_dir), "--no-progress"]
    assert main([*argv, "--merge"]) == 0
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["model"]["name"] = str(run_dir / "merged")
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(recipe))
    before = _tree(run_dir)
    code, _, err = run(
        capsys, "train", "--config", str(second), "--output-dir", str(run_dir), "--resume", "--merge", "--no-progress"
    )
    assert_one_line_error(code, err, f"merged model '{run_dir / 'merged'}' is the model '{run_dir / 'merged'}'")
    assert "--merge would delete it" in err and _tree(run_dir) == before
