"""Sliding-window perplexity: window layouts, chunked NLL and a brute-force reference."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from ropescale.scoring.perplexity import (
    PerplexityResult,
    Window,
    chunked_nll,
    evaluate_perplexity,
    sliding_windows,
)

BOS = 1


def _doc(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (n,), generator=g).tolist()


def _reference_layout(n: int, window: int, stride: int, mode: str, bos: bool) -> list[tuple[int, list[int]]]:
    """Independent restatement of the conventions: (window start, positions it scores)."""
    starts, s = [], 0
    while True:
        if s + window >= n:  # the last window is right-aligned to the end of the text
            starts.append(n - window)
            break
        starts.append(s)
        s += stride
    scored: set[int] = set()
    layout = []
    for b in starts:
        positions = [p for p in range(b, b + window) if (bos or p > b) and (mode == "longlora" or p not in scored)]
        scored.update(positions)
        layout.append((b, positions))
    return layout


def _brute_force(model, doc, window, stride, mode, bos_id):
    """Per-window NLL from the full model's logits, one scored position at a time."""
    out = []
    for b, positions in _reference_layout(len(doc), window, stride, mode, bos_id is not None):
        prefix = [] if bos_id is None else [bos_id]
        ids = torch.tensor([prefix + doc[b : b + window]])
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)  # [T, V]
        nll = 0.0
        for p in positions:
            i = p - b + len(prefix)  # index of token p in ids; it is predicted at index i - 1
            nll -= logp[i - 1, doc[p]].item()
        out.append((nll, len(positions)))
    return out


# --------------------------------------------------------------------------- window layouts


@pytest.mark.parametrize(
    "n, window, stride, mode, bos, expected",
    [
        (10, 4, 3, "yarn", True, [(0, 4, 0), (3, 7, 4), (6, 10, 7)]),
        (11, 4, 3, "yarn", True, [(0, 4, 0), (3, 7, 4), (6, 10, 7), (7, 11, 10)]),
        (11, 4, 3, "longlora", True, [(0, 4, 0), (3, 7, 3), (6, 10, 6), (7, 11, 7)]),
        (10, 4, None, "nonoverlap", True, [(0, 4, 0), (4, 8, 4), (6, 10, 8)]),
        (10, 4, 3, "yarn", False, [(0, 4, 1), (3, 7, 4), (6, 10, 7)]),
        (11, 4, 3, "longlora", False, [(0, 4, 1), (3, 7, 4), (6, 10, 7), (7, 11, 8)]),
        (8, 4, 4, "nonoverlap", False, [(0, 4, 1), (4, 8, 5)]),
        (7, 7, 2, "yarn", True, [(0, 7, 0)]),
        (600, 512, None, "yarn", True, [(0, 512, 0), (88, 600, 512)]),  # default stride 256
        (300, 100, None, "yarn", True, [(0, 100, 0), (100, 200, 100), (200, 300, 200)]),  # capped at window
    ],
)
def test_sliding_windows_known_layouts(n, window, stride, mode, bos, expected):
    assert sliding_windows(n, window, stride, mode, bos=bos) == [Window(*w) for w in expected]


@pytest.mark.parametrize("mode", ["yarn", "nonoverlap", "longlora"])
@pytest.mark.parametrize("n, window, stride", [(50, 50, 7), (97, 16, 5), (100, 20, 20), (101, 20, 1), (64, 9, 9)])
def test_windows_have_full_length_and_cover_the_text(mode, n, window, stride):
    if mode == "nonoverlap":
        stride = window
    windows = sliding_windows(n, window, stride, mode)
    assert all(w.end - w.begin == window for w in windows)
    assert windows[-1].end == n
    assert [w.begin for w in windows[:-1]] == list(range(0, stride * (len(windows) - 1), stride))
    counts = [0] * n
    for w in windows:
        assert w.begin <= w.score_from < w.end
        for p in range(w.score_from, w.end):
            counts[p] += 1
    if mode == "longlora":
        assert all(w.score_from == w.begin for w in windows)
        assert min(counts) >= 1
    else:  # every token scored exactly once
        assert counts == [1] * n
        without_bos = sliding_windows(n, window, stride, mode, bos=False)
        covered = sorted(p for w in without_bos for p in range(w.score_from, w.end))
        if mode == "yarn" and stride < window:
            assert covered == list(range(1, n))  # only the first token lacks context


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_tokens=50, window=64, stride=16), "larger than the text, which has 50 tokens"),
        (dict(n_tokens=100, window=64, stride=0), "stride must be a positive integer"),
        (dict(n_tokens=100, window=64, stride=-3), "stride must be a positive integer"),
        (dict(n_tokens=100, window=64, stride=65), "stride 65 is larger than window 64"),
        (dict(n_tokens=100, window=0, stride=1), "window must be a positive integer"),
        (dict(n_tokens=100, window=64, stride=16, mode="sliding"), "unknown perplexity mode 'sliding'"),
        (dict(n_tokens=100, window=64, stride=16, mode="nonoverlap"), "uses stride = window"),
    ],
)
def test_sliding_windows_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        sliding_windows(**kwargs)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- chunked NLL


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 40, 41, 1024])
def test_chunked_nll_equals_full_logits_loss(tiny_llama, chunk_size):
    vocab = tiny_llama.config.vocab_size
    ids = torch.tensor([[BOS] + _doc(40, vocab)])  # [1, 41]
    labels = ids.clone()
    labels[0, :5] = -100
    labels[0, 17:21] = -100
    nll, n = chunked_nll(tiny_llama, ids, labels, chunk_size)
    with torch.no_grad():
        out = tiny_llama(ids, labels=labels)
        logits = out.logits[0, :-1].float()  # [40, V]
        ref = F.cross_entropy(logits, labels[0, 1:], ignore_index=-100, reduction="sum").item()
    assert n == int((labels[0, 1:] != -100).sum())
    assert nll == pytest.approx(ref, rel=1e-5)
    assert nll == pytest.approx(out.loss.item() * n, rel=1e-5)


def test_chunked_nll_never_builds_more_than_chunk_size_logits(tiny_llama):
    rows = []
    hook = tiny_llama.lm_head.register_forward_hook(lambda mod, args, out: rows.append(out.shape[0]))
    try:
        ids = torch.tensor([[BOS] + _doc(60, tiny_llama.config.vocab_size)])
        labels = ids.clone()
        labels[0, :31] = -100  # score only the last 30 tokens
        _, n = chunked_nll(tiny_llama, ids, labels, chunk_size=8)
    finally:
        hook.remove()
    assert n == 30
    assert rows == [8, 8, 8, 6]  # only scored positions reach the LM head, 8 at a time


def test_chunked_nll_runs_the_loss_in_fp32_for_bf16_models(tiny_llama):
    model = copy.deepcopy(tiny_llama).to(torch.bfloat16)
    ids = torch.tensor([[BOS] + _doc(30, model.config.vocab_size)])
    nll, n = chunked_nll(model, ids, ids.clone(), chunk_size=7)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    assert math.isfinite(nll) and n == 30
    assert nll == pytest.approx(F.cross_entropy(logits, ids[0, 1:], reduction="sum").item(), rel=1e-4)


# --------------------------------------------------------------------------- sliding-window perplexity


@pytest.mark.parametrize(
    "n, window, stride, mode, bos",
    [
        (150, 64, 16, "yarn", True),  # ragged tail: (150 - 64) % 16 = 6
        (150, 64, 16, "yarn", False),
        (128, 64, 32, "yarn", True),  # no tail
        (150, 64, None, "nonoverlap", True),  # ragged tail
        (150, 64, None, "nonoverlap", False),
        (150, 48, 20, "longlora", True),  # ragged tail: (150 - 48) % 20 = 2
        (150, 48, 20, "longlora", False),
        (64, 64, 16, "yarn", True),  # one window: YaRN's truncated-document protocol
    ],
)
def test_perplexity_matches_brute_force(tiny_llama, n, window, stride, mode, bos):
    doc = _doc(n, tiny_llama.config.vocab_size, seed=n)
    bos_id = BOS if bos else None
    res = evaluate_perplexity(
        tiny_llama, doc, window, stride, mode=mode, bos_token_id=bos_id, chunk_size=13, progress=False
    )
    ref = _brute_force(tiny_llama, doc, window, res.stride, mode, bos_id)
    assert res.window_tokens == [k for _, k in ref]
    assert res.window_nll == pytest.approx([v for v, _ in ref], rel=1e-5)
    tokens = sum(k for _, k in ref)
    total = sum(v for v, _ in ref)
    assert res.tokens_scored == tokens
    assert res.total_nll == pytest.approx(total, rel=1e-5)
    assert res.ppl == pytest.approx(math.exp(total / tokens), rel=1e-5)
    mean_nll = sum(v / k for v, k in ref) / len(ref)
    assert res.mean_window_ppl == pytest.approx(math.exp(mean_nll), rel=1e-5)
    if bos and mode != "longlora":
        assert res.tokens_scored == n


def test_documents_are_evaluated_separately_and_aggregated(tiny_llama):
    vocab = tiny_llama.config.vocab_size
    docs = [_doc(100, vocab, seed=1), _doc(130, vocab, seed=2)]
    kw = dict(window=40, stride=15, bos_token_id=BOS, progress=False)
    both = evaluate_perplexity(tiny_llama, docs, **kw)
    each = [evaluate_perplexity(tiny_llama, d, **kw) for d in docs]
    assert both.n_documents == 2
    assert both.window_nll == each[0].window_nll + each[1].window_nll
    assert both.window_document == [0] * len(each[0].window_nll) + [1] * len(each[1].window_nll)
    assert both.tokens_scored == 230
    assert both.total_nll == pytest.approx(each[0].total_nll + each[1].total_nll, rel=1e-12)
    # Same documents as tensors.
    as_tensors = evaluate_perplexity(tiny_llama, [torch.tensor(d) for d in docs], **kw)
    assert as_tensors.window_nll == both.window_nll


def test_input_forms_and_max_tokens(tiny_llama):
    doc = _doc(120, tiny_llama.config.vocab_size, seed=3)
    kw = dict(window=32, stride=8, bos_token_id=BOS, progress=False)
    ref = evaluate_perplexity(tiny_llama, doc[:70], **kw)
    for form in (doc, torch.tensor(doc), torch.tensor([doc])):
        res = evaluate_perplexity(tiny_llama, form, max_tokens=70, **kw)
        assert res.window_nll == ref.window_nll
        assert res.tokens_scored == 70


def test_equal_windows_make_both_averages_agree(tiny_llama):
    doc = _doc(96, tiny_llama.config.vocab_size, seed=4)
    res = evaluate_perplexity(tiny_llama, doc, 32, mode="nonoverlap", bos_token_id=BOS, progress=False)
    assert res.stride == 32 and res.window_tokens == [32, 32, 32]
    assert res.mean_window_ppl == pytest.approx(res.ppl, rel=1e-9)


def test_result_to_dict_is_json(tiny_llama):
    doc = _doc(50, tiny_llama.config.vocab_size)
    res = evaluate_perplexity(tiny_llama, doc, 20, 10, bos_token_id=BOS, progress=False)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["mode"] == "yarn" and d["window"] == 20 and d["stride"] == 10 and d["bos_token_id"] == BOS
    assert d["tokens_scored"] == 50 and d["ppl"] == pytest.approx(res.ppl)
    assert d["nll_per_token"] == pytest.approx(math.log(res.ppl))
    assert isinstance(res, PerplexityResult) and res.tokens_per_second > 0


@pytest.mark.parametrize(
    "tokens, kwargs, message",
    [
        (50, dict(window=64), "window 64 is larger than the text, which has 50 tokens"),
        ([80, 30], dict(window=64), "window 64 is larger than document 1, which has 30 tokens"),
        (100, dict(window=64, max_tokens=40), "which has 40 tokens"),
        (100, dict(window=32, stride=0), "stride must be a positive integer"),
        (100, dict(window=32, stride=33), "stride 33 is larger than window 32"),
        (100, dict(window=32, mode="rolling"), "unknown perplexity mode 'rolling'"),
        (100, dict(window=1), "window must be at least 2 without a BOS"),
        ([], dict(window=4), "token_ids must be"),
    ],
)
def test_evaluate_perplexity_rejects_bad_input(tiny_llama, tokens, kwargs, message):
    vocab = tiny_llama.config.vocab_size
    if isinstance(tokens, int):
        data = _doc(tokens, vocab)
    else:
        data = [_doc(k, vocab) for k in tokens]
    with pytest.raises(ValueError, match=message) as info:
        evaluate_perplexity(tiny_llama, data, progress=False, **kwargs)
    assert "\n" not in str(info.value)
