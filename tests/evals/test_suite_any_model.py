"""Any suite on any model (issue 39): ``ropescale eval suite NAME --model PATH [--target-length N]``
runs a shipped suite on the user's checkpoint, with lengths relative to its trained context; and
the suite-file checks of issue 42 (clashing cell names, duplicate keys, path-like names)."""

from __future__ import annotations

import json

import pytest
import yaml

from ropescale.cli.main import main
from ropescale.evals.suite.parse import SuiteError, load_suite, suite_from_dict
from tests.conftest import tiny_model

TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife. The quick brown fox jumps over the lazy dog 12345 times. "
) * 80


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, bytelevel_tokenizer):
    """A tiny random model of each family, trained context L = 128, with a tokenizer, as folders."""
    root = tmp_path_factory.mktemp("families")
    (root / "t.txt").write_text(TEXT)
    for arch in ("llama", "mistral", "qwen2", "qwen3"):
        model = tiny_model(
            arch, vocab_size=len(bytelevel_tokenizer), max_position_embeddings=128, attn_implementation="sdpa"
        )
        model.save_pretrained(root / arch)
        bytelevel_tokenizer.save_pretrained(root / arch)
    big = tiny_model("llama", vocab_size=len(bytelevel_tokenizer), max_position_embeddings=512)
    big.save_pretrained(root / "llama-512")
    bytelevel_tokenizer.save_pretrained(root / "llama-512")
    return root


def test_relative_lengths_resolve_to_each_models_trained_context(family_dirs):
    small = load_suite("extend-check", model=str(family_dirs / "llama"))  # L = 128, target 4L
    assert small.perplexity["lengths"] == [32, 128, 256, 512] and small.passkey["lengths"] == [128, 256, 512]
    assert small.target_length == 512
    assert {m.label: m.factor for m in small.methods}["yarn"] == 4.0
    big = load_suite("extend-check", model=str(family_dirs / "llama-512"), target_length=4096)
    assert big.perplexity["lengths"] == [128, 512, 1024, 4096] and big.passkey["lengths"] == [512, 1024, 4096]
    assert {m.label: m.factor for m in big.methods}["yarn"] == 8.0


def test_a_shipped_suite_runs_on_a_users_model(family_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["eval", "suite", "extend-check", "--model", family_dirs / "llama", "--target-length", "256"]
    code = main([str(a) for a in [*argv, "--data", family_dirs / "t.txt", "--output", out, "--no-progress"]])
    text = capsys.readouterr().out
    assert code == 0, text
    written = yaml.safe_load((out / "suite.yaml").read_text())
    assert written["model"] == str(family_dirs / "llama") and written["perplexity"]["lengths"] == [32, 128, 256]
    labels = [m["label"] for m in written["methods"]]
    assert labels == ["none", "yarn", "dynamic_ntk", "ntk"]  # unscaled: `saved` is `none`, run once
    cells = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    assert len(cells) == 4 * (3 + 2) and all(c["scaling"]["as"] == "requested" for c in cells)
    assert {c["scaling"]["factor"] for c in cells if c["method"] == "yarn"} == {2.0}


SMALL = """name: small
data: DATA
target_length: 2L
methods: [saved, none, {method: yarn, factor: target/L}]
perplexity: {lengths: [L/4, L, target], mode: nonoverlap}
passkey: {lengths: [target], depths: [0.5], trials: 1}
"""


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_a_relative_suite_runs_on_each_family_scaled_or_not(family_dirs, tmp_path, capsys, arch):
    """The same file on a plain checkpoint and on one patched with YaRN x2: on the patched one the saved
    row runs its own scaling (equal to yarn x2 asked for), none removes it, L is the original context."""
    suite = tmp_path / "small.yaml"
    suite.write_text(SMALL.replace("DATA", str(family_dirs / "t.txt")))
    scaled = tmp_path / "y2"
    assert main([str(a) for a in ["patch", "--model", family_dirs / arch, "--factor", "2", "--output", scaled]]) == 0
    ppl = {}
    for model in (family_dirs / arch, scaled):
        out = tmp_path / model.name
        code = main([str(a) for a in ["eval", "suite", suite, "--model", model, "--output", out, "--no-progress"]])
        assert code == 0, capsys.readouterr()
        written = yaml.safe_load((out / "suite.yaml").read_text())
        assert written["perplexity"]["lengths"] == [32, 128, 256] and written["passkey"]["lengths"] == [256]
        results = json.loads((out / "results.json").read_text())
        ppl[model.name] = {label: rows["256"]["ppl"] for label, rows in results["tasks"]["perplexity"].items()}
    assert set(ppl[arch]) == {"none", "yarn"}
    assert set(ppl["y2"]) == {"yarn x2 (saved)", "none (scaling removed)", "yarn"}
    assert ppl["y2"]["yarn x2 (saved)"] == pytest.approx(ppl[arch]["yarn"], rel=1e-6)
    assert ppl["y2"]["none (scaling removed)"] == pytest.approx(ppl[arch]["none"], rel=1e-6)


def test_the_embedded_model_stays_the_default():
    from ropescale.evals.suite.parse import SUITES_DIR

    assert yaml.safe_load((SUITES_DIR / "extend-check.yaml").read_text())["model"] == "smollm2-135m"
    assert load_suite("smollm2-x4").model == "smollm2-135m"  # no --model: the suite's own


def _write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = "model: MODEL\ndata: DATA\nmethods: [none]\nperplexity: {lengths: [64]}\n"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("name: a\nname: b\n" + BASE, "key 'name' is given twice (lines 1 and 2)"),
        (
            BASE.replace("methods: [none]", "methods:\n  - {method: yarn, factor: 2, factor: 4}"),
            "key 'factor' is given twice (lines 4 and 4)",
        ),
        ("name: ../../x\n" + BASE, "name '../../x' of suite"),
        ("name: /tmp/x\n" + BASE, "must be one folder name"),
        (
            BASE.replace(
                "methods: [none]",
                "methods:\n  - {method: yarn, factor: 2, label: 'x y'}\n  - {method: linear, factor: 2, label: x-y}",
            ),
            "method labels 'x y' and 'x-y' of suite",
        ),
        (BASE.replace("[64]", "[target]"), "relative to the target length: give --target-length"),
        (
            BASE.replace("methods: [none]", "methods: [{method: yarn, factor: 2/L}]"),
            "a factor is a number, target/L or target/S",
        ),
        (BASE.replace("methods: [none]", "methods: [{method: saved, factor: 2}]"), "'saved' runs the checkpoint's own"),
    ],
)
def test_bad_suite_files_are_refused_in_one_line(family_dirs, tmp_path, capsys, text, fragment):
    path = _write(
        tmp_path, text.replace("MODEL", str(family_dirs / "llama")).replace("DATA", str(family_dirs / "t.txt"))
    )
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    code = main(["eval", "suite", str(path), "--output", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_target_length_for_a_suite_without_target_is_refused(family_dirs, tmp_path):
    path = _write(
        tmp_path, BASE.replace("MODEL", str(family_dirs / "llama")).replace("DATA", str(family_dirs / "t.txt"))
    )
    with pytest.raises(SuiteError, match="gives no length or factor relative to 'target'"):
        load_suite(path, target_length=1024)
    with pytest.raises(SuiteError, match="within the model's trained context 128"):
        load_suite("extend-check", model=str(family_dirs / "llama"), target_length=100)


def test_labels_that_clash_as_file_names_are_refused_for_dicts_too():
    raw = {
        "methods": [{"method": "none", "label": "a/b"}, {"method": "none", "label": "a b"}],
        "passkey": {"lengths": [64]},
    }
    with pytest.raises(SuiteError, match="both write cells named 'a-b__...'"):
        suite_from_dict(raw)


def test_saved_that_runs_as_another_rows_label_is_refused(family_dirs, tmp_path, capsys):
    """On an unscaled model `saved` is `none`: beside a row labelled `none` that is something else, refuse."""
    text = BASE.replace("methods: [none]", "methods: [saved, {method: yarn, factor: 2, label: none}]")
    path = _write(
        tmp_path, text.replace("MODEL", str(family_dirs / "llama")).replace("DATA", str(family_dirs / "t.txt"))
    )
    code = main(["eval", "suite", str(path), "--output", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "methods 'saved' and 'none' both run as 'none' on model" in lines[0] and "(unscaled)" in lines[0]
    assert not (tmp_path / "out").exists()
