"""``ropescale config-path``: shipped accelerate configs and recipes by name."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_patch_cli import assert_one_line_error, run


def test_accelerate_configs_resolve_to_files(capsys):
    for name in ("fsdp", "ddp"):
        code, out, _ = run(capsys, "config-path", name)
        path = Path(out.strip())
        assert code == 0 and path.is_file() and path.name == f"{name}.yaml"
        assert "distributed_type" in path.read_text()


def test_recipes_resolve_and_list(capsys):
    code, out, _ = run(capsys, "config-path", "smollm2-135m/pose_yarn_x4_cpu")
    assert code == 0 and Path(out.strip()).is_file()
    code, out, _ = run(capsys, "config-path", "--list")
    kinds = {line.split()[0] for line in out.splitlines()}
    assert code == 0 and kinds == {"accelerate", "recipe"}
    assert all(Path(line.split()[-1]).is_file() for line in out.splitlines())


def test_unknown_names_list_the_known_ones(capsys):
    code, _, err = run(capsys, "config-path", "fdsp")
    assert_one_line_error(code, err, "no shipped config named 'fdsp'", "fsdp")
    code, _, err = run(capsys, "config-path")
    assert_one_line_error(code, err, "--list")
