"""``ropescale export-gguf`` in process: a written file with the scaling, or one line and nothing written."""

from __future__ import annotations

import pytest

from ropescale.cli.main import main
from tests.cli.test_patch_cli import assert_one_line_error, run

gguf = pytest.importorskip("gguf")


def test_export_with_method_prints_the_rope_keys(capsys, checkpoint, tmp_path):
    path, _, _ = checkpoint
    out_file = tmp_path / "y.gguf"
    code, out, err = run(
        capsys,
        "export-gguf",
        str(path),
        "--output",
        str(out_file),
        "--method",
        "yarn",
        "--factor",
        "4",
        "--dtype",
        "q8_0",
    )
    assert code == 0, err
    assert "scaling.type=yarn" in out and "scaling.factor=4" in out and "q8_0" in out
    fields = gguf.GGUFReader(out_file).fields
    assert fields["llama.rope.scaling.original_context_length"].contents() == 64


def test_export_of_a_patched_checkpoint_needs_no_flags(capsys, checkpoint, tmp_path):
    path, _, _ = checkpoint
    patched = tmp_path / "pi"
    assert main(["patch", "--model", str(path), "--method", "linear", "--factor", "2", "--output", str(patched)]) == 0
    code, out, err = run(capsys, "export-gguf", str(patched), "--output", str(tmp_path / "pi.gguf"))
    assert code == 0, err
    assert "scaling.type=linear scaling.factor=2" in out


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--method", "dynamic_yarn", "--factor", "4"], ["method 'dynamic_yarn' cannot be exported", "current length"]),
        (["--method", "self_extend", "--factor", "2"], ["method 'self_extend'", "--grp-attn-n"]),
        (["--factor", "4"], ["--factor needs --method"]),
        (["--dtype", "q4_0"], ["invalid choice"]),
    ],
)
def test_refusals_are_one_line_and_write_nothing(capsys, checkpoint, tmp_path, argv, fragments):
    path, _, _ = checkpoint
    code, _, err = run(capsys, "export-gguf", str(path), "--output", str(tmp_path / "x.gguf"), *argv)
    assert code == 2
    assert_one_line_error(code, err, *fragments)
    assert not list(tmp_path.glob("*x.gguf*"))


def test_a_saved_dynamic_checkpoint_is_refused(capsys, checkpoint, tmp_path):
    path, _, _ = checkpoint
    saved = tmp_path / "dyn"
    assert (
        main(["patch", "--model", str(path), "--method", "dynamic_yarn", "--factor", "4", "--output", str(saved)]) == 0
    )
    code, _, err = run(capsys, "export-gguf", str(saved), "--output", str(tmp_path / "d.gguf"))
    assert_one_line_error(code, err, "method 'dynamic_yarn' cannot be exported", "kv_consistent")
    assert code == 2 and not (tmp_path / "d.gguf").exists()


def test_a_patched_qwen2_checkpoint_exports_and_per_dimension_factors_are_refused(capsys, tmp_path):
    """Issue 51: a Qwen2 checkpoint patched with YaRN exports with llama.cpp's qwen2 keys and its own tokenizer;
    llama3 on it is refused in one line (doctor says the same)."""
    from tests.export.conftest import tiny_tokenizer
    from tests.export.test_gguf_forms import qwen

    source = tmp_path / "qwen"
    qwen("qwen2").save_pretrained(source)
    tiny_tokenizer().save_pretrained(source)
    assert (
        main(["patch", "--model", str(source), "--method", "yarn", "--factor", "4", "--output", str(tmp_path / "y")])
        == 0
    )
    capsys.readouterr()
    code, out, err = run(capsys, "export-gguf", str(tmp_path / "y"), "--output", str(tmp_path / "y.gguf"))
    assert code == 0, err
    assert "scaling.type=yarn scaling.factor=4 scaling.original_context_length=64" in out
    fields = gguf.GGUFReader(tmp_path / "y.gguf").fields
    assert fields["general.architecture"].contents() == "qwen2" and fields["tokenizer.ggml.pre"].contents() == "qwen2"
    code, _, err = run(
        capsys, "export-gguf", str(source), "--output", str(tmp_path / "l.gguf"), "--method", "llama3", "--factor", "4"
    )
    assert_one_line_error(
        code, err, "method 'llama3' cannot be exported to GGUF: llama.cpp's qwen2 architecture takes no per-dimension"
    )
    assert code == 2 and not (tmp_path / "l.gguf").exists()
