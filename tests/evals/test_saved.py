"""Saved means saved (issue 39): a checkpoint written by ``ropescale patch`` is evaluated with the
scaling it carries unless a method is asked for; ``--method none`` on it is the unscaled baseline and
says "scaling removed"; every cell records the scaling it ran, read back from the loaded model."""

from __future__ import annotations

import json
import math

import pytest

from ropescale.cli.main import main
from tests.conftest import tiny_model
from tests.training.conftest import char_tokenizer

TEXT = "The cat sat on the mat and looked at the rain, then a dog ran in the park. " * 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Per family: a tiny base checkpoint and the same patched with ``ropescale patch`` (YaRN x4)."""
    root = tmp_path_factory.mktemp("saved")
    (root / "t.txt").write_text(TEXT)
    for arch in ("llama", "mistral", "qwen2", "qwen3"):
        tiny_model(arch, seed=0, attn_implementation="sdpa").save_pretrained(root / arch)
        char_tokenizer().save_pretrained(root / arch)
        argv = ["patch", "--model", root / arch, "--method", "yarn", "--factor", "4", "--output", root / f"{arch}-y4"]
        assert main([str(a) for a in argv]) == 0
    return root


def _ppl(capsys, root, out, model, *extra):
    """Run ``eval perplexity`` at 128 tokens; return (exit code, {label: cell record}, stdout)."""
    capsys.readouterr()
    argv = ["eval", "perplexity", "--model", model, "--data", root / "t.txt", "--lengths", "128"]
    code = main([str(a) for a in [*argv, "--max-tokens", "128", "--output", out, "--no-progress", *extra]])
    text = capsys.readouterr().out
    cells = {}
    for path in sorted((out / "cells").glob("*.json")):
        record = json.loads(path.read_text())
        cells[record["method"]] = record
    return code, cells, text


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_a_patched_folder_is_evaluated_as_saved(folders, tmp_path, capsys, arch):
    code, saved, text = _ppl(capsys, folders, tmp_path / "saved", folders / f"{arch}-y4")
    assert code == 0 and list(saved) == ["yarn x4 (saved)"], saved
    cell = saved["yarn x4 (saved)"]
    assert "The checkpoint carries **yarn x4**" in text
    # read back from the loaded model: method, factor, parameters and the rotary module's attention factor
    assert cell["scaling"]["method"] == "yarn" and cell["scaling"]["factor"] == 4.0 and cell["scaling"]["as"] == "saved"
    assert cell["scaling"]["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert cell["method_name"] == "saved"
    # the same number as the base model with the same method asked for explicitly
    code, asked, _ = _ppl(capsys, folders, tmp_path / "asked", folders / arch, "--method", "yarn", "--factor", "4")
    assert code == 0 and asked["yarn"]["result"]["ppl"] == pytest.approx(cell["result"]["ppl"], rel=1e-6)
    assert asked["yarn"]["scaling"]["as"] == "requested"
    # --method none on the scaled folder: the unscaled baseline, labelled as such, equal to the base model's
    code, removed, text = _ppl(capsys, folders, tmp_path / "none", folders / f"{arch}-y4", "--method", "none")
    assert code == 0 and list(removed) == ["none (scaling removed)"]
    assert removed["none (scaling removed)"]["scaling"]["as"] == "scaling removed"
    assert removed["none (scaling removed)"]["scaling"]["method"] == "default"
    code, base, _ = _ppl(capsys, folders, tmp_path / "base", folders / arch)
    assert code == 0 and list(base) == ["none"] and base["none"]["scaling"]["method"] == "default"
    assert base["none"]["result"]["ppl"] == pytest.approx(removed["none (scaling removed)"]["result"]["ppl"], rel=1e-6)
    assert base["none"]["result"]["ppl"] != pytest.approx(cell["result"]["ppl"], rel=1e-6)  # the test can fail


def test_saved_and_others_in_one_run_give_each_its_own_scaling(folders, tmp_path, capsys):
    """One model is re-patched per method: the saved row after others still runs the saved scaling."""
    model = folders / "llama-y4"
    code, cells, text = _ppl(
        capsys, folders, tmp_path / "all", model, "--methods", "linear,saved,none", "--factor", "4"
    )
    assert code == 0 and set(cells) == {"linear", "yarn x4 (saved)", "none (scaling removed)"}
    assert (
        cells["linear"]["scaling"]["as"] == "replaces saved yarn x4"
        and cells["linear"]["scaling"]["method"] == "linear"
    )
    code, same, _ = _ppl(capsys, folders, tmp_path / "same", model, "--method", "yarn", "--factor", "4")
    assert same["yarn"]["scaling"]["as"] == "same as saved yarn x4"
    code, alone, _ = _ppl(capsys, folders, tmp_path / "alone", model)
    assert alone["yarn x4 (saved)"]["result"]["ppl"] == pytest.approx(same["yarn"]["result"]["ppl"], rel=1e-6)
    assert alone["yarn x4 (saved)"]["result"]["ppl"] == pytest.approx(
        cells["yarn x4 (saved)"]["result"]["ppl"], rel=1e-6
    )
    results = json.loads((tmp_path / "all" / "results.json").read_text())
    assert results["methods"]["yarn x4 (saved)"]["method"] == "yarn" and results["carries"] == "yarn x4"


def _retrieval(folders, tmp_path, task, model, *extra):
    out = tmp_path / f"{task}-{len(list(tmp_path.iterdir()))}"
    argv = ["eval", task, "--model", model, "--lengths", "400", "--depths", "0.5", "--trials", "1"]
    argv += ["--data", folders / "t.txt"] if task == "needle" else []
    assert main([str(a) for a in [*argv, "--output", out, "--no-progress", *extra]]) == 0
    [cell] = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    for key in ("elapsed_s", "tokens_per_second", "seconds"):
        cell["result"].pop(key, None)
    return cell


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_passkey_and_needle_default_to_saved(folders, tmp_path, capsys, task):
    scaled = tmp_path / "y8"  # x8: the 400-token prompts fit its extended context (64 x 8)
    assert main([str(a) for a in ["patch", "--model", folders / "llama", "--factor", "8", "--output", scaled]]) == 0
    saved = _retrieval(folders, tmp_path, task, scaled)
    assert (
        saved["method"] == "yarn x8 (saved)" and saved["scaling"]["factor"] == 8.0 and saved["scaling"]["as"] == "saved"
    )
    asked = _retrieval(folders, tmp_path, task, folders / "llama", "--method", "yarn", "--factor", "8")
    assert asked["result"] == saved["result"]  # every prompt's answer, the same
    removed = _retrieval(folders, tmp_path, task, scaled, "--method", "none")
    assert removed["method"] == "none (scaling removed)" and removed["scaling"]["as"] == "scaling removed"
    assert _retrieval(folders, tmp_path, task, folders / "llama")["result"] == removed["result"]


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--factor", "4"], "--factor/--target-length/--param need a --method"),
        (["--method", "saved", "--param", "beta_fast=16"], "need a --method"),
    ],
)
def test_a_factor_without_a_method_is_refused(folders, tmp_path, capsys, extra, fragment):
    code = main(
        [str(a) for a in ["eval", "perplexity", "--model", folders / "llama-y4", "--lengths", "64", *extra]]
        + ["--output", str(tmp_path / "x")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0]


def test_frontier_measures_a_scaled_checkpoint_as_saved_and_without_its_scaling(model_dir, tmp_path, capsys):
    scaled = tmp_path / "y2"
    assert main(["patch", "--model", str(model_dir), "--factor", "2", "--output", str(scaled)]) == 0
    data = tmp_path / "text.txt"
    data.write_text("It is a truth universally acknowledged, that a single man must be in want of a wife. " * 80)
    out = tmp_path / "frontier"
    argv = ["eval", "frontier", "--model", str(scaled), "--target-length", "512", "--methods", "yarn"]
    argv += ["--data", str(data), "--depths", "0.5", "--max-tokens", "64", "--output", str(out), "--no-progress"]
    assert main([*argv, "--verbose"]) == 0
    text = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["methods"]["yarn x2 (saved)"] == {
        **results["methods"]["yarn x2 (saved)"],
        "method": "yarn",
        "factor": 2.0,
        "as": "saved",
    }
    assert results["methods"]["none (scaling removed)"]["method"] == "none"
    ppl = results["tasks"]["perplexity"]  # the saved row is yarn x2 exactly: the yarn candidate at N / L = 2
    assert {n: r["ppl"] for n, r in ppl["yarn x2 (saved)"].items()} == {n: r["ppl"] for n, r in ppl["yarn"].items()}
    assert "yarn x2 (saved)" in text and "scaling removed" in (out / "report.md").read_text()


def test_recommend_reads_a_saved_row_as_the_scaling_it_ran(folders, tmp_path, capsys):
    """recommend's evidence (``load_results``): the saved row is the method its cells read back, the
    `none (scaling removed)` row the native baseline."""
    from ropescale.evals.advice.evidence import load_results

    out = tmp_path / "both"
    model = folders / "llama-y4"
    assert _ppl(capsys, folders, out, model, "--methods", "saved,none")[0] == 0
    ev = load_results(out / "results.json")
    rows = {r.label: r for r in ev.rows}
    assert rows["yarn x4 (saved)"].method == "yarn" and rows["yarn x4 (saved)"].factor == 4.0
    assert rows["none (scaling removed)"].method == "default"
    assert ev.find("default") is rows["none (scaling removed)"]


def test_a_checkpoint_scaled_by_its_authors_is_evaluated_as_saved(folders, tmp_path, capsys):
    """A config that carries YaRN x4 in rope_parameters without ropescale's block (as Qwen ships its 128k
    setting): the saved row reads it back, and after other methods ran on the model it is restored."""
    authors = tmp_path / "qwen2-yarn"
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    tiny_model(
        "qwen2", seed=0, attn_implementation="sdpa", max_position_embeddings=256, rope_parameters=rope
    ).save_pretrained(authors)
    char_tokenizer().save_pretrained(authors)
    code, alone, text = _ppl(capsys, folders, tmp_path / "alone", authors)
    assert code == 0 and list(alone) == ["yarn x4 (saved)"] and alone["yarn x4 (saved)"]["scaling"]["method"] == "yarn"
    code, cells, _ = _ppl(capsys, folders, tmp_path / "all", authors, "--methods", "linear,saved,none", "--factor", "4")
    assert code == 0
    assert cells["yarn x4 (saved)"]["result"]["ppl"] == pytest.approx(
        alone["yarn x4 (saved)"]["result"]["ppl"], rel=1e-6
    )
    assert cells["none (scaling removed)"]["scaling"]["method"] == "default"
    code, base, _ = _ppl(capsys, folders, tmp_path / "base", folders / "qwen2")
    assert base["none"]["result"]["ppl"] == pytest.approx(cells["none (scaling removed)"]["result"]["ppl"], rel=1e-6)


def test_from_pretrained_takes_saved_as_the_checkpoints_own_scaling(folders):
    import ropescale
    from ropescale.patching.readback import scaling_of

    model = ropescale.from_pretrained(folders / "llama-y4", method="saved")
    assert scaling_of(model)["method"] == "yarn" and scaling_of(model)["factor"] == 4.0
    removed = ropescale.from_pretrained(folders / "llama-y4", method="none", replace=True)
    assert scaling_of(removed)["method"] == "default" and scaling_of(removed)["attention_factor"] == 1.0
