"""The frontier: verdicts against the native model, the Pareto front, the report, the suite it runs,
and ``ropescale recommend`` choosing from a model's own measured frontier."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ropescale.cli.main import main
from ropescale.evals.advice.evidence import Evidence, Measured, load_measured, load_results
from ropescale.evals.advice.frontier import (
    OPTIONAL,
    format_frontier,
    frontier_choice,
    frontier_suite,
    plot_frontier,
    verdicts,
    with_rows,
)
from ropescale.evals.advice.recommend import recommend
from ropescale.evals.advice.recommend_text import format_recommendation, format_short
from ropescale.evals.suite.parse import suite_from_dict
from tests.conftest import squeezed

L = 8192


def _row(label, ppl, passkey=None, trials=4, factor=2.0, method=None, **params):
    passkey = passkey or {}
    return Measured(
        label, method or label, factor, params, ppl, passkey, {n: trials for n in passkey} if trials else {}
    )


NATIVE = _row("none", {2048: 28.0, 8192: 30.0, 16384: 60.0}, {4096: 1.0, 8192: 0.75}, factor=None, method="default")


def _evidence(*rows, model="m"):
    return Evidence("src.json", model, "note", (NATIVE, *rows))


def _by_label(found):
    return {v.row.label: v for v in found}


def test_verdicts_read_each_method_against_native_at_L():
    ev = _evidence(
        _row("holds", {2048: 28.1, 8192: 30.1, 16384: 30.2}, {4096: 1.0, 8192: 1.0, 16384: 1.0}),
        _row("drifts", {16384: 30.4}, {16384: 1.0}),  # 1.33% over native at 8k
        _row("short_cost", {2048: 28.5, 16384: 30.0}, {16384: 1.0}),  # +1.8% at 2k
        _row("forgets", {16384: 30.0}, {16384: 0.0}),  # 0/4: interval [0, 0.49] below native 0.75
        _row("half", {16384: 30.0}, {16384: 0.5}),  # 2/4: interval reaches 0.75, not shown lost
        _row("other_factor", {16384: 30.0}, {16384: 1.0}, factor=4.0),
    )
    ref, found = verdicts(ev, L, 16384)
    assert (ref.ppl_length, ref.ppl, ref.passkey_length, ref.passkey) == (8192, 30.0, 8192, 0.75)
    v = _by_label(found)
    assert "other_factor" not in v  # measured at ×4, the question is ×2
    assert v["holds"].keeps_both and v["holds"].ppl_ratio == pytest.approx(30.2 / 30.0)
    assert v["drifts"].keeps_ppl is False and v["drifts"].keeps_retrieval
    assert v["short_cost"].keeps_ppl is False and v["short_cost"].short_ratio == pytest.approx(28.5 / 28.0)
    assert v["forgets"].keeps_ppl and v["forgets"].keeps_retrieval is False
    assert v["half"].keeps_retrieval is True
    # the front on (worst of long/short ratio, worst passkey): holds (1.007, 1.0) and half (1.0, 0.5);
    # short_cost (1.018, 1.0) and drifts (1.013, 1.0) are beaten by holds, forgets (1.0, 0.0) by half
    assert v["short_cost"].worst_ratio == pytest.approx(28.5 / 28.0)
    assert {k for k, x in v.items() if x.pareto} == {"holds", "half"}


def test_without_trials_the_point_estimate_decides_and_unmeasured_is_not_a_verdict():
    ev = _evidence(
        _row("point", {16384: 30.0}, {16384: 0.7}, trials=0),
        _row("ppl_only", {16384: 30.0}),
        _row("short_only", {2048: 28.0}, {4096: 1.0}, factor=None),
    )
    v = _by_label(verdicts(ev, L, 16384)[1])
    partial = _evidence(
        _row("full", {32768: 30.0}, {32768: 1.0}, factor=4.0), _row("half_way", {16384: 30.0}, {16384: 1.0}, factor=4.0)
    )
    w = _by_label(verdicts(partial, L, 32768)[1])
    assert w["full"].keeps_both and w["half_way"].keeps_ppl is None and w["half_way"].keeps_retrieval is None
    assert w["full"].pareto and not w["half_way"].pareto  # not measured at 32k: not placed against those that were
    assert v["point"].keeps_retrieval is False  # 0.7 < 0.75 and no interval to widen it
    assert v["ppl_only"].keeps_retrieval is None and not v["ppl_only"].keeps_both
    assert v["short_only"].keeps_ppl is None  # nothing beyond L measured: no verdict, not "kept"
    assert verdicts(Evidence("s", "m", "n", (v["point"].row,)), L, 16384) == (None, [])  # no native row


def test_frontier_choice_prefers_the_surest_retrieval_then_the_lowest_ratio_among_those_keeping_both():
    a = _row("a", {16384: 30.25}, {16384: 1.0})  # 4/4: Wilson floor 0.51
    b = _row("b", {16384: 29.9}, {16384: 0.75})  # 3/4: floor 0.30, though a lower ratio
    c = _row("c", {16384: 29.0}, {16384: 0.0})  # best ratio, but loses retrieval
    verdict, ev, ref = frontier_choice([_evidence(a, b, c)], L, 16384)
    assert verdict.row.label == "a" and ref.ppl == 30.0 and verdict.passkey_floor == pytest.approx(0.51, abs=0.01)
    a2 = _row("a2", {16384: 30.1}, {16384: 1.0})  # the same retrieval: the lower ratio decides
    assert frontier_choice([_evidence(a, a2, b)], L, 16384)[0].row.label == "a2"
    assert frontier_choice([_evidence(c)], L, 16384) is None
    assert frontier_choice([_evidence(a)], L, 32768) is None  # no row at ×4


def test_frontier_choice_prefers_a_sample_to_a_hint():
    """A row whose every passkey length has >= 25 prompts beats a lower ratio resting on 4."""
    hint = _row("hint", {16384: 29.9}, {16384: 0.75}, trials=4)
    sample = _row("sample", {16384: 30.2}, {16384: 27 / 30}, trials=30)
    verdict, _, _ = frontier_choice([_evidence(hint, sample)], L, 16384)
    assert verdict.row.label == "sample" and verdict.confirmed
    lost = _row("lost", {16384: 30.2}, {16384: 0.3}, trials=30)  # a sample that shows the loss does not win
    assert frontier_choice([_evidence(hint, lost)], L, 16384)[0].row.label == "hint"


def test_report_and_plot(tmp_path):
    ev = _evidence(_row("holds", {16384: 30.1}, {4096: 1.0, 16384: 1.0}), _row("drifts", {16384: 33.0}, {16384: 1.0}))
    text = squeezed(format_frontier(ev, L, 16384))
    assert "| **holds ×2** | 1.003 |" in text and "| drifts ×2 | 1.100 |" in text
    assert "1.00 · 4 [0.51, 1.00]" in text and "Keeps both: holds ×2." in text
    png = plot_frontier(ev, L, 16384, tmp_path / "f.png")
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    assert plot_frontier(_evidence(), L, 16384, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_plot_labels_of_close_methods_do_not_overlap(tmp_path, monkeypatch):
    """Four methods within 0.3% of each other at one accuracy, a fifth just below (the ×4 frontier's
    crowd at ratio 1.00): every label's text, as the renderer measures it, clear of every other, of
    the legend and inside the axes. The fixed offsets before printed the first and third over each other."""
    import itertools

    from matplotlib.text import Text

    import ropescale.plots

    figures = []
    real = ropescale.plots.save_png
    monkeypatch.setattr(ropescale.plots, "save_png", lambda fig, p, **kw: figures.append(fig) or real(fig, p, **kw))
    close = [
        _row(f"method-{i}", {2048: 28.0, 16384: 30.0 * (1.001 + i / 1000)}, {4096: 1.0, 16384: 0.75}) for i in range(4)
    ]
    below = _row("below", {16384: 30.05}, {4096: 1.0, 16384: 0.7}, trials=30)
    assert plot_frontier(_evidence(*close, below), L, 16384, tmp_path / "f.png").is_file()
    ax = figures[-1].axes[0]
    figures[-1].canvas.draw()
    notes = {t.get_text(): Text.get_window_extent(t) for t in ax.texts}
    assert set(notes) == {"method-0 ×2", "method-1 ×2", "method-2 ×2", "method-3 ×2", "below ×2"}
    boxes = [*notes.values(), ax.get_legend().get_window_extent()]
    assert not [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]
    frame = ax.get_window_extent()
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)


def test_frontier_suite_lengths_candidates_and_validation():
    raw = frontier_suite("smollm2-135m", L, 32768, ["self_extend", "string-yarn"], trials=2)
    assert raw["perplexity"]["lengths"] == [2048, 8192, 16384, 32768]
    assert raw["passkey"]["lengths"] == [4096, 8192, 16384, 32768] and raw["passkey"]["trials"] == 2
    labels = [m.get("label", m["method"]) for m in raw["methods"]]
    assert labels == ["none", "self_extend", "string-yarn"] and raw["methods"][1]["factor"] == 4.0
    assert raw["methods"][0]["only"] == {"passkey": [4096, 8192]}  # native retrieval only where it is the reference
    suite = suite_from_dict(raw)  # every method plans on the real registry
    assert len(suite.cells()) == 4 + 2 + 2 * (4 + 4)
    assert frontier_suite("m", L, 20000)["perplexity"]["lengths"] == [2048, 8192, 16384, 20000]
    with pytest.raises(ValueError, match="unknown frontier candidate 'selfextend'"):
        frontier_suite("m", L, 16384, ["selfextend"])
    named = frontier_suite("m", L, 32768, ["self_extend-logn", "dca-logn"])["methods"][1:]  # only when named
    assert [(m["label"], m["params"]) for m in named] == [
        ("self_extend-logn", {"logn": True}),
        ("dca-logn", {"logn": True}),
    ]
    assert "self_extend-logn" not in [m.get("label") for m in frontier_suite("m", L, 32768)["methods"]]
    suite_from_dict(frontier_suite("smollm2-135m", L, 32768, ["self_extend-logn", "dca-logn"]))
    variants = frontier_suite("m", L, 32768, ["dca-flash", "self_extend-float", "string-yarn-own-factor"])["methods"]
    assert [(m["method"], m["params"]) for m in variants[1:]] == [
        ("dca", {"variant": "chunkllama_flash"}),  # ChunkLlama's flash_decoding_chunkllama.py
        ("self_extend", {"shift": "float"}),  # LongLM's self_extend_patch/Llama.py
        ("string", {"frequencies": "yarn", "temperature": "frequencies"}),
    ]
    suite_from_dict(frontier_suite("smollm2-135m", L, 32768, list(OPTIONAL)))  # every one plans


def test_results_and_measurements_carry_passkey_trials(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    cell = {"accuracy": [[1.0, 0.0]], "depths": [0.2, 0.8], "trials": 3, "length_trials": {"4096": 6}}
    (folder / "results.json").write_text(json.dumps({"model": "m", "tasks": {"passkey": {"none": {"4096": cell}}}}))
    (row,) = load_results(folder / "results.json").rows
    assert row.passkey == {4096: 0.5} and row.passkey_trials == {4096: 6}
    # a cell in progress: depth 0.2 has 2 of 2, depth 0.8 0 of 1: pooled 2/3, not the depths' mean 0.5
    cell = {"accuracy": [[1.0, 0.0]], "depths": [0.2, 0.8], "trials": 2, "length_trials": {"4096": 3}}
    cell.update(length_accuracy={"4096": 2 / 3}, partial={"prompts": 3, "of": 4})
    (folder / "results.json").write_text(json.dumps({"model": "m", "tasks": {"passkey": {"none": {"4096": cell}}}}))
    (row,) = load_results(folder / "results.json").rows
    assert row.passkey == {4096: 2 / 3} and row.passkey_trials == {4096: 3}

    bad = tmp_path / "m.json"
    entry = {"command": "ropescale methods", "passkey": {"4096": 1.0}, "passkey_trials": {"8192": 4}}
    bad.write_text(
        json.dumps(
            {"model": "m", "original_context": 1024, "note": "n", "rows": [{"method": "yarn", "measured": [entry]}]}
        )
    )
    with pytest.raises(Exception, match=r"passkey_trials: length 8192 has no passkey accuracy"):
        load_measured(bad)


def test_recommend_takes_the_frontier_of_this_model_only():
    own = _evidence(_row("self_extend", {16384: 30.1}, {4096: 1.0, 16384: 1.0}, group_size=3), model="me")
    rec = recommend("me", L, 16384, evidence=[own])
    assert (rec.method, rec.factor, rec.params) == ("self_extend", 2.0, {"group_size": 3})
    text = format_recommendation(rec)
    assert "recommendation:  self_extend ×2, group_size=3, training-free" in text
    assert "--method self_extend --target-length 16384 --param group_size=3" in text
    assert "alternative:" in text and "--method dynamic_ntk" in text and "cannot express it" in text

    other = recommend("someone-else", L, 16384, evidence=[own])  # another model's frontier does not decide
    assert other.method == "dynamic_ntk" and "ropescale eval frontier --model someone-else" in other.reasons[0]
    assert recommend("me", L, 16384, budget="fine-tune", evidence=[own]).method == "yarn"


def test_the_shipped_frontier_decides_the_embedded_models_2x():
    from ropescale.evals.advice.evidence import shipped_evidence

    rec = recommend("smollm2-135m", L, 16384, evidence=list(shipped_evidence()))
    assert (rec.method, rec.factor) == ("self_extend", 2.0)
    assert "evals/measured/smollm2-135m-frontier.json" in rec.reasons[0]
    at_4x = recommend("smollm2-135m", L, 32768, evidence=list(shipped_evidence()))
    # the 30-prompt frontier: Self-Extend G 8 + logn is the one row measured at every length that keeps both
    assert (at_4x.method, at_4x.factor) == ("self_extend", 4.0)
    assert at_4x.params == {"group_size": 8, "window": 1024, "logn": True}
    assert "evals/measured/smollm2-135m-frontier-30-jitter.json" in at_4x.reasons[0]
    assert "30 prompts per length" in at_4x.reasons[0] and "only not shown lost" not in at_4x.reasons[0]
    # spread needles (the shipped 30-prompt frontier) need no caveat; fixed-depth cells say what their 30 prompts weigh
    assert not any("fixed depths" in c for c in at_4x.caveats)
    fixed = [dataclasses.replace(e, passkey_jitter=0.0) for e in shipped_evidence()]
    caveats = recommend("smollm2-135m", L, 32768, evidence=fixed).caveats
    assert any("place their needles at fixed depths" in c for c in caveats)
    assert recommend("smollm2-135m", L, 65536, evidence=list(shipped_evidence())).method == "yarn"  # none at ×8


def test_cli_report_from_results_and_dry_run(capsys, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()

    def cell(acc):
        return {"accuracy": [acc], "depths": [0.2, 0.8], "trials": 1}

    tasks = {
        "perplexity": {"none": {"2048": {"ppl": 28.0}, "8192": {"ppl": 30.0}}, "se": {"16384": {"ppl": 30.1}}},
        "passkey": {"none": {"8192": cell([1.0, 1.0])}, "se": {"16384": cell([1.0, 1.0])}},
    }
    (folder / "results.json").write_text(json.dumps({"model": "smollm2-135m", "tasks": tasks}))
    (folder / "suite.yaml").write_text("methods:\n- {method: none}\n- {method: self_extend, factor: 2, label: se}\n")
    assert main(["eval", "frontier", "--results", str(folder), "--target-length", "16384"]) == 0
    out = capsys.readouterr().out  # the answer first: who keeps both, the best with its numbers, where the rest is
    out = "\n".join(line for line in out.splitlines() if not line.startswith("ropescale: converting"))  # first use
    assert out.startswith("frontier at ×2 (16k), smollm2-135m: keeps perplexity and retrieval: se ×2\n")
    assert "best:   se ×2 (worst PPL 1.003× native; passkey ≥ 1.00, 2 prompts per length)" in out
    assert len(out.strip().splitlines()) <= 5 and "|" not in out and "--verbose" in out
    assert main(["eval", "frontier", "--results", str(folder), "--target-length", "16384", "--verbose"]) == 0
    out = squeezed(capsys.readouterr().out)
    assert "| **se ×2** | 1.003 |" in out and (folder / "frontier.md").is_file() and (folder / "frontier.png").is_file()

    assert main(["eval", "frontier", "--target-length", "16384", "--methods", "dca", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "method: dca" in out and "self_extend" not in out and "jitter: 0.0" in out  # fixed, said (default: spread)
    assert (
        main(["eval", "frontier", "--target-length", "16384", "--methods", "dca", "--jitter", "0.1", "--dry-run"]) == 0
    )
    assert "jitter: 0.1" in capsys.readouterr().out
    assert main(["eval", "frontier", "--target-length", "16384", "--methods", "dcaa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown frontier candidate 'dcaa'" in err[0]


def test_cli_runs_the_suite_on_a_tiny_model(capsys, model_dir, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("It is a truth universally acknowledged, that a single man must be in want of a wife. " * 80)
    out = tmp_path / "frontier"
    argv = ["eval", "frontier", "--model", str(model_dir), "--target-length", "512", "--methods", "self_extend"]
    argv += ["--data", str(data), "--depths", "0.5", "--max-tokens", "64", "--output", str(out), "--no-progress"]
    argv += ["--verbose"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "# Frontier at ×2 (512)" in text and "self_extend ×2" in text
    results = json.loads((out / "results.json").read_text())
    assert results["cells_finished"] == results["cells_total"] == (3 + 2) + (3 + 3)
    assert (out / "frontier.md").read_text().startswith("# Frontier at ×2")


def test_recommend_shipped_frontier_in_a_few_lines():
    """The embedded model at 32k, default output: the method, why with its prompt count and source,
    the portable alternative for engines, and the RULER battery's line (each method's tasks past L, the
    tasks beyond the model), in at most 16 lines."""
    from ropescale.evals.advice.evidence import shipped_evidence

    rec = recommend("smollm2-135m", 8192, 32768, evidence=list(shipped_evidence()))
    out = format_short(rec)
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= 16, out
    assert lines[0].startswith("recommendation:  self_extend ×4")
    assert "30 prompts per length" in out and "evals/measured/smollm2-135m-frontier-30-jitter.json" in out
    assert "for vLLM, SGLang, TGI, llama.cpp" in out
    assert "--method yarn --target-length 32768" in out and "measured with:" not in out


def test_retrieval_within_L_is_read_against_native_at_the_same_length_and_the_bar_part_by_part():
    """At 4k the native model scores 1.0 (NATIVE): a method at 0.5 there on 30 prompts is shown
    below it (Wilson [0.33, 0.67]), though it would pass against native at 8k (0.75)."""
    ev = _evidence(
        _row("regresses", {2048: 28.1, 16384: 30.1}, {4096: 0.5, 8192: 1.0, 16384: 1.0}, trials=30),
        _row("holds", {2048: 28.1, 16384: 30.4}, {4096: 1.0, 8192: 0.8, 16384: 0.7}, trials=30),
    )
    ref, found = verdicts(ev, L, 16384)
    v = _by_label(found)
    assert (ref.passkey_bar(4096), ref.passkey_bar(8192), ref.passkey_bar(16384)) == (1.0, 0.75, 0.75)
    assert v["regresses"].keeps_retrieval is False and v["holds"].keeps_retrieval is True
    text = squeezed(format_frontier(ev, L, 16384))
    assert "| method | PPL beyond 8k ≤ 1.01× native 8k | PPL ≤ 8k ≤ 1.01× native | passkey 4k ≥ 1.00 |" in text
    # point estimates: holds misses PPL (1.013×) and 16k (0.70 < 0.75) though its intervals keep retrieval
    assert "| holds ×2 | ✗ 1.013× | ✓ 1.004× | ✓ 1.00 (30/30) | ✓ 0.80 (24/30) | ✗ 0.70 (21/30) |" in text
    assert "| regresses ×2 | ✓ 1.003× | ✓ 1.004× | ✗ 0.50 (15/30) |" in text


def test_fine_tuned_rows_are_shown_beside_the_frontier_never_chosen(tmp_path, capsys):
    tuned = Evidence(
        "ft.json",
        "m",
        "note",
        (_row("fine-tuned yarn", {16384: 29.0}, {4096: 1.0, 16384: 1.0}, method="yarn"),),
        budget="fine-tune",
    )
    free = _evidence(_row("yarn", {16384: 31.0}, {4096: 1.0, 16384: 1.0}))
    both = with_rows(free, tuned)
    assert [r.label for r in both.rows] == ["none", "yarn", "fine-tuned yarn"] and "ft.json" in both.note
    assert both.rows[-1].budget == "fine-tune" and with_rows(both, tuned) is both
    assert frontier_choice([both], L, 16384) is None  # only the fine-tuned row keeps both
    v = _by_label(verdicts(both, L, 16384)[1])
    assert v["fine-tuned yarn"].keeps_both and not v["fine-tuned yarn"].pareto and v["yarn"].pareto
    assert plot_frontier(both, L, 16384, tmp_path / "f.png").is_file()

    # the CLI: --also shows a shipped file's rows; --evidence writes the suite's own rows, command on each
    folder = tmp_path / "run"
    folder.mkdir()
    cell = {"accuracy": [[1.0, 1.0]], "depths": [0.2, 0.8], "trials": 1}
    tasks = {
        "perplexity": {"none": {"2048": {"ppl": 28.0}, "8192": {"ppl": 30.0}}, "se": {"16384": {"ppl": 30.1}}},
        "passkey": {"none": {"8192": cell}, "se": {"16384": cell}},
    }
    (folder / "results.json").write_text(json.dumps({"model": "smollm2-135m", "tasks": tasks}))
    (folder / "suite.yaml").write_text("methods:\n- {method: none}\n- {method: self_extend, factor: 2, label: se}\n")
    shipped = tmp_path / "ft.json"
    shipped.write_text(
        json.dumps(
            {
                "model": "smollm2-135m",
                "original_context": L,
                "budget": "fine-tune",
                "note": "n",
                "rows": [
                    {
                        "label": "fine-tuned yarn",
                        "method": "yarn",
                        "factor": 2,
                        "measured": [{"command": "c", "ppl": {"16384": 29.0}, "passkey": {"16384": 1.0}}],
                    }
                ],
            }
        )
    )
    argv = ["eval", "frontier", "--results", str(folder), "--target-length", "16384", "--also", str(shipped)]
    out_json = tmp_path / "evidence.json"
    assert main([*argv, "--evidence", str(out_json), "--verbose"]) == 2  # no --command: refused in one line
    assert "--evidence needs --command" in capsys.readouterr().err
    assert main([*argv, "--evidence", str(out_json), "--command", "ropescale eval suite x", "--verbose"]) == 0
    out = squeezed(capsys.readouterr().out)
    assert "| fine-tuned yarn ×2 |" in out and "se ×2" in out
    written = load_measured(out_json)
    assert [r.label for r in written.rows] == ["none", "se"] and written.budget == "training-free"
    assert written.rows[1].commands == ("ropescale eval suite x",) and written.rows[1].ppl == {16384: 30.1}
    # a later stage of the same suite (here a new folder holding one new cell) joins the file, nothing lost
    tasks["perplexity"]["se"] = {"32768": {"ppl": 30.4}}
    (folder / "results.json").write_text(json.dumps({"model": "smollm2-135m", "tasks": tasks}))
    assert main([*argv, "--evidence", str(out_json), "--command", "stage 2"]) == 0
    assert "evidence: se ppl 32k: added" in capsys.readouterr().out
    se = load_measured(out_json).rows[1]
    assert se.ppl == {16384: 30.1, 32768: 30.4} and se.commands == ("ropescale eval suite x", "stage 2")
    out_json.write_text("{")  # a damaged file: refused in one line naming it, left as it is
    assert main([*argv, "--evidence", str(out_json), "--command", "stage 3"]) == 2
    assert "evidence.json' cannot be read" in capsys.readouterr().err and out_json.read_text() == "{"
