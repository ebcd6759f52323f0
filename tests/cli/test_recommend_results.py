"""``recommend --results FILE`` with a file it cannot use says so in one line naming the file, exit 2,
before the model is resolved (before: the file was silently ignored and the shipped numbers used)."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_patch_cli import assert_one_line_error, model_dir, run  # noqa: F401 - fixture


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    return path


CASES = {
    "missing": (None, "does not exist"),
    "not JSON": ("{", "is not JSON (Expecting property name"),
    "not UTF-8": (b"\xff\xfe\x00", "cannot be read ("),
    "wrong shape": (json.dumps({"a": 1}), "is not a results.json written by ropescale eval (it has no 'tasks' object)"),
    "a list": (json.dumps([1, 2]), "is not a results.json written by ropescale eval"),
    "another model": (json.dumps({"model": "someone-else", "tasks": {}}), "holds results of model 'someone-else'"),
}


@pytest.mark.parametrize("case", CASES)
def test_unusable_results_file_is_one_line(capsys, model_dir, tmp_path, monkeypatch, case):  # noqa: F811
    import ropescale.models.loading as loading

    monkeypatch.setattr(loading, "load_config", lambda *a, **k: pytest.fail("the model was read first"))
    content, fragment = CASES[case]
    path = _write(tmp_path, "r.json", content)
    code, _, err = run(capsys, "recommend", "--model", str(model_dir), "--target-length", "256", "--results", str(path))
    assert code == 2
    assert_one_line_error(code, err, f"results file '{path}'", fragment)


def test_a_folder_whose_results_file_cannot_be_read(capsys, model_dir, tmp_path):  # noqa: F811
    folder = tmp_path / "run"
    (folder / "results.json").mkdir(parents=True)  # a folder where the file should be
    code, _, err = run(
        capsys, "recommend", "--model", str(model_dir), "--target-length", "256", "--results", str(folder)
    )
    assert code == 2
    assert_one_line_error(code, err, f"results file '{folder}/results.json' cannot be read (")


def test_a_good_results_file_is_used(capsys, model_dir, tmp_path):  # noqa: F811
    data = {"model": str(model_dir), "tasks": {"perplexity": {"yarn": {"256": {"ppl": 3.0}}}}}
    path = _write(tmp_path, "results.json", json.dumps(data))
    code, out, err = run(
        capsys, "recommend", "--model", str(model_dir), "--target-length", "256", "--results", str(path), "--json"
    )
    assert code == 0, err
    assert str(path) in out


def test_train_commands_do_not_repeat_what_the_recipe_sets(capsys):
    """A recipe's own settings are not repeated as overrides (model.name=smollm2-135m scaling.factor=4 ...)."""
    from ropescale.cli.recommend import _without_recipe_settings

    repeated = (
        "ropescale train --config smollm2-135m/yarn_x4 model.name=smollm2-135m scaling.method=yarn scaling.factor=4"
    )
    assert _without_recipe_settings(repeated) == "ropescale train --config smollm2-135m/yarn_x4"
    changed = "ropescale train --config smollm2-135m/yarn_x4 scaling.factor=8 model.name=smollm2-135m"
    assert _without_recipe_settings(changed) == "ropescale train --config smollm2-135m/yarn_x4 scaling.factor=8"
    assert _without_recipe_settings("ropescale patch --model m --factor 4") == "ropescale patch --model m --factor 4"


@pytest.mark.parametrize(
    "name, factor, recipe",
    [
        ("meta-llama/Meta-Llama-3-8B", 8, "llama3-8b/yarn_x8"),
        ("/models/Meta-Llama-3-8B-Instruct", 4, "llama3-8b/yarn_x4"),
        ("mistralai/Mistral-7B-v0.3", 4, "mistral-7b-v0.3/yarn_x4"),
        ("Qwen/Qwen3-8B", 4, "qwen3-8b/yarn_x4"),
        ("smollm2-135m", 4, "smollm2-135m/yarn_x4"),
        # no yarn_x2: the factor's variant, the CPU recipe whose evidence recommend quotes (before: its "_cpu"
        # read as a context-parallel "_cp" and yarn_x4 was named, retargeted to x2)
        ("smollm2-135m", 2, "smollm2-135m/yarn_x2_cpu"),
    ],
)
def test_a_model_gets_its_familys_recipe_at_the_factor_asked(name, factor, recipe):
    """The recipe folder the model's name starts with, the longest such, at the factor asked for."""
    from ropescale.cli.recommend import _pose_recipe

    assert _pose_recipe(name, factor) == recipe


def test_a_familys_full_window_recipe_is_not_forced_onto_pose():
    from ropescale.cli.recommend import _as_the_family_trains

    cmd = "ropescale train --config llama3-8b/yarn_x8 model.name=m pose.enabled=true pose.target_length=65536"
    assert _as_the_family_trains("fine-tune (PoSE)", cmd, "llama3-8b/yarn_x8", 8) == (
        "fine-tune (full windows)",
        "ropescale train --config llama3-8b/yarn_x8 model.name=m",
    )
