"""The GPU perplexity benchmark's code, run on the CPU with a tiny model (the GPU numbers come from
running it on a GPU machine): both variants must score the very same tokens, so their perplexities
agree — a check that the comparison is fair, not a timing."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import load_script

TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 40


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_gpu_perplexity.py")


def test_both_variants_score_the_same_tokens(bench, model_dir, tmp_path, capsys):
    data = tmp_path / "t.txt"
    data.write_text(TEXT)
    code = bench.main(
        [
            "--model",
            str(model_dir),
            "--device",
            "cpu",
            "--lengths",
            "128,512",
            "--repeats",
            "1",
            "--data",
            str(data),
            "--output",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["length"] for r in results["ratios"]] == [128, 512]
    for length in (128, 512):
        ppl = {r["variant"]: r["ppl"] for r in results["rows"] if r["length"] == length}
        assert ppl["ropescale"] == pytest.approx(ppl["native"], rel=1e-4)
    assert "ropescale/native tokens/s" in out


def test_no_gpu_and_non_native_methods_fail_in_one_line(bench, model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the no-GPU path, on any machine
    assert bench.main(["--model", str(model_dir)]) == 2  # device auto on a machine without CUDA
    data = tmp_path / "t.txt"
    data.write_text(TEXT)
    assert (
        bench.main(
            [
                "--model",
                str(model_dir),
                "--device",
                "cpu",
                "--method",
                "dynamic_yarn",
                "--lengths",
                "128",
                "--data",
                str(data),
            ]
        )
        == 2
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("bench_gpu_perplexity:")]
    assert len(err) == 2 and "no CUDA device" in err[0] and "not native to transformers" in err[1]
