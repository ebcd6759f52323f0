"""LongPPL against an independent transliteration of the authors' code (BlackieFang/LongPPL,
``LongPPL/longppl.py``: ``merge_intervals``, ``find_key_token``, ``cal_overlap``, ``perplexity``),
written here from that file, full logits and all, on tiny random models; and ``eval longppl`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ropescale.cli.main import main
from ropescale.evals.tasks.longppl import evaluator_spans, find_key_tokens, score_text
from tests.conftest import tiny_model

TEXT = " ".join(
    f"The quick brown fox {w} over the lazy dog {i}. A cat sat on the mat and looked at the rain."
    for i, w in enumerate(["jumps", "leaps", "runs", "walks", "hops", "skips"] * 3)
)


# ---- the authors' code, transliterated (thresholds as arguments, 2 and 2 there; no key_text file) ----
def ref_merge_intervals(intervals):
    if intervals.size(0) == 0:
        return intervals
    start = intervals[:, 0]
    end = intervals[:, 1]
    adjacent = (start[1:] - end[:-1]) == 0
    keep_start_mask = torch.cat([torch.tensor([True]), ~adjacent])
    merged_start = start[keep_start_mask]
    keep_end_mask = torch.cat([~adjacent, torch.tensor([True])])
    merged_end = end[keep_end_mask]
    return torch.stack([merged_start, merged_end], dim=1)


def ref_find_key_token(model, trunc_len, internal, tokenizer, input_text, alpha=2, beta=2):
    text_encoded = tokenizer(input_text, return_tensors="pt", return_offsets_mapping=True)
    input_ids = text_encoded["input_ids"]
    with torch.no_grad():
        output_full = model(input_ids)
    loss_f = torch.nn.CrossEntropyLoss(reduction="none")
    _, max_len = input_ids.shape
    key_tokens = []
    with torch.no_grad():
        for start_token in range(0, max_len - trunc_len, internal):
            if start_token + trunc_len + internal > max_len:
                internal = max_len - start_token - trunc_len
            input_ids_short = input_ids[:, start_token : start_token + trunc_len + internal]
            output_short = model(input_ids_short)
            loss_full = loss_f(
                output_full.logits[0, start_token + trunc_len - 1 : start_token + trunc_len + internal - 1, :],
                input_ids[0, start_token + trunc_len : start_token + trunc_len + internal],
            )
            loss_short = loss_f(
                output_short.logits[0, trunc_len - 1 : trunc_len + internal - 1, :],
                input_ids_short[0, trunc_len : trunc_len + internal],
            )
            loss_discrepancy = (torch.logical_and((loss_short - loss_full) > alpha, loss_full < beta)).squeeze()
            for i, is_key in enumerate(loss_discrepancy):
                if is_key:
                    key_tokens.append(start_token + trunc_len + i)
    return ref_merge_intervals(text_encoded["offset_mapping"][0, key_tokens]), key_tokens


def ref_cal_overlap(offset_mapping, key_text_slices):
    key_tokens = []
    i, j = 0, 0
    while i < len(offset_mapping) and j < len(key_text_slices):
        a_start, a_end = offset_mapping[i]
        b_start, b_end = key_text_slices[j]
        if a_start >= b_start and a_end <= b_end:
            key_tokens.append(i - 1)
            i += 1
        elif a_start < b_start:
            i += 1
        else:
            j += 1
    return key_tokens


def ref_perplexity(model, evaluator, tokenizer, input_text, trunc_len, internal, alpha=2, beta=2):
    enc = tokenizer(input_text, return_tensors="pt", add_special_tokens=False, return_offsets_mapping=True)
    input_ids, offset_mapping = enc["input_ids"], enc["offset_mapping"][0]
    key_text_slices, _ = ref_find_key_token(evaluator, trunc_len, internal, tokenizer, input_text, alpha, beta)
    key_tokens = ref_cal_overlap(offset_mapping, key_text_slices)
    with torch.no_grad():
        output_full = model(input_ids)
    loss_f = torch.nn.CrossEntropyLoss(reduction="none")
    loss_overall = loss_f(output_full.logits[0, :-1, :], input_ids[0, 1:]).to(torch.float).cpu().numpy()
    if key_tokens is None or len(key_tokens) == 0:
        return None, np.exp(loss_overall.mean()), None, input_ids.shape[-1]
    loss_key = loss_overall[key_tokens]
    return np.exp(loss_key.mean()), np.exp(loss_overall.mean()), len(key_tokens), input_ids.shape[-1]


# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(bytelevel_tokenizer):
    def make(seed):
        m = tiny_model(seed=seed, vocab_size=len(bytelevel_tokenizer), max_position_embeddings=512)
        with torch.no_grad():
            m.lm_head.weight.mul_(20.0)  # sharper predictions than random init's near-uniform ones
        return m

    return make(0), make(1)


@pytest.mark.parametrize(("alpha", "beta"), [(2.0, 2.0), (0.0, 8.0), (0.5, 12.0)])
def test_longppl_equals_the_authors_code(models, bytelevel_tokenizer, alpha, beta):
    model, evaluator = models
    tok = bytelevel_tokenizer
    n = len(tok(TEXT).input_ids)
    trunc_len, internal = 48, 20
    assert (n - trunc_len) % internal != 1  # the authors' squeeze() fails on a 1-token last window
    _, ref_keys = ref_find_key_token(evaluator, trunc_len, internal, tok, TEXT, alpha, beta)
    assert find_key_tokens(evaluator, tok(TEXT).input_ids, trunc_len, internal, alpha, beta) == ref_keys

    spans = evaluator_spans(evaluator, tok, TEXT, trunc_len, internal, alpha, beta)
    ours = score_text(model, tok, TEXT, spans)
    longppl, ppl, n_key, n_tok = ref_perplexity(model, evaluator, tok, TEXT, trunc_len, internal, alpha, beta)
    assert ours.ppl == pytest.approx(float(ppl), rel=1e-5) and ours.tokens == n_tok
    if longppl is None:
        assert ours.longppl is None and ours.key_tokens == 0 and alpha == 2.0
    else:
        assert ours.longppl == pytest.approx(float(longppl), rel=1e-5) and ours.key_tokens == n_key > 0


def test_eval_longppl_end_to_end(models, bytelevel_tokenizer, tmp_path, capsys):
    model_dir = tmp_path / "model"
    models[0].save_pretrained(model_dir)
    bytelevel_tokenizer.save_pretrained(model_dir)
    data = tmp_path / "doc.txt"
    data.write_text(TEXT * 3)
    out = tmp_path / "out"
    argv = ["eval", "longppl", "--model", str(model_dir), "--methods", "none,yarn", "--factor", "2"]
    argv += ["--lengths", "200", "--data", str(data), "--trunc-len", "64", "--internal", "32", "--device", "cpu"]
    assert main([*argv, "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["evaluator"]["default"] and {c["label"] for c in results["cells"]} == {"none", "yarn-x2"}
    for cell in results["cells"]:
        assert cell["length"] == 200 and cell["result"]["tokens"] == 200 and cell["result"]["ppl"] > 1
    assert "the evaluated model itself, unscaled (default)" in (out / "report.md").read_text()
    assert len(list((out / "keys").glob("*.json"))) == 1  # one evaluator pass, shared by both scalings
    mtimes = [p.stat().st_mtime_ns for p in sorted((out / "cells").glob("*.json"))]
    assert main([*argv, "--output", str(out)]) == 0  # a re-run skips finished cells
    assert [p.stat().st_mtime_ns for p in sorted((out / "cells").glob("*.json"))] == mtimes
    assert main([*argv[:-6], "--trunc-len", "300", "--device", "cpu", "--output", str(out)]) == 2
    assert "--trunc-len 300 must be below every length" in capsys.readouterr().err


def test_longppl_scaling_composes_only_when_asked():
    """``--method yarn --factor 2 --param compose=true``: on top of a shipped scaling (issue 51); without it
    the method replaces the shipped one. Before, ``compose`` was refused as a field of the scaling."""
    from ropescale.cli.eval_longppl import _scaling

    assert _scaling("yarn", 2.0, {"compose": True}, "--method").compose
    assert _scaling("yarn", 2.0, {}, "--method").start is None  # the run replaces a shipped scaling
    assert _scaling("yarn", 2.0, {"compose": True}, "--method").label != _scaling("yarn", 2.0, {}, "--method").label
