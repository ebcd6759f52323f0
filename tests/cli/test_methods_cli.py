"""``ropescale methods``: a table with a header that fits 100 columns (it printed 150-250-character lines
without one); parameters and defaults behind ``--verbose``."""

from __future__ import annotations

from ropescale.cli.main import main
from ropescale.methods import METHODS


def test_methods_is_a_table_that_fits_100_columns(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["method", "kind", "what", "it", "does"]
    assert max(map(len, lines)) <= 100
    named = [x.split()[0] for x in lines[1:] if not x.startswith(" ")][:-1]  # the last line points at --verbose
    assert named == sorted(METHODS)
    assert any(x.split()[:2] == ["yarn", "static"] for x in lines)
    assert not any("parameters:" in x for x in lines) and "--verbose" in lines[-1]


def test_methods_says_the_readmes_training_free_and_runs_in(capsys):
    """The README's methods table has two columns the listing lacked; both come from the method
    classes now, and the README's rows are checked against them."""
    import re
    from pathlib import Path

    assert main(["methods"]) == 0
    joined = " ".join(x.strip() for x in capsys.readouterr().out.splitlines())
    assert "training-free: yes, or fine-tune; runs in: transformers, vLLM, SGLang, TGI, llama.cpp" in joined  # yarn
    assert "training-free: no: fine-tune; runs in: transformers, vLLM, SGLang, llama.cpp" in joined  # linear
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = re.findall(r"^\| \[`(\w+)`\][^|]*\|[^|]*\| ([^|]+) \| ([^|]+) \|$", readme, re.M)
    assert {name for name, _, _ in rows} == set(METHODS) - {"default"}
    for name, training_free, runs_in in rows:
        assert (METHODS[name].training_free, METHODS[name].runs_in) == (training_free, runs_in), name


def test_methods_verbose_adds_each_methods_parameters_and_defaults(capsys):
    assert main(["methods", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    assert out.count("parameters:") == len(METHODS)
    joined = " ".join(x.strip() for x in out.splitlines())
    assert "parameters: factor=<required>, beta_fast=32.0, beta_slow=1.0" in joined  # yarn's


def test_the_dtype_help_says_what_auto_picks_on_a_cpu(monkeypatch):
    """It said "bfloat16 on a CUDA device, float32 otherwise" while auto picks bf16 on a bf16 CPU."""
    from ropescale.cli.main import build_parser
    from ropescale.models.runtime import auto_dtype

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["search"]
    text = " ".join(next(a for a in sub._actions if a.dest == "dtype").help.split())
    monkeypatch.setenv("ROPESCALE_CPU_BF16", "1")
    assert auto_dtype("cpu") == "bfloat16" and "on a CPU with AMX or AVX512-BF16" in text
    monkeypatch.setenv("ROPESCALE_CPU_BF16", "0")
    assert auto_dtype("cpu") == "float32" and "float32 otherwise" in text
