"""``ropescale doctor`` (its llama.cpp row), ``ropescale recommend --serve-with llama.cpp`` and
``ropescale export-gguf`` give one answer for every model type and rope form: none claims what
another refuses (issue 51: doctor and recommend said llama.cpp keeps a Qwen2.5 YaRN that export-gguf
refused)."""

from __future__ import annotations

import json

import pytest

import ropescale
from ropescale.cli.main import main
from ropescale.errors import RopescaleError
from ropescale.evals.advice.serving import Serving, engines_for
from ropescale.export import export_gguf
from ropescale.interop import engines
from ropescale.interop.gguf_support import DYNAMIC_METHODS, GGUF_ARCH
from ropescale.methods import METHODS, method_class
from tests.conftest import ORIGINAL_CONTEXT, tiny_config, tiny_model
from tests.export.conftest import VOCAB, tiny_tokenizer

FACTOR = 4
LONG = [1.0 + i / 7 * 3 for i in range(8)]
#: every registered method (defaults) and the variants whose parameters change llama.cpp's answer
# (composed needs a shipped scaling to build on; it is saved as the LongRoPE with equal factors below)
FORMS = [(m, {}) for m in METHODS if m not in ("longrope", "string", "composed")] + [
    ("string", {"frequencies": "yarn"}),
    ("dynamic_ntk", {"kv_consistent": False}),
    ("yarn", {"attention_factor": 1.3}),
    ("yarn", {"beta_fast": 16, "beta_slow": 2}),
    ("yarn", {"truncate": False}),
    ("longrope", {"long_factor": LONG, "short_factor": LONG}),  # how composed scalings are saved
    ("longrope", {"long_factor": LONG, "kv_consistent": False}),
    ("longrope", {"long_factor": LONG}),  # short = ones: KV-consistent by default
]
CASES = [(arch, {}) for arch in GGUF_ARCH] + [("mistral", {"sliding_window": 32})]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A saved tiny model of each case's architecture (export-gguf patches it on the fly, as the CLI does)."""
    out = {}
    for arch, overrides in CASES:
        path = tmp_path_factory.mktemp(f"{arch}-{len(overrides)}")
        tiny_model(arch, vocab_size=VOCAB, **overrides).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        out[arch, bool(overrides)] = path
    return out


def doctor(tmp_path, config, capsys):
    """The llama.cpp row of ``ropescale doctor --json`` on the config.json ``ropescale patch`` saves."""
    from ropescale.interop.legacy import with_legacy_keys

    folder = tmp_path / "doctor"
    folder.mkdir(parents=True)
    data = with_legacy_keys(json.loads(config.to_json_string(use_diff=False)))
    (folder / "config.json").write_text(json.dumps(data))
    main(["doctor", str(folder), "--json", "--engines", "llama.cpp"])
    return next(e for e in json.loads(capsys.readouterr().out)["engines"] if e["engine"] == "llama.cpp")


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("arch, overrides", CASES, ids=[a + ("-window" if o else "") for a, o in CASES])
def test_doctor_recommend_and_export_agree_for_every_rope_form(tmp_path, capsys, checkpoints, arch, overrides):
    checked = []
    for method, params in FORMS:
        try:
            config = ropescale.patch_config(tiny_config(arch, **overrides), method, factor=FACTOR, **params)
        except (ValueError, RopescaleError):  # a form this model cannot take at all is not llama.cpp's question
            continue
        said = doctor(tmp_path / f"{len(checked)}", config, capsys)
        refused = Serving("llama.cpp", engines_for("llama.cpp"), tiny_config(arch, **overrides)).refusals(
            method, ORIGINAL_CONTEXT * FACTOR, dict(params)
        )
        try:
            export_gguf(
                checkpoints[arch, bool(overrides)],
                tmp_path / f"{len(checked)}.gguf",
                method=method,
                factor=FACTOR,
                **params,
            )
            error = None
        except RopescaleError as exc:
            error = str(exc)
        case = f"{arch}{overrides or ''} {method} {params}: doctor {said['verdict']} ({said['why']}); export {error}"
        if said["verdict"] in (engines.KEEPS, engines.APPROXIMATES):
            assert error is None, case
        else:
            assert said["verdict"] == engines.CANNOT and error is not None and said["why"] in error, case
            assert list(tmp_path.glob("*.gguf")) == [] or f"{len(checked)}.gguf" not in {
                p.name for p in tmp_path.glob("*.gguf")
            }
        # recommend --serve-with llama.cpp serves exactly what the doctor says llama.cpp keeps
        assert (refused == []) == (said["verdict"] == engines.KEEPS), case
        if refused:
            assert said["why"] in refused[0], case
        checked.append((method, said["verdict"]))
    assert len(checked) >= len(FORMS) - 1  # every form was walked (string may not fit a tiny model)
    verdicts = dict(checked)
    if arch in ("qwen2", "qwen3"):  # issue 51: llama.cpp's qwen2/qwen3 take no per-dimension factors
        assert verdicts["llama3"] == engines.CANNOT and verdicts["yarn"] == engines.CANNOT  # betas 16/2 last
    elif not overrides:
        assert verdicts["llama3"] == engines.KEEPS


def test_the_dynamic_methods_are_the_registrys():
    """carry() judges config.json without importing the methods (the CLI stays fast): its list must be theirs."""
    assert {m for m in METHODS if method_class(m).dynamic} == DYNAMIC_METHODS


def test_recommend_serve_with_llama_cpp_names_what_qwen_cannot_carry(tmp_path):
    serving = Serving("llama.cpp", engines_for("llama.cpp"), tiny_config("qwen2"))
    assert serving.serves("yarn", ORIGINAL_CONTEXT * FACTOR)
    assert serving.refusals("llama3", ORIGINAL_CONTEXT * FACTOR) == [
        "llama.cpp GGUF from ropescale export-gguf: cannot express (llama.cpp's qwen2 architecture takes no "
        "per-dimension rope factors (rope_freqs), which llama3 is (a llama or mistral model can carry them))"
    ]
