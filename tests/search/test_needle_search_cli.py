"""``ropescale search --method self_extend --objective needle`` end to end on a tiny saved model with a
word-level tokenizer that splits digits: it writes its artifacts, records the objective, resumes
without evaluating anything, and refuses a resume with other needle settings."""

from __future__ import annotations

import json
import random

import pytest

from ropescale.cli.main import main
from ropescale.patching.plan import original_spec
from ropescale.search.grid import AttentionSpace
from tests.cli.test_patch_cli import assert_one_line_error
from tests.conftest import squeezed, tiny_model
from tests.search.conftest import word_tokenizer

WORDS = [f"x{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(100)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("needle-search")
    model_dir = root / "tiny"
    tiny_model().save_pretrained(model_dir)
    word_tokenizer(WORDS).save_pretrained(model_dir)
    data = root / "texts"
    data.mkdir()
    for name, seed, n in (("long", 1, 900), ("short", 2, 700)):  # the longest is held out
        rng = random.Random(seed)
        (data / f"{name}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(n)))
    return model_dir, data


def _search(capsys, model_dir, data, out, *extra):
    argv = ["search", "--model", model_dir, "--target-length", 256, "--method", "self_extend"]
    argv += ["--objective", "needle", "--needles", 2, "--budget", 4, "--data", data, "--no-progress"]
    capsys.readouterr()
    code = main([str(a) for a in [*argv, "--output", out, *extra]])
    stdout, err = capsys.readouterr()
    return code, stdout, err


def test_self_extend_needle_search_writes_its_artifacts_and_resumes(capsys, setup, tmp_path):
    model_dir, data = setup
    out = tmp_path / "search"
    code, stdout, err = _search(capsys, model_dir, data, out)
    assert code == 0, err
    for name in ("config.json", "best.json", "history.json", "heldout.json", "report.md", "scaling.yaml"):
        assert (out / name).is_file(), name
    assert not (out / "factors.png").exists()  # Self-Extend keeps the frequencies: no factor plot
    data_h = json.loads((out / "history.json").read_text())
    settings, history = data_h["settings"], data_h["candidates"]
    assert settings["objective"] == "needle" and settings["needle"]["prompts"] == 2
    assert settings["needle"]["depths"] == [0.25, 0.75] and settings["needle"]["length"] == 256
    assert len(history) == 4 and history[0]["origin"] == "seed:self_extend"
    space = AttentionSpace("self_extend", original_spec(tiny_model().config), 4.0)
    for c in history:
        assert c["score"]["objective"] == "needle" and c["score"]["tokens"] == 14  # 2 keys × 7 digits
        assert space.violations(c["params"]) == []
    best = json.loads((out / "best.json").read_text())
    assert best["objective"] == "needle" and best["method"] == "self_extend"
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "ropescale_self_extend"
    assert "objective: needle: answer-token perplexity of 2 needle prompt(s) of 256 tokens" in stdout
    assert "calibration (needle ×2 at 256)" in stdout and "| self_extend |" in squeezed(stdout)

    # the same command again: nothing evaluated, the same report
    before = (out / "history.json").read_text()
    code, again, err = _search(capsys, model_dir, data, out)
    assert code == 0, err
    assert (out / "history.json").read_text() == before
    assert again.split("\nwrote")[0] == stdout.split("\nwrote")[0]

    # other prompts are another objective: refused, like any other setting
    code, _, err = _search(capsys, model_dir, data, out, "--needle-seed", 1)
    assert_one_line_error(code, err, "holds a search with other settings (needle)", "--overwrite")


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--needle-depths", "0.5,2"], "needle depths must be numbers in [0, 1]"),
        (["--needle-depths", "half"], "--needle-depths must be comma-separated numbers"),
        (["--objective", "mixed", "--needle-weight", "2"], "needle weight must be in [0, 1]"),
        (["--needles", "9"], "this search needs 2304"),
    ],
)
def test_bad_needle_options_are_one_line_errors(capsys, setup, tmp_path, argv, fragment):
    model_dir, data = setup
    code, _, err = _search(capsys, model_dir, data, tmp_path / "o", *argv)
    assert_one_line_error(code, err, fragment)
