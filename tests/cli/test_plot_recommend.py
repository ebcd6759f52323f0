"""``ropescale plot``, ``ropescale recommend`` and ``--target-length``, in process on a tiny model dir."""

from __future__ import annotations

import json

import pytest
import yaml

from ropescale.cli.main import build_parser
from ropescale.methods import RotarySpec, get_method
from ropescale.plots.frequencies import curve_count, plot_frequencies
from tests.cli.test_patch_cli import assert_one_line_error, run
from tests.conftest import tiny_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPEC = RotarySpec(head_dim=64, base=1e5, original_max_position_embeddings=8192)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny-llama"  # L = 64, head_dim 16: 8 rotary pairs
    tiny_model().save_pretrained(path)
    return path


# -- plot: library ------------------------------------------------------------------------------


@pytest.mark.parametrize("names", [["linear"], ["linear", "ntk", "yarn", "llama3"], ["dynamic_ntk", "dynamic_yarn"]])
def test_plot_has_one_curve_per_method_plus_the_original(names, tmp_path):
    path = tmp_path / "sub" / "freq.png"
    fig = plot_frequencies(SPEC, [get_method(n, factor=4) for n in names], path)
    assert curve_count(fig) == 1 + len(names)
    assert path.read_bytes().startswith(PNG_MAGIC) and path.stat().st_size > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["freq.png"]  # no temporary file left behind
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "original RoPE" in labels


def test_plot_curves_are_the_method_wavelengths_and_yarn_bands_are_shaded():
    yarn = get_method("yarn", factor=4)
    fig = plot_frequencies(SPEC, [get_method("default"), yarn], metric="wavelength")
    ax = fig.axes[0]
    curves = [line for line in ax.get_lines() if line.get_gid() == "ropescale-curve"]
    assert len(curves) == 2  # default adds nothing to the original curve
    inv_freq, _ = yarn.compute(SPEC)
    assert curves[1].get_ydata()[-1] == pytest.approx(2 * 3.141592653589793 / float(inv_freq[-1]))
    bands = [p.get_label() for p in ax.patches]
    # SmolLM2 geometry: correction range 10..20 (pairs 0-10 kept, 11-19 blended, 20-31 interpolated)
    assert bands == [
        "YaRN kept: pairs 0–10, ≥ 32 turns in L",
        "YaRN blended: pairs 11–19",
        "YaRN interpolated: pairs 20–31, ≤ 1 turn in L",
    ]
    context_lines = sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_gid() == "context")
    assert context_lines == [8192, 32768]


def test_plot_rotations_and_no_bands_without_yarn():
    fig = plot_frequencies(SPEC, [get_method("linear", factor=2)], metric="rotations")
    ax = fig.axes[0]
    assert not ax.patches
    original, linear = [line.get_ydata() for line in ax.get_lines() if line.get_gid() == "ropescale-curve"]
    assert linear[0] == pytest.approx(original[0] / 2)  # turns over L halve
    with pytest.raises(ValueError, match="metric must be one of"):
        plot_frequencies(SPEC, [], metric="hertz")


# -- plot: CLI ----------------------------------------------------------------------------------


def test_plot_cli_writes_png_and_prints_its_path(capsys, model_dir, tmp_path):
    out = tmp_path / "freq.png"
    code, stdout, err = run(
        capsys,
        "plot",
        "--model",
        str(model_dir),
        "--methods",
        "none,linear,ntk,yarn,llama3",
        "--factor",
        "4",
        "--output",
        str(out),
    )
    assert code == 0, err
    assert stdout.strip() == str(out)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_plot_cli_target_length_and_rotations(capsys, model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, err = run(
        capsys,
        "plot",
        "--model",
        str(model_dir),
        "--methods",
        "yarn,llama3",
        "--target-length",
        "200",
        "--metric",
        "rotations",
        "--param",
        "beta_fast=16",
    )
    assert code == 0, err
    assert (tmp_path / stdout.strip()).read_bytes().startswith(PNG_MAGIC)  # default name, current folder


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--methods", "linear,yarm", "--factor", "4"], ["unknown method 'yarm'", "did you mean 'yarn'"]),
        (["--methods", "linear", "--factor", "4", "--target-length", "256"], ["not allowed with argument"]),
        (["--methods", "yarn", "--target-length", "64"], ["target length 64 is not beyond", "trained context 64"]),
        (["--methods", "yarn"], ["required: --factor"]),
        (["--methods", "yarn,pi,linear", "--factor", "4"], ["'linear' is listed twice"]),
        (["--methods", "linear", "--factor", "4", "--param", "beta_fast=8"], ["no listed method has a parameter"]),
        (["--methods", "yarn", "--factor", "4", "--metric", "hz"], ["invalid choice: 'hz'"]),
    ],
)
def test_plot_cli_errors_are_one_line(capsys, model_dir, tmp_path, argv, fragments):
    code, _, err = run(capsys, "plot", "--model", str(model_dir), "--output", str(tmp_path / "x.png"), *argv)
    assert code == 2
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "x.png").exists()


# -- --target-length in patch and eval ----------------------------------------------------------


def test_patch_cli_target_length(capsys, model_dir):
    code, out, err = run(capsys, "patch", "--model", str(model_dir), "--method", "llama3", "--target-length", "200")
    assert code == 0, err
    assert "method:             llama3 (factor 4" in out and "context:            64 -> 256 tokens" in out


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["--factor", "4", "--target-length", "256"], ["argument --target-length: not allowed with argument --factor"]),
        (["--target-length", "32"], ["target length 32 is not beyond the model's trained context 64"]),
        (["--target-length", "0"], ["expected a positive integer"]),
        (["--method", "none", "--target-length", "256"], ["does not scale"]),
        (["--method", "nope", "--target-length", "256"], ["unknown method 'nope'"]),
    ],
)
def test_patch_cli_target_length_errors(capsys, model_dir, argv, fragments):
    code, _, err = run(capsys, "patch", "--model", str(model_dir), *argv)
    assert code == 2
    assert_one_line_error(code, err, *fragments)


def test_eval_target_length_resolves_a_factor_per_method(model_dir):
    from ropescale.cli.eval import suite_from_args

    args = build_parser().parse_args(
        [
            "eval",
            "perplexity",
            "--model",
            str(model_dir),
            "--methods",
            "none,linear,llama3",
            "--target-length",
            "200",
            "--lengths",
            "128,200",
        ]
    )
    factors = {m["method"]: m.get("factor") for m in suite_from_args(args)["methods"]}
    assert factors == {"none": None, "linear": 200 / 64, "llama3": 4.0}


def test_eval_target_length_errors_are_one_line(capsys, model_dir):
    code, _, err = run(
        capsys,
        "eval",
        "passkey",
        "--model",
        str(model_dir),
        "--method",
        "yarn",
        "--target-length",
        "64",
        "--lengths",
        "64",
    )
    assert_one_line_error(code, err, "not beyond")
    code, _, err = run(
        capsys,
        "eval",
        "passkey",
        "--model",
        str(model_dir),
        "--method",
        "yarn",
        "--factor",
        "2",
        "--target-length",
        "256",
        "--lengths",
        "64",
    )
    assert_one_line_error(code, err, "not allowed with argument --factor")


# -- recommend ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, headline, command",
    [
        (64, "recommendation:  none", None),
        (128, "recommendation:  dynamic_ntk ×2, training-free", "--method dynamic_ntk --target-length 128"),
        (96, "recommendation:  dynamic_ntk ×1.5, training-free", "--method dynamic_ntk --target-length 96"),
        (256, "recommendation:  yarn ×4, training-free", "--method yarn --target-length 256"),
        (1024, "recommendation:  yarn ×16, then fine-tune (PoSE)", "--method yarn --target-length 1024"),
    ],
)
def test_recommend(capsys, model_dir, tmp_path, monkeypatch, target, headline, command):
    monkeypatch.chdir(tmp_path)  # no runs/ here: the shipped measurements are the evidence
    code, out, err = run(capsys, "recommend", "--model", str(model_dir), "--target-length", str(target), "--verbose")
    assert code == 0, err
    assert "head_dim 16, base 10000, trained context 64" in out
    assert headline in out
    if command is None:
        assert "no scaling needed" in out and "ropescale patch" not in out
        return
    assert f"ropescale patch --model {model_dir} {command}" in out
    assert "expected trade-off" in out and "evidence: evals/measured/smollm2-135m" in out  # a shipped file
    assert "measured with: ropescale eval suite smollm2-" in out  # its command beside it
    if target == 256:
        assert "attention_factor=1.0 gives passkey 100%, 100% at 4k/16k (default 0%, 100%)" in out
        assert "--param attention_factor=1.0" in out
    if target == 1024:
        assert "PoSE" in out and "pose.target_length=1024" in out and "scaling.factor=16" in out


@pytest.mark.parametrize("target", [64, 128, 256, 1024])
def test_recommend_answers_first(capsys, model_dir, tmp_path, monkeypatch, target):
    """The default output is the answer in at most 15 lines: the method, one line of why, the commands;
    --verbose adds the evidence, --json the whole record."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "recommend", "--model", str(model_dir), "--target-length", str(target))
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= 15, out
    assert lines[0].startswith("recommendation:  ") and out.count("why:") == 1
    assert "evidence:" not in out and "measured with:" not in out
    if target > 64:
        assert f"ropescale patch --model {model_dir} --method" in out and "--verbose" in out
    code, verbose, _ = run(capsys, "recommend", "--model", str(model_dir), "--target-length", str(target), "--verbose")
    assert code == 0 and len(verbose.splitlines()) > len(out.splitlines())
    code, raw, _ = run(capsys, "recommend", "--model", str(model_dir), "--target-length", str(target), "--json")
    record = json.loads(raw)
    assert code == 0 and record["target_length"] == target and record["why"] and "reasons" in record
    if target > 64:
        assert record["evidence"] and record["commands"][0]["command"].startswith("ropescale ")


def test_recommend_budget(capsys, model_dir):
    code, out, _ = run(
        capsys,
        "recommend",
        "--model",
        str(model_dir),
        "--target-length",
        "1024",
        "--budget",
        "training-free",
        "--verbose",
    )
    assert code == 0 and "yarn ×16, training-free" in out and "fine-tune is strongly recommended" in out
    code, out, _ = run(
        capsys, "recommend", "--model", str(model_dir), "--target-length", "128", "--budget", "fine-tune"
    )
    assert code == 0 and "yarn ×2, then fine-tune" in out
    code, _, err = run(capsys, "recommend", "--model", str(model_dir), "--target-length", "128", "--budget", "lots")
    assert_one_line_error(code, err, "invalid choice: 'lots'")
    code, _, err = run(capsys, "recommend", "--model", str(model_dir))
    assert_one_line_error(code, err, "required: --target-length")


def test_recommend_reads_results_of_the_same_model(capsys, model_dir, tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "tiny-x4"
    run_dir.mkdir(parents=True)
    (run_dir / "suite.yaml").write_text(
        yaml.safe_dump(
            {
                "methods": [
                    {"label": "none", "method": "none", "factor": None, "params": {}},
                    {"label": "dyn", "method": "dynamic", "factor": 4, "params": {}},
                    {"label": "yarn", "method": "yarn", "factor": 4, "params": {}},
                ]
            }
        )
    )
    ppl = {"none": {"32": 10.0, "256": 900.0}, "dyn": {"32": 10.0, "256": 20.0}, "yarn": {"32": 11.0, "256": 12.5}}
    (run_dir / "results.json").write_text(
        json.dumps(
            {
                "suite": "tiny-x4",
                "model": str(model_dir),
                "dtype": "float32",
                "cells_finished": 6,
                "cells_total": 6,
                "tasks": {
                    "perplexity": {lb: {n: {"ppl": v} for n, v in rows.items()} for lb, rows in ppl.items()},
                    "passkey": {"yarn": {"256": {"accuracy": [[1.0, 0.5]]}}},
                },
            }
        )
    )
    other = tmp_path / "runs" / "other-model"
    other.mkdir()
    (other / "results.json").write_text(
        json.dumps({"model": "someone/else", "tasks": {"perplexity": {"yarn": {"32": {"ppl": 99.0}}}}})
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "recommend", "--model", str(model_dir), "--target-length", "256", "--verbose")
    assert code == 0, err
    source = str(__import__("pathlib").Path("runs/tiny-x4/results.json"))
    assert f"short inputs: PPL 11.00 at 32 vs 10.00 unscaled (+10%; yarn ×4, {source})" in out
    assert f"long inputs: PPL 12.50 at 256 (yarn ×4) vs dyn 20.00, none 900.00 ({source})" in out
    assert "passkey: 75% at 256 (yarn ×4" in out
    assert "someone/else" not in out and "99.0" not in out
    # the run has no attention_factor=1.0 row: that trade-off still comes from the shipped measurements
    assert "attention_factor=1.0 gives passkey" in out and "evidence: evals/measured/smollm2-135m.json" in out
    assert f"evidence: {source}" in out


def test_the_fine_tune_keeping_retrieval_is_named_by_the_shipped_recipe_that_trains_it():
    from ropescale.cli.recommend import _as_shipped_recipe

    keys = "model.name=smollm2-135m scaling.method=yarn scaling.factor=4 pose.enabled=true pose.target_length=32768"
    base = f"ropescale train --config smollm2-135m/yarn_x4 {keys}"
    commands = [("fine-tune (PoSE)", base)]
    variant = "data.recall_facts=4 optim.lr=1.0e-4 'scaling.params={attention_factor: 1.07}'"
    named = _as_shipped_recipe(f"{base} {variant}", commands)
    assert named == f"ropescale train --config smollm2-135m/yarn_x4_recall {keys}"
    for other in (  # no shipped recipe trains these: the overrides stay
        "data.recall_facts=4 'scaling.params={attention_factor: 1.07}'",  # the recall recipe's rate is 1e-4
        f"{variant} train.max_steps=400",  # longer than any recipe
    ):
        assert _as_shipped_recipe(f"{base} {other}", commands) == f"{base} {other}"
    assert _as_shipped_recipe(base, commands) == base  # the recipe itself, not another name for it
    assert _as_shipped_recipe("ropescale patch --model m", commands) == "ropescale patch --model m"
    quoted = [("fine-tune (PoSE)", base.replace("smollm2-135m ", "/tmp/it's "))]  # a path the shell cannot read back
    assert _as_shipped_recipe(f"{quoted[0][1]} {variant}", quoted) == f"{quoted[0][1]} {variant}"
    # a setting outside the training fingerprint still makes another run (evaluation during training here)
    assert _as_shipped_recipe(f"{base} {variant} eval.every=10", commands) == f"{base} {variant} eval.every=10"
