"""``ropescale search`` and ``ropescale patch --from-search`` in process, on a tiny saved model with
a word-level tokenizer and made-up texts; bad input is one line on stderr."""

from __future__ import annotations

import json
import random

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import ropescale
from ropescale.cli.main import main
from tests.cli.test_patch_cli import assert_one_line_error
from tests.conftest import squeezed, tiny_model

WORDS = [f"w{i}" for i in range(100)]


def _text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS[: 20 + seed * 30]) for _ in range(n))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-search")
    vocab = {"<unk>": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>")
    model_dir = root / "tiny"
    tiny_model().save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = root / "texts"
    data.mkdir()
    (data / "long.txt").write_text(_text(1, 900))  # the longest: held out
    (data / "short.txt").write_text(_text(2, 600))  # the next: calibration
    return root, model_dir, data


def run(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _search(capsys, model_dir, data, out, *extra):
    return run(
        capsys,
        "search",
        "--model",
        model_dir,
        "--target-length",
        256,
        "--eval-length",
        128,
        "--budget",
        5,
        "--data",
        data,
        "--report-lengths",
        256,
        "--no-progress",
        "--output",
        out,
        *extra,
    )


def test_search_then_patch_from_search(capsys, setup, tmp_path):
    root, model_dir, data = setup
    out = tmp_path / "search"
    code, stdout, err = _search(capsys, model_dir, data, out)
    assert code == 0, err
    assert "calibration: 1 window(s) × 128 tokens" in stdout and "on 'short'" in stdout and "'long'" in stdout
    assert "| searched |" in squeezed(stdout) and "| yarn |" in squeezed(stdout) and "held-out 256" in stdout
    for name in ("config.json", "best.json", "history.json", "heldout.json", "report.md", "factors.png"):
        assert (out / name).is_file(), name

    # resuming with the same flags evaluates nothing and prints the same table
    code, again, err = _search(capsys, model_dir, data, out)
    assert code == 0, err
    assert again.split("\nwrote")[0] == stdout.split("\nwrote")[0]

    # the summary, then a full checkpoint that plain transformers loads
    code, summary, err = run(capsys, "patch", "--model", model_dir, "--from-search", out)
    assert code == 0, err
    assert "method:             longrope (factor 4" in summary and "64 -> 256 tokens" in summary
    ckpt = tmp_path / "ckpt"
    code, _, err = run(capsys, "patch", "--model", model_dir, "--from-search", out, "--output", ckpt)
    assert code == 0, err
    best = json.loads((out / "best.json").read_text())
    plain = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    direct = ropescale.patch(tiny_model(), "longrope", **best["params"])
    ids = torch.randint(2, 102, (1, 200))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-5)
    assert plain.config.rope_parameters["long_factor"] == best["params"]["long_factor"]


def test_search_yarn_method(capsys, setup, tmp_path):
    _, model_dir, data = setup
    code, _, err = _search(capsys, model_dir, data, tmp_path / "s", "--method", "yarn", "--baselines", "yarn")
    assert code == 0, err
    assert json.loads((tmp_path / "s" / "config.json").read_text())["rope_parameters"]["rope_type"] == "yarn"


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["--target-length", "64"], ["target length 64 must exceed the model's original context 64"]),
        (["--target-length", "256", "--eval-length", "32"], ["eval length 32 must exceed the original context 64"]),
        (["--target-length", "256", "--budget", "0"], ["budget must be an integer >= 1"]),
        (["--target-length", "256", "--method", "linear"], ["invalid choice: 'linear'"]),
        (["--target-length", "256", "--attention-factor", "often"], ["attention must be"]),
        (["--target-length", "256", "--data-doc", "missing"], ["no document titled 'missing'"]),
        (["--target-length", "9999"], ["has", "tokens; this search needs 9999"]),
        (["--target-length", "256", "--device", "cuda"], ["torch sees no CUDA device"]),
        (["--target-length", "256", "--attn-implementation", "flash_attention_2"], ["CUDA device only"]),
    ],
)
def test_bad_search_input(capsys, setup, tmp_path, argv, fragments, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the no-GPU messages, on any machine
    _, model_dir, data = setup
    code, _, err = run(capsys, "search", "--model", model_dir, "--data", data, "--output", tmp_path / "o", *argv)
    assert_one_line_error(code, err, *fragments)


def test_resume_with_other_settings_is_refused(capsys, setup, tmp_path):
    _, model_dir, data = setup
    out = tmp_path / "s"
    assert _search(capsys, model_dir, data, out, "--budget", 3, "--baselines", "yarn")[0] == 0
    code, _, err = _search(capsys, model_dir, data, out, "--budget", 3, "--baselines", "yarn", "--seed", 1)
    assert_one_line_error(code, err, "holds a search with other settings (seed)", "--overwrite")
    code, _, err = _search(
        capsys, model_dir, data, out, "--budget", 3, "--baselines", "yarn", "--seed", 1, "--overwrite"
    )
    assert code == 0, err


def test_patch_from_search_errors(capsys, setup, tmp_path):
    _, model_dir, _ = setup
    code, _, err = run(capsys, "patch", "--model", model_dir, "--from-search", tmp_path)
    assert_one_line_error(code, err, "is not a search output")
    code, _, err = run(capsys, "patch", "--model", model_dir, "--from-search", tmp_path, "--factor", "4")
    assert_one_line_error(code, err, "--from-search sets the method, factor and parameters; drop --factor")


@pytest.mark.parametrize("short", ["long", "original"])
def test_short_flag_reaches_the_search(monkeypatch, tmp_path, short):
    seen = {}

    def fake_job(options, output, overwrite=False, progress=True):
        seen["short"] = options.short
        raise SystemExit(0)

    monkeypatch.setattr("ropescale.search.run_search_job", fake_job)
    with pytest.raises(SystemExit):
        main(["search", "--target-length", "32768", "--short", short, "--output", str(tmp_path / "s")])
    assert seen == {"short": short}


def test_search_on_a_scaled_checkpoint_reports_it_as_saved_and_none_as_scaling_removed(capsys, setup, tmp_path):
    """Issue 39: a folder written by `ropescale patch` is measured as saved beside the baselines, and its
    `none` row (the original RoPE) says so; each held-out cell records the scaling it ran."""
    root, model_dir, data = setup
    scaled = tmp_path / "y4"
    assert run(capsys, "patch", "--model", model_dir, "--factor", "4", "--output", scaled)[0] == 0
    code, out, err = _search(capsys, scaled, data, tmp_path / "s", "--baselines", "none,yarn")
    assert code == 0, err
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    labels = [row["label"] for row in report["rows"]]
    assert labels == ["searched", "yarn x4 (saved)", "none (scaling removed)", "yarn"]
    cells = report["heldout_cells"]
    assert cells["saved@contiguous-256"]["scaling"]["method"] == "yarn"
    assert cells["saved@contiguous-256"]["scaling"]["factor"] == 4.0
    assert cells["none@contiguous-256"]["scaling"]["method"] == "default"
    # the saved row is yarn x4 exactly: the same held-out number as yarn x4 asked for
    assert cells["saved@contiguous-256"]["ppl"] == pytest.approx(cells["yarn@contiguous-256"]["ppl"], rel=1e-6)
    assert "yarn x4 (saved)" in out and "none (scaling removed)" in out
