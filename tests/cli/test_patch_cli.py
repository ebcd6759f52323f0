"""``ropescale methods`` / ``ropescale patch`` run in process; every bad input is one line, non-zero."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import ropescale
from ropescale.cli.main import main
from tests.conftest import tiny_model


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "tiny-llama"
    tiny_model().save_pretrained(path)
    return path


def run(capsys, *argv):
    capsys.readouterr()  # drop what fixtures printed
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code != 0
    # progress bars (loading weights before the failure) are not messages
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("ropescale: error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_methods_lists_every_method_with_defaults(capsys):
    code, out, _ = run(capsys, "methods", "--verbose")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:2] == ["method", "kind"]
    assert [line.split()[0] for line in lines[1:] if not line.startswith(" ")] == sorted(ropescale.METHODS)
    start = next(i for i, line in enumerate(lines) if line.startswith("yarn "))
    yarn = " ".join(line.strip() for line in lines[start:])  # the last entry: summary, then its parameters
    assert "beta_fast=32.0" in yarn and "factor=<required>" in yarn


def test_patch_summary(capsys, model_dir):
    code, out, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4")
    assert code == 0, err
    assert "method:             yarn (factor 4" in out
    assert "context:            64 -> 256 tokens" in out
    assert "attention scaling:  1.1386" in out
    assert "interpolated" in out and "kept" in out
    assert "of 8 pairs" in out


def test_patch_summary_answers_first(capsys, model_dir):
    """By default the facts, one line each, and the pair counts; --verbose adds each pair's wavelength."""
    code, out, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4")
    assert code == 0, err
    assert len(out.strip().splitlines()) <= 8 and "per-pair wavelengths" not in out
    assert out.strip().splitlines()[-1].startswith("rotary pairs:") and "--verbose" in out
    code, verbose, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4", "--verbose")
    assert code == 0, err
    assert "per-pair wavelengths" in verbose and "turns in L" in verbose and "of 8 pairs" in verbose


def test_patch_summary_shows_the_resolved_self_extend_grouping(capsys, model_dir):
    """G and W default from the model (W = L/4 = 16; the smallest G reaching 4 x 64 = 256 is 6)."""
    code, out, err = run(capsys, "patch", "--model", str(model_dir), "--method", "self_extend", "--factor", "4")
    assert code == 0, err
    assert (
        "method:             self_extend (factor 4, group_size=6, window=16, logn=False, fractional=False, shift=floor)"
        in out
    )


def test_patch_writes_checkpoint_that_reloads(capsys, model_dir, tmp_path):
    out_dir = tmp_path / "out"
    code, out, err = run(
        capsys, "patch", "--model", str(model_dir), "--method", "linear", "--factor", "2", "--output", str(out_dir)
    )
    assert code == 0, err
    config = json.loads((out_dir / "config.json").read_text())
    # linear keeps the original context L = 64 there: vLLM and SGLang serve it x factor (= 128)
    assert config["rope_parameters"]["rope_type"] == "linear" and config["max_position_embeddings"] == 64
    assert config["ropescale"]["extended_context"] == 128
    assert (out_dir / "model.safetensors").is_file()
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out_dir)
    direct = ropescale.patch(tiny_model(state_dict=reloaded.state_dict()), "linear", factor=2)
    ids = torch.randint(0, 128, (1, 100))
    torch.testing.assert_close(reloaded(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-5)


def test_patch_config_only_with_params(capsys, model_dir, tmp_path):
    out_dir = tmp_path / "cfg"
    code, _, err = run(
        capsys,
        "patch",
        "--model",
        str(model_dir),
        "--factor",
        "8",
        "--param",
        "beta_fast=16",
        "--param",
        "attention_factor=1.0",
        "--output",
        str(out_dir),
        "--config-only",
    )
    assert code == 0, err
    assert sorted(p.name for p in out_dir.iterdir()) == ["config.json"]
    rope = json.loads((out_dir / "config.json").read_text())["rope_parameters"]
    assert rope["beta_fast"] == 16 and rope["attention_factor"] == 1.0 and rope["factor"] == 8


@pytest.mark.parametrize(
    "argv,fragments",
    [
        (["--method", "yarm", "--factor", "4"], ["unknown method 'yarm'", "did you mean 'yarn'"]),
        (["--factor", "0"], ["argument --factor: factor must be > 0"]),
        (["--factor", "-1"], ["factor must be > 0"]),
        (["--factor", "0.5"], ["factor must be >= 1"]),  # the method's own range
        (["--factor", "abc"], ["factor must be a number, got 'abc'"]),
        (["--factor", "nan"], ["factor must be finite"]),
        (["--factor", "4", "--param", "beta_fast=0.5"], ["beta_fast must be > beta_slow"]),
        (["--factor", "4", "--param", "nonsense=1"], ["unknown parameter 'nonsense'"]),
        (["--factor", "4", "--param", "novalue"], ["--param expects KEY=VALUE"]),
        (["--factor", "4", "--sliding-window", "wide"], ["--sliding-window must be"]),
        ([], ["required: --factor"]),
    ],
)
def test_bad_scaling_input(capsys, model_dir, argv, fragments):
    code, _, err = run(capsys, "patch", "--model", str(model_dir), *argv)
    assert_one_line_error(code, err, *fragments)


def test_missing_model_path(capsys, tmp_path):
    code, _, err = run(capsys, "patch", "--model", str(tmp_path / "nope"), "--factor", "4")
    assert_one_line_error(code, err, "not found")


def test_unsupported_architectures(capsys, tmp_path):
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    ).save_pretrained(gpt2)
    code, _, err = run(capsys, "patch", "--model", str(gpt2), "--factor", "4")
    assert_one_line_error(code, err, "no rotary position embedding")
    phi = tmp_path / "phi3"
    transformers.Phi3Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1).save_pretrained(phi)
    code, _, err = run(capsys, "patch", "--model", str(phi), "--factor", "4")
    assert_one_line_error(code, err, "'phi3' is not supported")


def test_already_scaled_model(capsys, model_dir, tmp_path):
    scaled = tmp_path / "scaled"
    assert run(capsys, "patch", "--model", str(model_dir), "--factor", "4", "--output", str(scaled))[0] == 0
    # a training-free patch is replaced by default, from the original context, and the output says so
    code, out, err = run(capsys, "patch", "--model", str(scaled), "--factor", "8")
    assert code == 0, err
    assert "64 -> 512 tokens" in out
    assert "starts:             replaced the shipped yarn x4 (applied without training: ropescale provenance" in out
    code, out, err = run(capsys, "patch", "--model", str(scaled), "--factor", "8", "--replace")
    assert code == 0, err
    assert "64 -> 512 tokens" in out


def test_non_writable_or_non_empty_output(capsys, model_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4", "--output", str(blocker / "sub"))
    assert_one_line_error(code, err, "not writable")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4", "--output", str(full))
    assert_one_line_error(code, err, "not empty", "--overwrite")
    assert (full / "keep.txt").read_text() == "mine"


def test_failure_while_writing_leaves_nothing(capsys, model_dir, tmp_path, monkeypatch):
    def explode(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", explode)
    out_dir = tmp_path / "out"
    code, _, err = run(capsys, "patch", "--model", str(model_dir), "--factor", "4", "--output", str(out_dir))
    assert_one_line_error(code, err, "disk full")
    assert not out_dir.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_the_plan_printed_is_the_plan_written(capsys, model_dir, tmp_path, monkeypatch):
    """`patch --output` plans once: the PatchPlan it summarises is the object from_pretrained applies
    (before, from_pretrained planned again from the keyword arguments)."""
    import ropescale.models.loading as loading
    import ropescale.patching.plan as plan_mod

    made, applied = [], []
    real_plan, real_load = plan_mod.plan_scaling, loading.from_pretrained
    monkeypatch.setattr(plan_mod, "plan_scaling", lambda *a, **k: made.append(real_plan(*a, **k)) or made[-1])
    monkeypatch.setattr(loading, "plan_scaling", plan_mod.plan_scaling)
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: applied.append(k.get("plan")) or real_load(*a, **k))
    out = tmp_path / "y2"
    code, stdout, err = run(
        capsys, "patch", "--model", str(model_dir), "--method", "yarn", "--factor", "2", "--output", str(out)
    )
    assert code == 0, err
    assert len(made) == 1 and applied == [made[0]]
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["factor"] == 2


def test_from_pretrained_refuses_a_plan_beside_a_method(model_dir):
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import plan_patch

    plan = plan_patch(load_config(str(model_dir)), "yarn", 2)
    with pytest.raises(ValueError, match="either a plan or method"):
        ropescale.from_pretrained(str(model_dir), method="yarn", factor=2, plan=plan)
