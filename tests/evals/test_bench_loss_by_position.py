"""The position-split perplexity benchmark: its buckets add up to the whole window, and the whole
window equals ropescale's own perplexity of that window (evaluate_perplexity, another code path)."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import load_script, squeezed


def test_buckets_cover_the_window_once():
    bench = load_script("benchmarks/bench_loss_by_position.py")
    assert bench.buckets(32768, [2048, 8192]) == [(0, 2048), (2048, 8192), (8192, 32768)]
    assert bench.buckets(100, [64, 128]) == [(0, 64), (64, 100)]  # edges past the window are dropped


def test_buckets_sum_to_the_window_and_match_evaluate_perplexity(model_dir, tmp_path, capsys):
    import torch

    import ropescale as rs
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.scoring.perplexity import evaluate_perplexity

    bench = load_script("benchmarks/bench_loss_by_position.py")
    data = tmp_path / "books"
    data.mkdir()
    (data / "Emma.txt").write_text(
        "Emma Woodhouse, handsome, clever, and rich, had lived nearly twenty-one years. " * 20
    )
    (data / "Other.txt").write_text("Not this one. " * 50)
    out = tmp_path / "out"
    argv = [f"a={model_dir}", f"b={model_dir}", "--length", "150", "--edges", "64,128", "--factor", "2"]
    assert bench.main([*argv, "--data", str(data), "--dtype", "float32", "--output", str(out)]) == 0
    printed = squeezed(capsys.readouterr().out)
    assert "| b | " in printed and "(1.000×)" in printed  # the same weights: ratio 1 in every bucket
    nll = json.loads((out / "a.json").read_text())["nll"]
    parts = [nll[k] for k in ("0-64", "64-128", "128-150")]
    assert sum(p["tokens"] for p in parts) == nll["0-150"]["tokens"] == 150
    assert sum(p["nll"] for p in parts) == pytest.approx(nll["0-150"]["nll"], rel=1e-5)

    # a re-run reuses each file; one measured otherwise is refused, naming what differs
    measured = (out / "a.json").stat().st_mtime_ns
    assert bench.main([*argv, "--data", str(data), "--dtype", "float32", "--output", str(out)]) == 0
    assert (out / "a.json").stat().st_mtime_ns == measured  # reused, not measured again
    shorter = [*argv[:2], "--length", "140", "--edges", "64,128", "--factor", "2", "--data", str(data)]
    assert bench.main([*shorter, "--dtype", "float32", "--output", str(out)]) == 2
    assert "a.json was measured with length 150, not 140" in capsys.readouterr().err
    was = json.loads((out / "a.json").read_text())
    (out / "a.json").write_text(json.dumps({**was, "tokens": "0" * 16}))  # as if other tokens were scored
    assert bench.main([*argv, "--data", str(data), "--dtype", "float32", "--output", str(out)]) == 2
    assert "a.json was measured with tokens '0000000000000000'" in capsys.readouterr().err

    tokenizer = rs.load_tokenizer(str(model_dir))
    doc = tokenize_documents(tokenizer, load_documents(str(data / "Emma.txt")), max_tokens=150)[0]
    model = rs.from_pretrained(str(model_dir), method="yarn", factor=2, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = evaluate_perplexity(model, [doc], window=150, mode="nonoverlap", bos_token_id=tokenizer.bos_token_id)
    assert ref.tokens_scored == 150
    assert math.exp(nll["0-150"]["nll"] / 150) == pytest.approx(ref.ppl, rel=1e-4)


def test_checkpoints_reading_the_text_as_other_tokens_are_refused(model_dir, tmp_path, capsys, monkeypatch):
    from ropescale.data import documents

    bench = load_script("benchmarks/bench_loss_by_position.py")
    data = tmp_path / "books"
    data.mkdir()
    (data / "Emma.txt").write_text("Emma Woodhouse, handsome, clever, and rich. " * 20)
    (data / "Other.txt").write_text("Not this one. " * 50)
    real, calls = documents.tokenize_documents, []

    def second_tokenizer_differs(tokenizer, docs, **kw):  # as a checkpoint with another vocabulary would
        ids = real(tokenizer, docs, **kw)
        calls.append(1)
        return ids if len(calls) == 1 else [[ids[0][0] + 1, *ids[0][1:]]]

    monkeypatch.setattr(documents, "tokenize_documents", second_tokenizer_differs)
    argv = [f"a={model_dir}", f"b={model_dir}", "--length", "64", "--edges", "32", "--data", str(data)]
    assert bench.main([*argv, "--dtype", "float32", "--output", str(tmp_path / "out")]) == 2
    assert "reads Emma as other tokens" in capsys.readouterr().err
    assert not (tmp_path / "out" / "a.json").exists()  # refused before anything is measured


def test_labels_name_files_inside_the_output_folder(tmp_path, capsys):
    bench = load_script("benchmarks/bench_loss_by_position.py")
    assert bench.file_name("no sentences") == "no-sentences"
    assert bench.file_name("../../etc/x") == "etc-x"
    assert bench.file_name("/") == "checkpoint"
    assert bench.main(["a b=x", "a/b=y", "--output", str(tmp_path / "out")]) == 2  # both would write a-b.json
    assert "two labels name the same file" in capsys.readouterr().err and not (tmp_path / "out").exists()
