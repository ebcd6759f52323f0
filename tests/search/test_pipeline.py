"""A whole search on a tiny random Llama: every recorded score is its candidate's own, constraints hold, the written config reloads in plain transformers with the searched candidate's
logits and perplexity, resumes without recomputing, calibration and held-out texts stay apart."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers

import ropescale
from ropescale.patching.plan import original_spec
from ropescale.search import SearchOptions, Text, load_search, search_model
from ropescale.search.engine import best_of
from ropescale.search.objective import make_windows, score_windows, spread_positions
from ropescale.search.space import LongRopeSpace
from tests.conftest import squeezed, tiny_model

TARGET = 256  # L = 64, factor 4


def _tokens(seed: int, n: int = 1200) -> list[int]:
    """Made-up text: a repeating phrase with noise, so context helps a little even in a random model."""
    g = torch.Generator().manual_seed(seed)
    phrase = torch.randint(2, 128, (37,), generator=g)
    ids = phrase.repeat(n // 37 + 1)[:n]
    noise = torch.rand(n, generator=g) < 0.2
    ids[noise] = torch.randint(2, 128, (int(noise.sum()),), generator=g)
    return ids.tolist()


CAL, HELD = Text("calibration", "test", _tokens(1)), Text("held-out", "test", _tokens(2))


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    model = tiny_model()
    options = SearchOptions(
        target_length=TARGET,
        model="tiny",
        budget=10,
        eval_length=96,
        windows=2,
        layout="contiguous",
        report_lengths=(TARGET,),
    )
    report = search_model(model, CAL, HELD, options, out, bos_token_id=1, progress=False)
    return out, model, report, options


def test_every_recorded_score_is_its_candidates_own(searched):
    """Unlike "the best is no worse than the seeds" (true by construction: seeds are candidates),
    this fails if the history pairs a candidate with a score the objective gave another one: every
    recorded candidate is re-scored from scratch (candidates differ by ~1e-3 in perplexity here)."""
    out, _, _, _ = searched
    history = json.loads((out / "history.json").read_text())["candidates"]
    space = LongRopeSpace(original_spec(tiny_model().config), 4.0, floor=True)
    windows = make_windows(CAL.tokens, 96, 2, "contiguous", TARGET, bos_token_id=1)
    scores = []
    for c in history:
        fresh = ropescale.patch(tiny_model(), "longrope", **space.method_params(c["params"]))
        scores.append(score_windows(fresh, windows).ppl)
    assert scores == pytest.approx([c["score"]["ppl"] for c in history], rel=1e-7, abs=0)
    assert len(set(scores)) > 1  # the candidates do score differently, so a swap would show


def test_constraints_hold_and_the_best_rescores_the_same(searched):
    out, model, report, options = searched
    history = json.loads((out / "history.json").read_text())["candidates"]
    assert len(history) == 10
    seeds = [c for c in history if c["origin"].startswith("seed:")]
    assert [c["origin"] for c in seeds] == ["seed:linear", "seed:ntk", "seed:yarn"]
    best = best_of(history)
    space = LongRopeSpace(original_spec(tiny_model().config), 4.0, floor=True)
    for c in history:
        assert space.violations(c["params"]) == []
    # the winner really scores what was recorded: re-scored from scratch on the calibration windows
    fresh = ropescale.patch(tiny_model(), "longrope", **space.method_params(best["params"]))
    windows = make_windows(CAL.tokens, 96, 2, "contiguous", TARGET, bos_token_id=1)
    assert score_windows(fresh, windows).ppl == pytest.approx(best["score"]["ppl"], rel=1e-6)
    assert report["best"]["index"] == best["index"]


def test_written_config_reloads_in_plain_transformers_with_the_same_logits(searched, tmp_path):
    out, model, _, _ = searched
    rope = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "longrope" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 64
    assert rope["short_factor"] == rope["long_factor"]  # short="long": one schedule at every length
    # plain transformers: the saved config plus the original weights
    weights = tmp_path / "weights"
    tiny_model().save_pretrained(weights)
    config = transformers.AutoConfig.from_pretrained(out)
    plain = transformers.AutoModelForCausalLM.from_pretrained(weights, config=config).eval()
    assert config.max_position_embeddings == TARGET
    best = json.loads((out / "best.json").read_text())
    direct = ropescale.patch(tiny_model(), "longrope", **best["params"])
    ids = torch.tensor([_tokens(3, 200)])  # 200 tokens > L: the long factors apply
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            model(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-5
        )  # left patched with the best
        short = ids[:, :50]  # within L: the same searched schedule, nothing switches at L
        torch.testing.assert_close(plain(short).logits, direct(short).logits, rtol=1e-5, atol=1e-5)
        static = ropescale.patch(tiny_model(), "default")  # plain RoPE: the schedule does act below L
        assert not torch.allclose(plain(short).logits, static(short).logits, atol=1e-3)


def test_report_keeps_texts_apart_and_counts_tokens(searched):
    out, _, report, _ = searched
    assert report["calibration_text"]["title"] == "calibration" and report["heldout_text"]["title"] == "held-out"
    assert report["calibration_tokens"] == 192
    columns = {c["key"]: c for c in report["columns"]}
    assert columns["calibration"]["tokens"] == 192
    assert columns["calibration-protocol"]["tokens"] == 192 and columns[f"contiguous-{TARGET}"]["tokens"] == TARGET
    rows = {r["label"]: r["values"] for r in report["rows"]}
    assert set(rows) == {"searched", "linear", "ntk", "dynamic_ntk", "yarn"}
    # every cell is filled, except the calibration value of methods that are no seed as such:
    # dynamic NTK is not a seed, and the NTK seed was projected onto the floor (λ_i >= s past pair 3)
    missing = {(label, k) for label, r in rows.items() for k, v in r.items() if v is None}
    assert missing == {("dynamic_ntk", "calibration"), ("ntk", "calibration")}
    md = squeezed((out / "report.md").read_text())
    assert "192 tokens scored per candidate" in md and "| searched |" in md
    assert (out / "factors.png").stat().st_size > 1000


def test_resume_recomputes_nothing(searched, monkeypatch):
    out, model, report, options = searched
    from ropescale.search import objective as objective_module

    def boom(*args, **kwargs):
        raise AssertionError("a recorded candidate or held-out cell was evaluated again")

    monkeypatch.setattr(objective_module, "window_nll", boom)
    monkeypatch.setattr("ropescale.scoring.perplexity.evaluate_perplexity", boom)
    again = search_model(model, CAL, HELD, options, out, bos_token_id=1, progress=False)
    assert again["rows"] == report["rows"]
    # fewer report lengths, or more budget-free changes to the report, reuse the same cells too
    fewer = search_model(
        model, CAL, HELD, dataclasses.replace(options, report_lengths=()), out, bos_token_id=1, progress=False
    )
    assert [r["values"]["calibration-protocol"] for r in fewer["rows"]] == [
        r["values"]["calibration-protocol"] for r in report["rows"]
    ]
    # ... and the report still shows every cell measured in the folder
    assert fewer["rows"] == report["rows"] and fewer["columns"] == report["columns"]
    only_yarn = search_model(
        model,
        CAL,
        HELD,
        dataclasses.replace(options, baselines=("yarn",), report_lengths=()),
        out,
        bos_token_id=1,
        progress=False,
    )
    assert [r["label"] for r in only_yarn["rows"]] == ["searched", "yarn", "linear", "ntk", "dynamic_ntk"]
    assert only_yarn["rows"][2:] == [r for r in report["rows"] if r["label"] not in ("searched", "yarn")]


def test_load_search_plugs_into_patch(searched):
    out, _, report, _ = searched
    result = load_search(out)
    assert result.method == "longrope" and result.params["factor"] == 4.0
    assert result.calibration_ppl == report["best"]["ppl"]
    patched = ropescale.patch(tiny_model(), replace=True, **result.patch_kwargs())
    assert patched.config.rope_parameters["long_factor"] == result.params["long_factor"]
    entry = result.suite_entry()
    assert entry["method"] == "longrope" and entry["factor"] == 4.0 and "factor" not in entry["params"]
    # scaling.yaml is a suite's methods entry as written (and a training recipe's scaling section)
    import yaml

    from ropescale.evals.suite.parse import suite_from_dict

    scaling = yaml.safe_load((out / "scaling.yaml").read_text())
    assert scaling == {k: v for k, v in entry.items() if k != "label"}
    suite = suite_from_dict(
        {"model": "tiny", "methods": [{**scaling, "label": "searched"}], "perplexity": {"lengths": [128]}}
    )
    assert suite.methods[0].params["long_factor"] == result.params["long_factor"]


def test_spread_layout_and_yarn_search(tmp_path):
    assert spread_positions(8, 20, 2) == [0, 1, 2, 3, 16, 17, 18, 19]
    windows = make_windows(CAL.tokens, 64, 1, "spread", TARGET, chunks=4, bos_token_id=1)
    assert windows[0].position_ids[0] == 0 and windows[0].position_ids[-1] == TARGET - 1
    model = tiny_model()
    options = SearchOptions(
        target_length=TARGET,
        model="tiny",
        method="yarn",
        budget=5,
        eval_length=64,
        layout="spread",
        baselines=("yarn",),
    )
    report = search_model(model, CAL, HELD, options, tmp_path, bos_token_id=1, progress=False)
    history = json.loads((tmp_path / "history.json").read_text())["candidates"]
    assert best_of(history)["score"]["ppl"] <= history[0]["score"]["ppl"]  # seed: YaRN's defaults
    rope = json.loads((tmp_path / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert report["settings"]["layout"] == "spread" and report["calibration_tokens"] == 64
    assert {r["label"]: r["values"]["calibration"] for r in report["rows"]}["yarn"] == history[0]["score"]["ppl"]


def test_seeds_with_a_fixed_attention_factor_are_not_reported_as_the_methods(tmp_path):
    options = SearchOptions(
        target_length=TARGET,
        model="tiny",
        budget=3,
        eval_length=96,
        attention="yarn",
        baselines=("linear", "yarn"),
        heldout=False,
    )
    report = search_model(tiny_model(), CAL, HELD, options, tmp_path, bos_token_id=1, progress=False)
    history = json.loads((tmp_path / "history.json").read_text())["candidates"]
    assert all("attention factor fixed at 1.13863" in c["note"] for c in history)
    # PI with YaRN's temperature is not PI: no calibration value in the linear row
    assert {r["label"]: r["values"]["calibration"] for r in report["rows"]} == {
        "searched": best_of(history)["score"]["ppl"],
        "linear": None,
        "yarn": None,
    }


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"target_length": 64}, "must exceed the model's original context 64"),
        ({"eval_length": 64}, "must exceed the original context 64"),
        ({"eval_length": 512}, "larger than the target length"),
        ({"budget": 0}, "budget must be an integer >= 1"),
        ({"layout": "random"}, "layout must be one of contiguous, spread"),
        ({"method": "linear"}, "search method must be one of longrope, yarn"),
    ],
)
def test_bad_options(tmp_path, overrides, message):
    options = SearchOptions(**{"target_length": TARGET, "eval_length": 128, "budget": 2, **overrides})
    with pytest.raises(ValueError, match=message):
        search_model(tiny_model(), CAL, HELD, options, tmp_path, bos_token_id=1, progress=False)
