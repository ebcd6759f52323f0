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
