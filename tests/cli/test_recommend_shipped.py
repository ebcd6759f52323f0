"""`recommend` and `patch` on checkpoints that arrive already extended (issue 51), from their Hub config.json.

Before: on Llama 3.1 `recommend --target-length 64k` answered "yarn ×8, training-free" with `--replace` (throwing
away the shipped 128k scaling for a length the model serves), and the README's own `patch` line failed
("model is already scaled ... pass --replace")."""

from __future__ import annotations

from pathlib import Path

from ropescale.cli.main import main

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


def answer(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_target_the_model_serves_as_shipped_is_already_covered(capsys):
    code, out, _ = answer(capsys, "recommend", "--model", str(SHAPES / "llama3.1-8b"), "--target-length", "64k")
    assert code == 0
    assert out.startswith("recommendation:  none needed: ") and "serves 131,072 tokens as shipped (llama3 x8" in out
    assert f"ropescale eval passkey --model {SHAPES / 'llama3.1-8b'} --lengths 65536" in out
    assert "yarn" not in out


def test_past_the_shipped_context_it_composes_on_llama3(capsys):
    model = str(SHAPES / "llama3.1-8b")
    code, out, _ = answer(capsys, "recommend", "--model", model, "--target-length", "512k")
    assert code == 0
    assert "131,072 → 524,288 tokens, ×4" in out
    assert "starts:    on top of the shipped llama3 x8 (trained with it: family table: Llama 3.1/3.3)" in out
    patch = next(line.strip() for line in out.splitlines() if line.strip().startswith("ropescale patch"))
    assert "--target-length 524288 --compose" in patch and "--replace" not in patch


def test_qwens_switch_is_replaced_from_its_pretraining_context(capsys):
    code, out, _ = answer(capsys, "recommend", "--model", str(SHAPES / "qwen3-8b-yarn"), "--target-length", "256k")
    assert code == 0
    assert "32,768 → 262,144 tokens, ×8" in out and "replacing the shipped yarn x4 (applied without training" in out


def test_the_readme_patch_line_composes_on_llama31_and_says_so(capsys):
    code, out, err = answer(
        capsys, "patch", "--model", str(SHAPES / "llama3.1-8b"), "--method", "yarn", "--target-length", "512k"
    )
    assert code == 0, err
    assert "method:             yarn x4 on llama3 x8 (factor 4)" in out
    assert "context:            131072 -> 524288 tokens" in out
    assert "starts:             composed on the shipped llama3 x8 (trained with it: family table: Llama 3.1/3.3)" in out


def test_a_scaling_nothing_vouches_for_is_asked_about_in_one_line(capsys, tmp_path):
    import json

    data = json.loads((SHAPES / "llama3.1-8b" / "config.json").read_text())
    data["rope_scaling"]["original_max_position_embeddings"] = 4096  # no family row matches
    (tmp_path / "config.json").write_text(json.dumps(data))
    code, out, err = answer(capsys, "recommend", "--model", str(tmp_path), "--target-length", "512k")
    assert code == 2 and "pass --compose to build on it" in err and len(err.strip().splitlines()) == 1
    code, out, err = answer(capsys, "recommend", "--model", str(tmp_path), "--target-length", "512k", "--compose")
    assert code == 0 and "×4" in out


def test_the_fine_tune_is_the_familys_recipe_for_the_target(capsys):
    """Before: Llama 3.1 at 256k/512k pointed to llama2-7b/pose_yarn_x8 with a factor from another context."""
    model = str(SHAPES / "llama3.1-8b")
    code, out, _ = answer(capsys, "recommend", "--model", model, "--target-length", "512k", "--budget", "fine-tune")
    assert code == 0
    assert "fine-tune (its family's recipe for 524,288; replaces the shipped scaling):" in out
    assert f"ropescale train --config llama3.1-8b/ultralong_yarn_x64_512k model.name={model}" in out
    assert "llama2-7b" not in out
