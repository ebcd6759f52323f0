"""``ropescale doctor``: verdicts from config.json alone, for configs written before the legacy
keys (by hand), by ropescale now, for non-native methods, and bad input."""

from __future__ import annotations

import json

import pytest

import ropescale
from ropescale.cli.main import main
from ropescale.interop import engines
from ropescale.patching import geometry
from ropescale.patching import plan as patching_config
from tests.conftest import tiny_model

# A config.json as ropescale wrote it before the legacy keys: transformers 5's rope_parameters only.
OLD_YARN = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 500000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
    },
    "ropescale": {"method": "yarn", "native": True, "kv_consistent": False, "original_rope_theta": 500000.0},
}
OLD_NTK = {
    **OLD_YARN,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    "ropescale": {"method": "ntk", "native": True, "original_rope_theta": 1e4},
}


def run(tmp_path, data, *args):
    (tmp_path / "config.json").write_text(json.dumps(data))
    return main(["doctor", str(tmp_path), *args])


def verdicts(capsys):
    return {e["engine"]: e for e in json.loads(capsys.readouterr().out)["engines"]}


def test_old_checkpoint_is_caught(tmp_path, capsys):
    assert run(tmp_path, OLD_YARN, "--json") == 1
    got = verdicts(capsys)
    assert got["transformers4"]["verdict"] == engines.LOSES
    assert "rope type 'default' instead of 'yarn'" in got["transformers4"]["why"]
    assert got["vllm-0.11"]["verdict"] == engines.LOSES and got["sglang-tf4"]["verdict"] == engines.LOSES
    # vLLM 0.12+ on transformers 4 finds rope_parameters but takes LlamaConfig's default base 10000
    assert got["vllm-tf4"]["verdict"] == engines.LOSES
    assert "rope_theta 10000 instead of 500000" in got["vllm-tf4"]["why"]
    for key in ("transformers5", "vllm-tf5", "vllm-0.30", "sglang-tf5", "llama.cpp", "ropescale"):
        assert got[key]["verdict"] == engines.KEEPS, key


def test_old_ntk_checkpoint_loses_its_base(tmp_path, capsys):
    assert run(tmp_path, OLD_NTK) == 1
    out = capsys.readouterr().out
    assert "rope_theta 10000 instead of 1e+06" in out and "re-save it with ropescale" in out


@pytest.mark.parametrize(
    "method,params",
    [
        ("linear", {}),
        ("ntk", {}),
        ("yarn", {}),
        ("llama3", {}),
        ("longrope", {"long_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0], "kv_consistent": False}),
        ("dynamic_ntk", {"kv_consistent": False}),
    ],
)
def test_checkpoints_written_now_lose_nothing(tmp_path, capsys, method, params):
    ropescale.save_pretrained(
        ropescale.patch(tiny_model(), method, factor=4, **params), tmp_path / "c", config_only=True
    )
    code = main(["doctor", str(tmp_path / "c"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["scaled"] and report["method"] == method
    got = {e["engine"]: e["verdict"] for e in report["engines"]}
    assert got["transformers4"] == got["transformers5"] == engines.KEEPS
    assert engines.LOSES not in got.values()
    # vLLM >= 0.22 cannot serve dynamic NTK from any config.json: doctor says so and exits 1
    failing = sorted(k for k, v in got.items() if v == engines.FAILS)
    assert failing == (["vllm-0.22", "vllm-0.30"] if method == "dynamic_ntk" else [])
    assert code == (1 if failing else 0) and report["ok"] is not bool(failing)


def test_engine_limits_are_not_losses(tmp_path, capsys):
    ropescale.save_pretrained(
        ropescale.patch(tiny_model(), "dynamic_ntk", factor=4, kv_consistent=False), tmp_path / "c", config_only=True
    )
    main(["doctor", str(tmp_path / "c"), "--json"])
    got = verdicts(capsys)
    assert got["vllm-tf5"]["verdict"] == engines.APPROXIMATES and "factor x L" in got["vllm-tf5"]["why"]
    assert got["llama.cpp"]["verdict"] == engines.CANNOT and got["tgi"]["verdict"] == engines.KEEPS


@pytest.mark.parametrize(
    "method,params,needle",
    [
        ("dynamic_yarn", {}, "needs ropescale"),
        ("self_extend", {}, "needs ropescale"),
        ("dynamic_ntk", {}, "without KV-consistent rotation"),  # kv_consistent is the default for dynamic methods
    ],
)
def test_non_native_cannot_be_expressed_anywhere_but_ropescale(tmp_path, capsys, method, params, needle):
    with pytest.warns(UserWarning, match="cannot be expressed outside ropescale"):
        ropescale.save_pretrained(
            ropescale.patch(tiny_model(), method, factor=4, **params), tmp_path / "c", config_only=True
        )
    code = main(["doctor", str(tmp_path / "c"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert "cannot be expressed outside ropescale" in report["note"]
    for entry in report["engines"]:
        if entry["engine"] == "ropescale":
            assert entry["verdict"] == engines.KEEPS
        elif method == "dynamic_ntk" and entry["engine"] in ("vllm-0.22", "vllm-0.30"):
            assert entry["verdict"] == engines.FAILS and code == 1  # it does not get as far as approximating
        elif entry["engine"] != "llama.cpp":
            assert entry["verdict"] == engines.CANNOT and needle in entry["why"], entry


def test_json_shape_and_engine_selection(tmp_path, capsys):
    assert run(tmp_path, OLD_YARN, "--json", "--engines", "transformers,tgi") == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"source", "method", "scaled", "note", "ok", "engines"}
    assert [e["engine"] for e in report["engines"]] == ["transformers4", "transformers5", "tgi", "ropescale"]
    assert set(report["engines"][0]) == {"engine", "name", "versions", "verdict", "why"}
    assert report["ok"] is False and report["method"] == "yarn"
    assert run(tmp_path, OLD_YARN, "--engines", "transformers5") == 0  # it reads rope_parameters


@pytest.mark.parametrize(
    "argv", [["doctor", "/nonexistent/dir"], ["doctor", "org/name"], ["doctor", "./x", "--engines", "nope"]]
)
def test_bad_input_is_one_line_exit_2(argv, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ropescale: error: ") and "\n" not in err


def test_constants_match_patching():
    assert engines.NON_NATIVE_PREFIX == patching_config.NON_NATIVE_PREFIX
    assert engines.PROVENANCE_KEY == geometry.PROVENANCE_KEY  # where the provenance block is written and read


def test_tgi_approximates_a_yarn_with_custom_betas(tmp_path, capsys):
    ropescale.save_pretrained(
        ropescale.patch(tiny_model(), "yarn", factor=4, beta_fast=16), tmp_path / "c", config_only=True
    )
    assert main(["doctor", str(tmp_path / "c"), "--json"]) == 0
    got = verdicts(capsys)
    assert got["tgi"]["verdict"] == engines.APPROXIMATES and "beta_fast" in got["tgi"]["why"]
    assert got["transformers4"]["verdict"] == engines.KEEPS


@pytest.mark.parametrize(
    "method,params",
    [("dynamic_ntk", {}), ("longrope", {"long_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]})],
)
def test_kv_consistent_checkpoints_say_what_other_loaders_do(tmp_path, capsys, method, params):
    """The default KV-consistent mode of a method whose frequencies switch with the length (dynamic NTK,
    LongRoPE with short != long factors) is ropescale's alone: elsewhere the plain method, named."""
    with pytest.warns(UserWarning, match=f"transformers/vLLM load it as plain {method}"):
        ropescale.save_pretrained(
            ropescale.patch(tiny_model(), method, factor=4, **params), tmp_path / "c", config_only=True
        )
    # vLLM >= 0.22 fails on any dynamic NTK config (exit 1); the rest cannot express the KV-consistent mode
    assert main(["doctor", str(tmp_path / "c"), "--json"]) == (1 if method == "dynamic_ntk" else 0)
    got = {e["engine"]: e for e in json.loads(capsys.readouterr().out)["engines"]}
    assert got["transformers5"]["verdict"] == engines.CANNOT
    assert got["transformers5"]["why"].startswith(f"plain {method} without KV-consistent rotation")


def test_the_verdict_line_names_every_loader_that_does_not_keep_it(tmp_path):
    """The one-line answer counts the keepers and names each other loader once, by its verdict."""
    from ropescale.cli.main import main
    from ropescale.interop.verdict import check, read_config_json, verdict_line

    src = tmp_path / "src"
    tiny_model().save_pretrained(src)
    for method, out in (("yarn", "y"), ("dynamic_yarn", "dy")):
        assert (
            main(
                ["patch", "--model", str(src), "--method", method, "--factor", "4"]
                + ["--output", str(tmp_path / out), "--config-only"]
            )
            == 0
        )
    keeps = check(read_config_json(str(tmp_path / "y"))[0], "y")
    assert verdict_line(keeps) == f"yarn: every loader keeps it ({len(keeps.verdicts)} of {len(keeps.verdicts)})"
    report = check(read_config_json(str(tmp_path / "dy"))[0], "dy")
    line = verdict_line(report)
    others = [v for v in report.verdicts if v.verdict != "keeps"]
    assert others and line.startswith(
        f"dynamic_yarn: {len(report.verdicts) - len(others)} of {len(report.verdicts)} keep it; "
    )
    assert all(line.count(f"{v.name} {v.versions}") == 1 for v in others)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_llama_cpp_row_says_qwen_takes_no_per_dimension_factors(tmp_path, capsys, arch):
    """Issue 51: llama.cpp's qwen2/qwen3 keep YaRN (what export-gguf writes) but have no rope_freqs."""
    for method, params in (("llama3", {}), ("longrope", {"long_factor": [2.0] * 8, "short_factor": [2.0] * 8})):
        ropescale.save_pretrained(
            ropescale.patch(tiny_model(arch), method, factor=4, **params), tmp_path / method, config_only=True
        )
        main(["doctor", str(tmp_path / method), "--json"])
        got = verdicts(capsys)["llama.cpp"]
        assert got["verdict"] == engines.CANNOT, got
        assert got["why"] == (
            f"llama.cpp's {arch} architecture takes no per-dimension rope factors (rope_freqs), which {method} is "
            "(a llama or mistral model can carry them)"
        )
    ropescale.save_pretrained(ropescale.patch(tiny_model(arch), "yarn", factor=4), tmp_path / "yarn", config_only=True)
    main(["doctor", str(tmp_path / "yarn"), "--json"])
    got = verdicts(capsys)["llama.cpp"]
    assert got["verdict"] == engines.KEEPS and f"{arch}.rope.scaling.type=yarn" in got["why"]
