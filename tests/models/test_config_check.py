"""Configs transformers rejects (or silently fills) fail in one line naming the file, key and value,
exit 2, before any weights load — in every command, by the one pass of
:mod:`ropescale.models.config_check` (``load_config`` and ``doctor`` run it on the raw dict)."""

from __future__ import annotations

import json

import pytest
import transformers

from ropescale.cli.main import main
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "tiny"
    tiny_model().save_pretrained(path)
    return path


@pytest.fixture
def no_weights(monkeypatch):
    """Loading weights is a test failure: each refusal comes from the config alone."""

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were loaded before the config was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


def _variant(saved, tmp_path, edit):
    import shutil

    path = tmp_path / "model"
    shutil.copytree(saved, path)
    data = json.loads((path / "config.json").read_text())
    edit(data)
    (path / "config.json").write_text(json.dumps(data))
    return path


def _cli(capsys, *argv):
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    return code, err


CASES = {
    "yarn without factor": (
        lambda d: d.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
        "rope_parameters.factor = (missing): rope_type 'yarn' needs it",
    ),
    "odd head_dim": (lambda d: d.update(head_dim=15), "head_dim = 15: the rotary dimension (15) must be even"),
    "odd rotary dim": (
        lambda d: d["rope_parameters"].update(partial_rotary_factor=0.1875),
        "the rotary dimension x partial_rotary_factor 0.1875 (3) must be even",
    ),
    "no max_position_embeddings": (
        lambda d: d.pop("max_position_embeddings"),
        "max_position_embeddings = (missing): the trained context is unknown",
    ),
    "max_position_embeddings text": (
        lambda d: d.update(max_position_embeddings="abc"),
        "max_position_embeddings = 'abc': must be a positive integer",
    ),
    "max_position_embeddings fraction": (
        lambda d: d.update(max_position_embeddings=64.5),
        "max_position_embeddings = 64.5: must be a positive integer",
    ),
    "max_position_embeddings beyond int64": (
        lambda d: d.update(max_position_embeddings=2**64),
        f"max_position_embeddings = {2**64}: is beyond int64",
    ),
    "heads do not divide hidden": (
        lambda d: (d.pop("head_dim"), d.update(num_attention_heads=5, num_key_value_heads=5)),
        "num_attention_heads = 5: does not divide hidden_size (64)",
    ),
    "kv heads do not divide heads": (
        lambda d: d.update(num_key_value_heads=3),
        "num_key_value_heads = 3: does not divide num_attention_heads (4)",
    ),
    "no hidden_size": (
        lambda d: d.pop("hidden_size"),
        "hidden_size = (missing): the model's shape is unknown (transformers would assume its default 4096",
    ),
    "zero layers": (lambda d: d.update(num_hidden_layers=0), "num_hidden_layers = 0: must be a positive integer"),
    "negative theta": (
        lambda d: d["rope_parameters"].update(rope_theta=-1),
        "rope_parameters.rope_theta = -1: must be a positive number",
    ),
    "unknown rope type": (
        lambda d: d["rope_parameters"].update(rope_type="foo"),
        "rope_parameters.rope_type = 'foo': unknown to transformers",
    ),
    "factor not a number": (
        lambda d: d.update(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": "x"}),
        "rope_parameters.factor = 'x': must be a positive number",
    ),
    "llama3 without its keys": (
        lambda d: d.update(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
        "rope_parameters.original_max_position_embeddings = (missing): rope_type 'llama3' needs it",
    ),
    "rope_parameters not an object": (
        lambda d: d.update(rope_parameters=[1, 2]),
        "rope_parameters = [1, 2]: must be an object",
    ),
    "legacy rope_scaling without factor": (
        lambda d: (d.pop("rope_parameters"), d.update(rope_theta=1e4, rope_scaling={"rope_type": "yarn"})),
        "rope_scaling.factor = (missing): rope_type 'yarn' needs it",
    ),
    "legacy rope_theta not a number": (
        lambda d: (d.pop("rope_parameters"), d.update(rope_theta="abc")),
        "rope_theta = 'abc': must be a positive number",
    ),
    "unknown dtype": (lambda d: d.update(dtype="float33"), "dtype = 'float33': not a torch dtype"),
    "unknown activation": (lambda d: d.update(hidden_act="nope"), "hidden_act = 'nope': unknown to transformers"),
    "unknown model_type": (lambda d: d.update(model_type="llamaa"), "model_type = 'llamaa': unknown to transformers"),
    "no model_type": (lambda d: d.pop("model_type"), "model_type = (missing): required"),
    "sliding_window zero": (lambda d: d.update(sliding_window=0), "sliding_window = 0: must be a positive integer"),
    "yarn parameter not a number": (
        lambda d: d.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4, "beta_fast": "x"}),
        "rope_parameters.beta_fast = 'x': must be a number",
    ),
    "rejected by transformers (field)": (
        lambda d: d.update(rms_norm_eps="x"),
        "transformers rejects the config: Validation error for field 'rms_norm_eps'",
    ),
    "rejected by transformers (class)": (
        lambda d: d.update(layer_types=["full_attention"]),
        "transformers rejects the config: Class validation error for validator 'validate_layer_type'",
    ),
    "no rotary embedding (BERT)": (
        lambda d: (d.pop("rope_parameters"), d.update(model_type="bert", architectures=["BertModel"])),
        "model_type = 'bert': no rotary position embedding (RoPE)",
    ),
}

COMMANDS = {
    "patch": lambda m, out: ["patch", "--model", m, "--factor", "4", "--replace"],
    "patch --output": lambda m, out: ["patch", "--model", m, "--factor", "4", "--replace", "--output", out],
    "doctor": lambda m, out: ["doctor", m],
    "eval": lambda m, out: ["eval", "perplexity", "--model", m, "--lengths", "32", "--output", out],
    "export-gguf": lambda m, out: ["export-gguf", m, "--output", f"{out}.gguf"],
}


#: doctor reads only the rope, so it judges a config without its shape keys (tests/export/test_doctor.py)
PAIRS = [(command, case) for case in CASES for command in COMMANDS if (command, case) != ("doctor", "no hidden_size")]


@pytest.mark.parametrize("command, case", PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_config_problem_is_one_line_before_weights(saved, tmp_path, capsys, no_weights, case, command):
    edit, fragment = CASES[case]
    model = _variant(saved, tmp_path, edit)
    out = tmp_path / "out"
    code, err = _cli(capsys, *COMMANDS[command](str(model), str(out)))
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"ropescale: error: {model}/config.json: "), err
    assert fragment in err[0], err
    assert not out.exists() and not (tmp_path / "out.gguf").exists()


def test_original_context_flag_stands_in_for_a_missing_field(saved, tmp_path, capsys):
    model = _variant(saved, tmp_path, lambda d: d.pop("max_position_embeddings"))
    flag = ["--original-max-position-embeddings", "64"]
    code, err = _cli(capsys, "patch", "--model", model, "--factor", "4", *flag)
    assert code == 0, err
    code, err = _cli(capsys, "plot", "--model", model, "--factor", "4", *flag, "--output", tmp_path / "f.png")
    assert code == 0, err


def test_factor_beyond_int64_is_refused(saved, tmp_path, capsys, no_weights):
    out = tmp_path / "out"
    code, err = _cli(capsys, "patch", "--model", saved, "--factor", "1e20", "--output", out)
    assert code == 2 and len(err) == 1, err
    assert "max_position_embeddings = 6400000000000000000000, beyond int64" in err[0]
    assert not out.exists()


def test_gguf_context_beyond_u32_is_refused_before_writing(saved, tmp_path, capsys, no_weights):
    out = tmp_path / "x.gguf"
    code, err = _cli(capsys, "export-gguf", saved, "--method", "linear", "--factor", "1e9", "--output", out)
    assert code == 2 and len(err) == 1, err
    assert "max_position_embeddings = 64000000000 does not fit GGUF's llama.context_length (uint32" in err[0]
    assert not out.exists() and not list(tmp_path.glob(".x.gguf*"))


def test_a_sound_config_passes(saved, capsys):
    code, err = _cli(capsys, "doctor", saved)
    assert code == 0, err
