"""vLLM's and SGLang's own config parsing and rope code on ropescale checkpoints, against the doctor.

``make engines`` installs vLLM 0.11.0 (beside transformers 4.57, ``make tf4``), vLLM 0.33.0 and
SGLang 0.5.23 (beside this venv's transformers 5) into folders of their own; :mod:`run_engine` builds
each engine's rotary embedding from every case of :mod:`cases` in a subprocess and :mod:`measure`
compares its cos/sin with transformers 5 at n = 16, L/2, L, L+1, L+2, 2L, 4L and its default context
with the extended one. Every cell must be what ``doctor --engines <engine>==<version>`` says.
"""

from __future__ import annotations

import json
import os

import pytest

from ropescale.interop.engines import KEEPS, select
from ropescale.interop.verdict import check

from . import cases, measure


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    lacking = measure.missing()
    if lacking:
        reason = f"engines not installed ({', '.join(lacking)}): run `make engines tf4` (make test does)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("engines")
    checkpoints = cases.build(root)
    refs = {d: measure.reference(d) for d in checkpoints.values()}
    rows = []
    for install, selector in cases.SELECTORS.items():
        results = measure.run(install, list(checkpoints.values()), root / f"{install}.pt")
        (engine,) = select(selector)
        for (method, form), d in checkpoints.items():
            data = json.loads((d / "config.json").read_text())
            extended = data["ropescale"]["extended_context"]
            seen, what = measure.observed(results[str(d)], refs[d], data["rope_parameters"], extended)
            (said,) = [v for v in check(data, engines=(engine,)).verdicts if v.engine == engine.key]
            rows.append(
                {
                    "install": install,
                    "engine": engine.key,
                    "method": method,
                    "form": form,
                    "observed": seen,
                    "what": what,
                    "doctor": said.verdict,
                    "why": said.why,
                }
            )
    return rows


def test_doctor_says_what_each_engine_does(matrix):
    wrong = [r for r in matrix if r["observed"] != r["doctor"]]
    assert not wrong, "\n".join(
        f"{r['install']} {r['method']} {r['form']}: engine {r['observed']} ({r['what']}), "
        f"doctor ({r['engine']}) {r['doctor']} ({r['why']})"
        for r in wrong
    )
    assert len(matrix) == len(cases.SELECTORS) * len(cases.METHODS) * len(cases.FORMS)


def test_engines_serve_what_ropescale_writes(matrix):
    """The saved configs: every engine keeps linear (at the extended context) and yarn with an explicit
    attention factor; dynamic NTK and LongRoPE are what the engines cannot be made to do."""
    saved = {(r["install"], r["method"]): r["observed"] for r in matrix if r["form"] == "saved"}
    for install in cases.SELECTORS:
        for method in ("linear", "ntk", "yarn", "yarn_af1", "yarn_betas", "llama3"):
            assert saved[install, method] == KEEPS, (install, method)
    assert saved["vllm-0.33.0", "dynamic_ntk"] == "fails"


@pytest.mark.parametrize("install", ["vllm-0.11.0", "vllm-0.33.0"])
def test_vllm_reads_the_dual_chunk_config_of_a_qwen2_dca_checkpoint(tmp_path, install):
    """A Qwen2 checkpoint saved with dca carries dual_chunk_attention_config; vLLM's own config reading
    and DualChunkRotaryEmbedding (as its Qwen2Attention builds it) rotate keys and the intra /
    successive / inter queries at ropescale's DCA positions. vLLM reads the config with ropescale's
    non-native marking undone (model_type qwen2): the marking is what stops plain loaders."""
    import warnings

    import torch

    import ropescale
    from ropescale.interop.engines import CANNOT
    from ropescale.methods.dca import chunk_positions
    from ropescale.models.checkpoint import unmark_config_dict
    from tests.conftest import tiny_model

    if measure.missing():
        pytest.skip("engines not installed: run `make engines tf4`")
    geometry = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64, num_hidden_layers=1)
    model = tiny_model("qwen2", max_position_embeddings=cases.L, **geometry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ropescale.save_pretrained(ropescale.patch(model, "dca", factor=4), tmp_path / "saved", config_only=True)
    data = json.loads((tmp_path / "saved" / "config.json").read_text())
    dca = data["dual_chunk_attention_config"]
    assert dca["original_max_position_embeddings"] == cases.L and dca["local_size"] < dca["chunk_size"] < cases.L
    (said,) = [v for v in check(data, engines=select("vllm-0.30")).verdicts if v.engine == "vllm-0.30"]
    assert said.verdict == CANNOT and "25351" in said.why and f"chunk_size {dca['chunk_size']}" in said.why
    served = tmp_path / "as-qwen2"
    served.mkdir()
    (served / "config.json").write_text(json.dumps({**unmark_config_dict(data), "architectures": ["Qwen2ForCausalLM"]}))
    got = measure.run(install, [served], tmp_path / "out.pt")[str(served)]
    assert got.get("class") == "DualChunkRotaryEmbedding", got.get("error")
    assert (got["dca"]["chunk_size"], got["dca"]["local_size"]) == (dca["chunk_size"], dca["local_size"])
    n = cases.LENGTHS[-1]
    where = chunk_positions(torch.arange(n), dca["chunk_size"], dca["local_size"])
    inv_freq = 1.0 / (data["rope_parameters"]["rope_theta"] ** (torch.arange(0, 64, 2).float() / 64))

    def rows(positions):
        angles = positions.float()[:, None] * inv_freq
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    query = got["dca"]["query"]  # [q intra, q successive, q inter, two "critical" variants] x head_dim
    torch.testing.assert_close(got["dca"]["key"], rows(where["key"]), rtol=0, atol=1e-4)
    for part, region in enumerate(("intra", "successive", "inter")):
        torch.testing.assert_close(query[:, 64 * part : 64 * part + 64], rows(where[region]), rtol=0, atol=1e-4)
