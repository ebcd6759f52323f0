"""A suite on an already extended checkpoint (issue 51, point 1: the model as shipped is the baseline):
``S``, the context the checkpoint serves as shipped, beside ``L``, its pretraining context, in every
length a suite writes and as a factor ``target/S``; the dry run says which context each symbol took and
where it came from; ``target/L`` on a method composed on the shipped scaling is refused in one line.

The folders are the config.json files of the real shapes (tests/data/shapes): resolving reads no weights.
"""

from __future__ import annotations

import json
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


# --shipped-context on a suite (issue 51 point 1: "take it from --shipped-context, else a family table ...,
# else max_position_embeddings, naming the source"). Before, `eval suite` had no such flag and a suite no
# such key: S was the family table's or config.json's, and an unknown checkpoint could not say what it serves.

LLAMA31_256K = "methods:\n  - saved\n  - {method: yarn, factor: target/S, params: {compose: true}, label: on-shipped}\n"


def test_shipped_context_flag_is_the_suites_s_and_its_composed_methods_start(tmp_path, capsys, monkeypatch):
    """A Llama 3.1 said to serve 262,144 (say, a fine-tune whose config.json still states 131,072): S, the
    composed method's factor and its plan all start there, and the dry run names the flag as the source."""
    text = f"name: s\ndata: austen\ntarget_length: 2S\n{LLAMA31_256K}perplexity: {{lengths: [S, target]}}\n"
    suite = load_suite(_suite(tmp_path, text), model=str(LLAMA31), shipped_context=262144)
    assert suite.shipped_context == 262144 and suite.perplexity["lengths"] == [262144, 524288]
    composed = next(m for m in suite.methods if m.label == "on-shipped")
    assert composed.factor == 2.0 and composed.params == {"compose": True, "shipped_context": 262144}
    assert composed.scaling.shipped_context == 262144
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "suite", str(_suite(tmp_path, text)), "--model", str(LLAMA31), "--dry-run"]
    assert main([*argv, "--shipped-context", "256k"]) == 0
    out = capsys.readouterr().out
    assert "S = 262,144 (shipped: --shipped-context); target = 524,288 (target_length: 2S)" in out, out


def test_shipped_context_suite_key_and_its_refusals(tmp_path):
    text = f"name: s\ndata: austen\ntarget_length: 2S\nshipped_context: 262144\n{LLAMA31_256K}"
    suite = load_suite(_suite(tmp_path, text + "perplexity: {lengths: [S]}\n"), model=str(LLAMA31))
    assert suite.perplexity["lengths"] == [262144] and suite.methods[1].params["shipped_context"] == 262144
    assert suite.methods[0].params == {}  # the model as saved runs as it is
    from ropescale.evals.suite.lengths import prepare

    said = prepare({**_yaml(text), "perplexity": {"lengths": ["S"]}}, "suite 'x'", model=str(LLAMA31)).contexts
    assert "S = 262,144 (shipped: the suite's shipped_context)" in said, said
    with pytest.raises(SuiteError, match=r"^shipped_context of suite .* must be a positive token count .* got 'big'"):
        load_suite(_suite(tmp_path, "shipped_context: big\nmethods: [none]\nperplexity: {lengths: [1024]}\n"))
    replacing = (
        "methods:\n  - {method: yarn, factor: 2, params: {shipped_context: 16384}}\nperplexity: {lengths: [1024]}\n"
    )
    with pytest.raises(SuiteError, match=r"methods\[0\]\.params\.shipped_context of .* replaces the shipped scaling"):
        load_suite(_suite(tmp_path, replacing))
    both = "shipped_context: 16384\nmethods:\n  - {method: yarn, factor: 2, params: {compose: true, shipped_context: 8192}}"
    with pytest.raises(SuiteError, match=r"is 8192, the suite's shipped_context 16384: give one"):
        load_suite(_suite(tmp_path, both + "\nperplexity: {lengths: [1024]}\n"))


def _yaml(text: str):
    import yaml

    return yaml.safe_load(text)


def test_a_cell_composed_from_another_shipped_context_is_not_done(tmp_path):
    """The composed method's cells record the shipped context their second ramp was measured in; a run told
    another one recomputes them instead of reporting the old numbers under the new S."""
    from ropescale.evals.report.cell_keys import scaling_run
    from ropescale.evals.tasks.saved import is_saved

    text = f"name: s\ndata: austen\n{LLAMA31_256K.replace('target/S', '2')}perplexity: {{lengths: [1024]}}\n"
    runs = {}
    for given in (None, 262144, 524288):
        suite = load_suite(_suite(tmp_path, text), model=str(LLAMA31), shipped_context=given)
        entry = next(m for m in suite.methods if not is_saved(m.method))
        runs[given] = scaling_run(str(LLAMA31), entry)
    assert len({repr(r) for r in runs.values()}) == 3, runs
    assert runs[262144]["params"]["shipped_context"] == 262144


def test_eval_runs_a_composed_method_from_the_shipped_context_it_is_told(tmp_path, capsys):
    """End to end on a tiny checkpoint saved with a training-free YaRN x2 (128 → 256 positions): composed x2
    reaches 512 from what config.json says; told it serves 512, the same request reaches 1,024 and its cell says so."""
    from tests.conftest import tiny_model
    from tests.evals.ruler_fixtures import ruler_tokenizer

    tok, base = ruler_tokenizer(), str(tmp_path / "base")
    tiny_model(vocab_size=len(tok), max_position_embeddings=128, attn_implementation="sdpa").save_pretrained(base)
    tok.save_pretrained(base)
    shipped = str(tmp_path / "shipped")
    assert main(["patch", "--model", base, "--method", "yarn", "--factor", "2", "--output", shipped]) == 0
    out, text = tmp_path / "ppl", tmp_path / "text.txt"
    text.write_text(" ".join(f"The {i}th guest came to the ball at {i % 12} o'clock." for i in range(300)))
    argv = ["eval", "perplexity", "--model", shipped, "--method", "yarn", "--factor", "2", "--param", "compose=true"]
    argv += ["--lengths", "1024", "--data", str(text), "--device", "cpu", "--output", str(out), "--no-progress"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and not out.exists(), err
    assert "at 1024 tokens (extended context 512 from the shipped context 256); use factor >= 4 or --shipped" in err[0]
    assert main([*argv, "--shipped-context", "512"]) == 0
    (cell,) = (json.loads(p.read_text()) for p in (out / "cells").glob("*.json"))
    assert cell["scaling"]["params"]["shipped_context"] == 512, cell["scaling"]
