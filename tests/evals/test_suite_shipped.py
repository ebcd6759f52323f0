"""A suite on an already extended checkpoint (issue 51, point 1: the model as shipped is the baseline):
``S``, the context the checkpoint serves as shipped, beside ``L``, its pretraining context, in every
length a suite writes and as a factor ``target/S``; the dry run says which context each symbol took and
where it came from; ``target/L`` on a method composed on the shipped scaling is refused in one line.

The folders are the config.json files of the real shapes (tests/data/shapes): resolving reads no weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.evals.suite.parse import SuiteError, load_suite

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"
LLAMA31 = SHAPES / "llama3.1-8b"  # llama3 x8: pretrained at 8,192, serves 131,072 (family table)
LLAMA3 = SHAPES / "llama3-8b"  # plain RoPE at 8,192: S is L

SHIPPED = """name: shipped
data: austen
target_length: 4S
methods:
  - saved
  - {method: yarn, factor: target/S, params: {compose: true}, label: yarn-on-shipped}
  - {method: yarn, factor: target/L, label: yarn-replacing}
perplexity: {lengths: [S/4, S, 2S, target], mode: nonoverlap}
passkey: {lengths: [L, S], depths: [0.5], trials: 1}
"""


def _suite(tmp_path, text: str = SHIPPED) -> Path:
    path = tmp_path / "shipped.yaml"
    path.write_text(text)
    return path


def test_s_is_the_shipped_context_on_llama31_and_l_on_a_plain_checkpoint(tmp_path):
    extended = load_suite(_suite(tmp_path), model=str(LLAMA31))
    assert extended.perplexity["lengths"] == [32768, 131072, 262144, 524288]
    assert extended.passkey["lengths"] == [8192, 131072] and extended.target_length == 4 * 131072
    plain = load_suite(_suite(tmp_path), model=str(LLAMA3))
    assert plain.perplexity["lengths"] == [2048, 8192, 16384, 32768] and plain.passkey["lengths"] == [8192]


def test_target_over_s_is_the_factor_a_composed_method_needs(tmp_path):
    """target/S scales the shipped 128k; target/L, for a method that replaces it, scales the pretraining 8k."""
    factors = {m.label: m.factor for m in load_suite(_suite(tmp_path), model=str(LLAMA31)).methods}
    assert factors["yarn-on-shipped"] == 4.0 and factors["yarn-replacing"] == 64.0
    asked = load_suite(_suite(tmp_path), model=str(LLAMA31), target_length=262144)
    assert {m.label: m.factor for m in asked.methods}["yarn-on-shipped"] == 2.0


def test_the_dry_run_says_which_context_each_symbol_took(tmp_path, capsys, monkeypatch):
    import ropescale.models.loading as loading

    def no_weights(*a, **k):
        raise AssertionError("a dry run loaded weights")

    monkeypatch.setattr(loading, "from_pretrained", no_weights)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "suite", str(_suite(tmp_path)), "--model", str(LLAMA31), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "Relative lengths resolved with L = 8,192 (pretraining: config.json "
        "rope_parameters.original_max_position_embeddings), S = 131,072 (shipped: family table: Llama 3.1/3.3); "
        "target = 524,288 (target_length: 4S)"
    ), out
    assert main(["eval", "suite", "extend-check", "--model", str(LLAMA3), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "L = 8,192 (pretraining: config.json max_position_embeddings), S = 8,192 (shipped: " in out
    assert "target = 32,768 (target_length: 4L)" in out
    fixed = _suite(tmp_path, "name: fixed\ndata: austen\nmethods: [none]\nperplexity: {lengths: [2048]}\n")
    assert main(["eval", "suite", str(fixed), "--model", str(LLAMA31), "--dry-run"]) == 0
    assert "Relative lengths" not in capsys.readouterr().out  # a suite of token counts prints as before
    assert not (tmp_path / "runs").exists()


def test_target_over_l_on_a_composed_method_is_refused_in_one_line(tmp_path, capsys):
    """Composed on llama3's 128k, target/L would ask yarn x64 on top of x8: 8M tokens for a 512k target."""
    # no S anywhere: the file the old code read, and ran at yarn x64 composed on llama3 x8
    text = SHIPPED.replace("factor: target/S, params", "factor: target/L, params").replace("S", "L")
    text = text.replace("target_length: 4L", "target_length: 64L")
    code = main(["eval", "suite", str(_suite(tmp_path, text)), "--model", str(LLAMA31), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "methods[1].factor of suite" in err[0] and "'target/L' on a method composed on the shipped" in err[0]
    assert "S = 131,072 (family table: Llama 3.1/3.3), not L = 8,192: write target/S" in err[0]
    plain = load_suite(_suite(tmp_path, text), model=str(LLAMA3))  # S = L: the two factors are one
    assert {m.label: m.factor for m in plain.methods}["yarn-on-shipped"] == 64.0


def test_a_target_within_s_for_a_target_over_s_factor_is_refused(tmp_path):
    with pytest.raises(SuiteError, match=r"target length 65536 of suite .* within the model's shipped context S = "):
        load_suite(_suite(tmp_path), model=str(LLAMA31), target_length=65536)


def test_lengths_option_takes_s(tmp_path):
    small = load_suite(_suite(tmp_path), model=str(LLAMA31), lengths=["S/4", "S"])
    assert small.perplexity["lengths"] == [32768, 131072] and small.passkey["lengths"] == [32768, 131072]


def test_target_over_s_on_a_replacing_method_is_refused_in_one_line(tmp_path, capsys):
    """Replacing llama3 from the pretraining 8k, target/S would reach a sixteenth of the target."""
    text = SHIPPED.replace("factor: target/L, label", "factor: target/S, label")
    code = main(["eval", "suite", str(_suite(tmp_path, text)), "--model", str(LLAMA31), "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "methods[2].factor of suite" in err[0] and "'target/S' on a method that replaces the shipped" in err[0]
    assert "L = 8,192 (config.json rope_parameters.original_max_position_embeddings), not S = 131,072" in err[0]
    assert "write target/L, or params: {compose: true}" in err[0]
    plain = load_suite(_suite(tmp_path, text), model=str(LLAMA3))  # S = L: the two factors are one
    assert {m.label: m.factor for m in plain.methods}["yarn-replacing"] == 4.0


def test_the_runners_own_checks_accept_what_s_resolves_to(tmp_path):
    """The runner plans each method on the config and checks each length against the context its factor
    multiplies (S for a composed method): target/S and target/L both reach the target, before any weights."""
    from ropescale.evals.suite.checks import check_against_model
    from ropescale.evals.suite.lengths import check_lengths, contexts_of
    from ropescale.models.loading import load_config

    suite = load_suite(_suite(tmp_path), model=str(LLAMA31))
    config = load_config(str(LLAMA31))
    check_against_model(suite, config)
    contexts = contexts_of(config)
    check_lengths(suite, contexts.L, contexts.S)
    assert (contexts.L, contexts.S) == (8192, 131072)


@pytest.mark.parametrize("shape, L", [("qwen3-8b", 32768), ("qwen2.5-7b", 32768), ("mistral-nemo-12b", 131072)])
def test_l_is_the_context_the_patch_starts_from_where_config_json_overstates_it(shape, L):
    """Qwen3-8B's config.json states 40,960, Qwen2.5-7B's 131,072, Mistral-Nemo's 1,024,000; patching starts
    from the family table's context. Before, L was the field: extend-check on Qwen3-8B asked 163,840
    tokens of a yarn x4 that reaches 131,072 (Qwen2.5-7B: 524,288 of 131,072), and the run's check let it."""
    from ropescale.models.loading import load_config
    from ropescale.patching.plan import plan_scaling

    suite = load_suite("extend-check", model=str(SHAPES / shape))
    assert suite.perplexity["lengths"] == [L // 4, L, 2 * L, 4 * L] and suite.target_length == 4 * L
    yarn = next(m for m in suite.methods if m.label == "yarn")
    assert f"from the pretraining context {L} " in plan_scaling(load_config(str(SHAPES / shape)), yarn.scaling).start
    assert yarn.factor * L == suite.target_length
