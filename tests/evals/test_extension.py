"""The extension experiment's machinery: the control differs from the fine-tune only in scaling, its
positions stay within the trained context, and the four-model table is read from real suite results."""

from __future__ import annotations

import copy
import json
import shlex
from dataclasses import replace

import numpy as np
from extension_plan import Plan, collect, evidence_dict, goal_lines, render_table, suite_dicts

import ropescale
from ropescale.evals.advice.evidence import load_measured
from ropescale.evals.suite.parse import suite_from_dict
from ropescale.evals.suite.runner import run_suite
from ropescale.training.config import load_config
from ropescale.training.data import WindowDataset, WindowSpec
from tests.conftest import squeezed

RECIPE, CONTROL = "smollm2-135m/yarn_x4", "smollm2-135m/yarn_x4_control"
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 120

#: the label of the recall recipe's command: a trained skill, not "keeping retrieval"
RECALL_LABEL = "fine-tune with recall sentences (passkey: a trained skill)"


def test_the_control_is_the_same_fine_tune_without_scaling():
    ft, control = load_config(RECIPE).to_dict(), load_config(CONTROL).to_dict()
    assert ft["scaling"]["method"] == "yarn" and ft["scaling"]["factor"] == 4
    assert control["scaling"]["method"] == "none"
    assert ft["pose"]["target_length"] == 4 * 8192 and control["pose"]["target_length"] == 8192
    for section in ("model", "lora", "data", "optim", "train", "s2attn"):
        assert ft[section] == {
            **control[section],
            **({"output_dir": ft["train"]["output_dir"]} if section == "train" else {}),
        }, section
    assert {k: v for k, v in ft["pose"].items() if k != "target_length"} == {
        k: v for k, v in control["pose"].items() if k != "target_length"
    }


def test_control_positions_stay_within_the_trained_context_and_the_fine_tune_reaches_the_target():
    stream = np.random.default_rng(0).integers(4, 1000, size=200_000).astype(np.int64)
    reach = {}
    for name in (RECIPE, CONTROL):
        c = load_config(name)
        spec = WindowSpec(c.data.seq_len, 1, c.pose.target_length, c.pose.chunks, c.pose.content)
        data = WindowDataset(stream, spec, seed=0)
        reach[name] = max(int(data.batch([i])["position_ids"].max()) for i in range(40))
    assert reach[CONTROL] < 8192 < reach[RECIPE] < 4 * 8192
    assert reach[RECIPE] > 2 * 8192  # PoSE spreads the windows far beyond L, not just past it


def test_the_table_reads_the_three_suites_real_results(model_dir, tiny_llama, bytelevel_tokenizer, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    finetuned, control = tmp_path / "ft", tmp_path / "control"
    scaled = ropescale.patch(copy.deepcopy(tiny_llama), method="yarn", factor=4)
    ropescale.save_pretrained(scaled, finetuned, tokenizer=bytelevel_tokenizer)
    ropescale.save_pretrained(tiny_llama, control, tokenizer=bytelevel_tokenizer)
    plan = Plan(
        model=str(model_dir),
        original_context=256,
        ppl_lengths=(128, 256, 512),
        passkey_lengths=(256, 600),
        depths=(0.0, 1.0),
        trials=1,
        ppl_max_tokens=512,
        data=str(data),
        dtype="float32",
    )
    for name, raw in suite_dicts(plan, finetuned, control).items():
        run_suite(suite_from_dict({**raw, "device": "cpu"}), tmp_path / "out" / name, progress=False)

    rows = collect(tmp_path / "out", {role: f"cmd-{role}" for role in ("none", "yarn", "fine-tuned yarn", "control")})
    assert [r.label for r in rows] == ["none", "yarn", "fine-tuned yarn", "control"]
    by = {r.label: r for r in rows}
    assert set(by["none"].passkey) == {256} and set(by["control"].passkey) == {256}  # not beyond L
    assert set(by["fine-tuned yarn"].passkey) == {256, 600} and by["fine-tuned yarn"].passkey_trials[600] == 2
    # the same weights with the same scaling measure the same, whichever suite ran them
    assert by["fine-tuned yarn"].ppl == by["yarn"].ppl and by["control"].ppl == by["none"].ppl
    table = [squeezed(line) for line in render_table(rows, plan)]
    assert len(table) == 6 and table[3].startswith("| yarn | ") and f"{by['yarn'].ppl[512]:.2f}" in table[3]
    assert "/2, [" in table[4]  # hits/prompts with the Wilson interval
    assert any(line.startswith("- PPL at 512") for line in goal_lines(rows, plan))

    path = tmp_path / "evidence.json"
    path.write_text(json.dumps(evidence_dict(rows, plan, "tiny")))
    back = load_measured(path)
    assert [r.label for r in back.rows] == ["none", "yarn", "fine-tuned yarn", "control"]
    assert back.rows[1].commands == ("cmd-yarn",) and back.rows[2].factor == 4
    assert back.rows[2].ppl == {n: round(v, 3) for n, v in by["fine-tuned yarn"].ppl.items()}


def test_recommend_quotes_the_shipped_fine_tune_and_never_takes_it_for_training_free(tmp_path):
    from ropescale.evals.advice.evidence import Measured, shipped_evidence
    from ropescale.evals.advice.recommend import recommend
    from ropescale.evals.advice.recommend_text import format_short

    rows = [
        Measured(
            "none",
            "default",
            ppl={2048: 28.77, 8192: 29.97},
            passkey={4096: 0.8, 8192: 0.6},
            passkey_trials={4096: 30, 8192: 30},
            commands=("c",),
        ),
        Measured(
            "yarn", "yarn", 4, ppl={32768: 33.2}, passkey={32768: 0.4}, passkey_trials={32768: 30}, commands=("c",)
        ),
        Measured(
            "fine-tuned yarn",
            "yarn",
            4,
            ppl={2048: 28.8, 8192: 30.1, 16384: 30.0, 32768: 30.1},
            passkey={n: 0.9 for n in (4096, 8192, 16384, 32768)},
            passkey_trials={n: 30 for n in (4096, 8192, 16384, 32768)},
            commands=("c",),
        ),
        Measured("control", "default", ppl={8192: 30.2}, commands=("c",)),
    ]
    path = tmp_path / "smollm2-135m-finetune.json"
    path.write_text(json.dumps(evidence_dict(rows, Plan(jitter=0.125), "test")))  # as the shipped one: spread
    evidence = [load_measured(path), *shipped_evidence()]
    assert evidence[0].budget == "fine-tune"
    tuned = recommend("smollm2-135m", 8192, 32768, "fine-tune", evidence=evidence)
    assert "PPL 32k 30.10" in tuned.measured and "passkey 32k 0.90 on 30 prompts, training-free 0.40" in tuned.measured
    assert "PPL 8k 30.10 (control 30.20)" in tuned.measured  # in --verbose and --json
    # the short answer leads with what measures the extension: perplexity past L against the control's
    assert "PPL 8k/16k/32k 30.10/30.00/30.10 against its control's 30.20 at 8k" in " ".join(format_short(tuned).split())
    # the training-free answer is the same with or without the fine-tune's file (its 0.90 is no candidate)
    free = recommend("smollm2-135m", 8192, 32768, "training-free", evidence=evidence)
    alone = recommend("smollm2-135m", 8192, 32768, "training-free", evidence=list(shipped_evidence()))
    assert (free.method, free.params, free.why) == (alone.method, alone.params, alone.why) and free.measured is None


def test_recommend_quotes_the_most_complete_experiment_and_names_where_it_retrieves_less(tmp_path):
    from ropescale.evals.advice.evidence import Measured
    from ropescale.evals.advice.finetune_evidence import fine_tune_measured

    def experiment(name: str, passkey: dict[int, float]):
        rows = [
            Measured("none", "default", passkey={4096: 0.8, 8192: 0.6}, passkey_trials={4096: 30, 8192: 30}),
            Measured("yarn", "yarn", 4, passkey={4096: 0.4, 16384: 0.8}, passkey_trials={4096: 30, 16384: 30}),
            Measured("fine-tuned yarn", "yarn", 4, ppl={32768: 24.0}, passkey=passkey, passkey_trials=dict.fromkeys(passkey, 30)),
            Measured("control", "default", ppl={8192: 23.4}),
        ]  # fmt: skip
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(evidence_dict([replace(r, commands=("c",)) for r in rows], Plan(), "test")))
        return load_measured(path)

    short = experiment("short", {4096: 0.9, 8192: 0.9})  # retrieves as well as both: no caveat
    long = experiment("long", {4096: 0.53, 8192: 0.77, 16384: 0.43, 32768: 0.33})
    assert fine_tune_measured([short], "smollm2-135m", 4).caveat is None
    for order in ([short, long], [long, short]):  # the one with more passkey lengths, wherever it was found
        quote = fine_tune_measured(order, "smollm2-135m", 4)
        line, caveat = quote.line, quote.caveat
        assert "long.json" in line and "passkey 32k 0.33 on 30 prompts" in line
        assert "4k (0.53 against the unscaled model's 0.80)" in caveat
        assert "16k (0.43 against training-free YaRN's 0.80)" in caveat and "32k" not in caveat  # no free 32k cell
        assert caveat.startswith("the measured fine-tune retrieves less at 4k") and "noise" not in caveat
    assert fine_tune_measured([long], "smollm2-135m", 8) is None  # another factor
    # lower, but one or two prompts of 30: said as within the noise, not as a loss
    close = experiment("close", {4096: 0.73, 16384: 0.77})
    caveat = fine_tune_measured([close], "smollm2-135m", 4).caveat
    assert "lower but within the noise of its prompts at 4k (0.73 against the unscaled model's 0.80)" in caveat
    assert "16k (0.77 against training-free YaRN's 0.80)" in caveat and "retrieves less" not in caveat


def test_a_converged_run_is_quoted_before_one_its_experiment_says_did_not_converge(tmp_path):
    """Issue 54's CPU fine-tune ships a 320-step run (not converged) and a 640-step one: the one whose
    numbers stand as a result is quoted whatever the file order, and of two qualified runs the rule before."""
    from ropescale.evals.advice.evidence import Measured
    from ropescale.evals.advice.finetune_evidence import command_overrides, fine_tune_measured
    from ropescale.evals.advice.recommend_finetune import _extension_line

    def experiment(name: str, status: str, ppl: float):
        rows = [
            Measured("none", "default", ppl={8192: 30.8}),
            Measured("fine-tuned yarn", "yarn", 2, ppl={16384: ppl}),
            Measured("control", "default", ppl={8192: 25.0}),
        ]
        path = tmp_path / f"{name}.json"
        command = f"python benchmarks/cpu_finetune_x2.py --steps {name} --output runs/cpu-x2-{name}"
        path.write_text(
            json.dumps(
                evidence_dict([replace(r, commands=(command,)) for r in rows], Plan(factor=2.0), "t", None, status)
            )
        )
        return load_measured(path)

    falls = "not converged: the fine-tuned yarn held-out curve still falls at step"
    early = experiment("320", f"{falls} 320", 25.45)
    done = experiment("640", "", 25.30)
    for order in ([early, done], [done, early]):
        assert "640.json" in fine_tune_measured(order, "smollm2-135m", 2).line
    assert "320.json" in fine_tune_measured([early], "smollm2-135m", 2).line  # alone, still quoted (with its status)
    # neither converged: the longer-trained one, the nearer to a result, and its steps are said
    late = experiment("640", f"{falls} 640", 25.00)
    for order in ([early, late], [late, early]):
        quote = fine_tune_measured(order, "smollm2-135m", 2, recipe_steps=320)
        assert "640.json" in quote.line
    said = _extension_line(quote.source, 8192, 320)  # recommend's reason says what the quoted run trained
    assert "trained with train.max_steps=640, as the command below does; the recipe alone runs 320" in said
    assert command_overrides("python benchmarks/cpu_finetune_x2.py --factor 4 --steps=640 --output o") == (
        "train.max_steps=640",
    )
    assert command_overrides("python benchmarks/cpu_finetune_x2.py --factor 2 --output runs/cpu-x2") == ()
    assert command_overrides("python benchmarks/other.py --steps 640") == ()  # another script's flag: not a recipe's


def test_where_the_quoted_fine_tune_loses_keys_a_shipped_variant_that_keeps_them_is_named(tmp_path):
    from ropescale.evals.advice.evidence import Measured
    from ropescale.evals.advice.finetune_evidence import command_overrides, fine_tune_measured
    from ropescale.evals.advice.recommend import recommend

    def experiment(name, passkey, command, jitter=0.125, trials=None, base=True, ppl=None):
        rows = [
            Measured("none", "default", passkey={4096: 1.0}, passkey_trials={4096: 30}),
            Measured("yarn", "yarn", 4, passkey={4096: 0.9, 8192: 0.9}, passkey_trials={4096: 30, 8192: 30}),
            Measured("fine-tuned yarn", "yarn", 4, ppl=ppl or {2048: 25.1, 32768: 27.7}, passkey=passkey, passkey_trials=trials or dict.fromkeys(passkey, 30)),
            Measured("control", "default", ppl={2048: 24.7}),
        ][0 if base else 2:]  # fmt: skip
        path = tmp_path / f"{name}.json"
        path.write_text(
            json.dumps(evidence_dict([replace(r, commands=(command,)) for r in rows], Plan(jitter=jitter), "t"))
        )
        return load_measured(path)

    bench = "python benchmarks/bench_extension.py --output runs/x --jitter 0.125 --overrides"
    long = experiment("long", {4096: 0.5, 8192: 0.5, 16384: 0.5}, f"{bench} train.max_steps=400")
    recall = f"{bench} 'scaling.params={{attention_factor: 1.07}}' data.recall_facts=4"
    kept = experiment("kept", {4096: 1.0, 8192: 1.0, 32768: 1.0}, recall, trials={4096: 30, 8192: 30, 32768: 4})
    quote = fine_tune_measured([long, kept], "smollm2-135m", 4)
    assert "long.json" in quote.line and "retrieves less at 4k" in quote.caveat  # the most complete is quoted
    assert quote.variant == ("scaling.params={attention_factor: 1.07}", "data.recall_facts=4")
    text = quote.variant_text
    assert "(not train.max_steps=400): passkey in its training format (not evidence of extension) at 4k, 8k" in text
    assert "kept.json" in text and quote.variant_trained  # recall sentences: keys in the passkey's own format
    assert text.endswith("perplexity past the trained context measures the extension")
    assert "passkey 4k 30/30, 8k 30/30, 32k 4/4 so far; PPL 2k/32k 25.10/27.70" in text  # 32k: not compared, not done
    rec = recommend(
        "smollm2-135m", 8192, 32768, "fine-tune", evidence=[long, kept], train_recipe="smollm2-135m/yarn_x4"
    )
    command = dict(rec.commands)[RECALL_LABEL]
    assert command.endswith("'scaling.params={attention_factor: 1.07}' data.recall_facts=4")
    assert rec.reasons[-1] == f"also shipped: {text}"
    # the short answer: its keys are labelled a trained skill, never the reason for the recommendation
    assert "trained format (not evidence of extension)" in rec.also[0] and "passkey" not in rec.why
    longer = experiment(
        "longer",
        {4096: 1.0, 8192: 1.0, 32768: 1.0},
        f"{recall} train.max_steps=400",
        trials={4096: 30, 8192: 30, 32768: 4},
    )
    for found in ([long, longer, kept], [long, kept, longer]):  # equally complete: the fewer steps, wherever found
        assert fine_tune_measured(found, "smollm2-135m", 4).variant == quote.variant
    better = experiment(  # as complete and as cheap as kept, one override more, lower perplexity at 32k
        "better",
        {4096: 1.0, 8192: 1.0, 32768: 1.0},
        f"{recall} optim.lr=1.0e-4",
        trials={4096: 30, 8192: 30, 32768: 4},
        ppl={2048: 23.7, 32768: 25.4},
    )
    for found in ([long, better, kept, longer], [long, longer, kept, better]):  # then the lower PPL at the target
        assert fine_tune_measured(found, "smollm2-135m", 4).variant == (*quote.variant, "optim.lr=1.0e-4")
    best_but_longer = experiment(  # the lowest PPL of all, but 400 steps: steps come first
        "best", {4096: 1.0, 8192: 1.0, 32768: 1.0}, f"{recall} optim.lr=1.0e-4 train.max_steps=400",
        trials={4096: 30, 8192: 30, 32768: 4}, ppl={2048: 22.0, 32768: 23.0},
    )  # fmt: skip
    assert fine_tune_measured([long, best_but_longer, better], "smollm2-135m", 4).variant[-1] == "optim.lr=1.0e-4"
    beyond = experiment(  # lower at 64k, higher at the target 32k: the target decides
        "beyond", {4096: 1.0, 8192: 1.0, 32768: 1.0}, f"{recall} optim.lr=2.0e-4",
        trials={4096: 30, 8192: 30, 32768: 4}, ppl={2048: 23.0, 32768: 25.6, 65536: 20.0},
    )  # fmt: skip
    assert fine_tune_measured([long, beyond, better], "smollm2-135m", 4).variant[-1] == "optim.lr=1.0e-4"
    short = experiment(  # 30 steps: fewer than a recipe of 60 (the others' steps), more than one of 20
        "short", {4096: 1.0, 8192: 1.0, 32768: 1.0}, f"{recall} train.max_steps=30", trials={4096: 30, 8192: 30, 32768: 4}
    )  # fmt: skip
    assert (
        fine_tune_measured([long, better, short], "smollm2-135m", 4, recipe_steps=60).variant[-1]
        == "train.max_steps=30"
    )
    assert (
        fine_tune_measured([long, short, better], "smollm2-135m", 4, recipe_steps=20).variant[-1] == "optim.lr=1.0e-4"
    )
    twin = experiment("twin", {4096: 1.0, 8192: 1.0, 16384: 1.0}, recall)  # as complete as long, keeps keys
    for found in ([twin, long], [long, twin]):  # the quoted one is the recipe as it runs, wherever found
        quote = fine_tune_measured(found, "smollm2-135m", 4)
        assert "long.json" in quote.line and "twin.json" in quote.variant_text
    # not a variant: other prompts (fixed depths), no overrides to name, keys lost too, or no baseline to compare
    for other in (
        experiment("fixed", {4096: 1.0}, recall, jitter=0.0),
        experiment("plain", {4096: 1.0}, "python benchmarks/bench_extension.py --jitter 0.125"),
        experiment("lost", {4096: 0.5}, recall),
        experiment("alone", {4096: 0.1}, recall, base=False),  # a --suites finetuned run: nothing to compare
    ):
        assert fine_tune_measured([long, other], "smollm2-135m", 4).variant == (), other.source
    assert fine_tune_measured([kept], "smollm2-135m", 4).variant == ()  # nothing to remedy
    close = experiment("close", {4096: 0.97, 8192: 0.9, 16384: 0.9, 32768: 0.9}, f"{bench} train.max_steps=400")
    assert "noise" in fine_tune_measured([close, kept], "smollm2-135m", 4).caveat
    assert fine_tune_measured([close, kept], "smollm2-135m", 4).variant == ()  # not a loss: nothing to remedy
    assert command_overrides(f"{recall} --note x") == quote.variant and command_overrides("python b.py") == ()
    assert command_overrides("python b.py --note it's --overrides a=1") == ()  # unbalanced quote: no crash
    assert command_overrides("python b.py '--overrides=data.recall_facts=4' --note x") == ("data.recall_facts=4",)


def test_the_shipped_x4_fine_tune_names_recall_sentences_as_the_variant_that_keeps_keys():
    from ropescale.evals.advice.evidence import shipped_evidence
    from ropescale.evals.advice.finetune_evidence import fine_tune_measured

    quote = fine_tune_measured(list(shipped_evidence()), "smollm2-135m", 4)
    assert "finetune-400steps-jitter.json" in quote.line and quote.caveat  # the recipe's most complete: loses keys
    assert "data.recall_facts=4" in quote.variant and "optim.lr=1.0e-4" in quote.variant  # 60 steps, lowest PPL
    assert "recall-lr1e-4-60steps-jitter.json" in quote.variant_text
    from ropescale.evals.advice.recommend import recommend

    rec = recommend(
        "smollm2-135m", 8192, 32768, "fine-tune", evidence=list(shipped_evidence()), train_recipe="smollm2-135m/yarn_x4"
    )
    words = shlex.split(dict(rec.commands)[RECALL_LABEL])
    config = load_config(words[3], words[4:])  # the printed command is one `ropescale train` accepts
    assert words[:3] == ["ropescale", "train", "--config"] and config.data.recall_facts == 4
    assert config.scaling.params == {"attention_factor": 1.07} and config.pose.target_length == 32768
    from ropescale.training.checkpoints import fingerprint

    recipe = load_config("smollm2-135m/yarn_x4_recall")  # the variant by name: exactly what was measured
    for c in (config, recipe):
        c.name = c.train.output_dir = None
    assert fingerprint(recipe) == fingerprint(config) and recipe.to_dict() == config.to_dict()  # every setting


def test_a_jittered_experiment_places_every_suites_needles_so_and_says_so(tmp_path):
    fixed, spread = Plan(), Plan(jitter=0.125)
    for name, raw in suite_dicts(spread, tmp_path / "ft", tmp_path / "control").items():
        assert raw["passkey"]["jitter"] == 0.125, name
        assert suite_from_dict(raw).passkey["jitter"] == 0.125
    # fixed: said explicitly (an absent jitter now means the spread default); cells keyed as before, without it
    assert all(raw["passkey"]["jitter"] == 0 for raw in suite_dicts(fixed, "ft", "control").values())
    assert any("passkey at fixed depths" in line for line in goal_lines([], fixed))
    assert not any("fixed depths" in line for line in goal_lines([], spread))
    ev = evidence_dict([], spread, "n")
    assert ev["passkey_jitter"] == 0.125 and "passkey_jitter" not in evidence_dict([], fixed, "n")


def test_trade_offs_read_a_fine_tune_files_training_free_rows_only(tmp_path):
    """The x8 experiment's file holds training-free YaRN x8 (a trade-off the rule's answer should quote) and the
    fine-tuned and control models (which must never stand in for it or for the unscaled baseline)."""
    from ropescale.evals.advice.evidence import Measured
    from ropescale.evals.advice.tradeoffs import measure

    rows = [
        Measured("none", "default", ppl={2048: 28.8, 65536: 1925.0}, passkey={4096: 1.0}, passkey_trials={4096: 30}),
        Measured("yarn", "yarn", 8, ppl={2048: 33.0, 65536: 45.3}, passkey={4096: 0.7}, passkey_trials={4096: 30}),
        Measured("fine-tuned yarn", "yarn", 8, ppl={2048: 22.7, 65536: 27.6}, passkey={4096: 0.37}, passkey_trials={4096: 30}),
        Measured("control", "default", ppl={2048: 22.0}, passkey={4096: 1.0}, passkey_trials={4096: 30}),
    ]  # fmt: skip
    path = tmp_path / "x8.json"
    path.write_text(json.dumps(evidence_dict([replace(r, commands=("c",)) for r in rows], Plan.at(8), "test")))
    found = measure("yarn", [load_measured(path)], 8192, 65536)
    text = " ".join(t.sentence() for t in found)
    assert "PPL 33.00 at 2k vs 28.80 unscaled" in text and "45.30 at 64k" in text and "70% at 4k" in text
    assert "22.7" not in text and "27.6" not in text and "37%" not in text and "22.00" not in text


def test_the_goal_reads_a_report_whose_perplexity_stops_at_the_trained_context():
    # `--ppl-lengths 2048,8192` (a screen of the short cells first) with both fine-tunes measured: the long
    # perplexity part is not measured yet, and the report still prints (max() of nothing crashed it)
    from ropescale.evals.advice.evidence import Measured

    plan = replace(Plan.at(4), ppl_lengths=(2048, 8192))
    rows = [
        Measured("fine-tuned yarn", "yarn", 4, ppl={2048: 23.79, 8192: 25.50}),
        Measured("control", "default", ppl={2048: 23.63, 8192: 24.96}),
    ]
    lines = goal_lines(rows, plan)
    assert "- long-context perplexity: not measured yet (no perplexity length beyond 8k asked)" in lines
    assert "- PPL(2k) ≤ 1.01 × control's: met (23.79 vs 23.63)" in lines


def test_a_cpu_experiment_beside_the_quoted_one_is_said_with_the_recipe_it_trained(tmp_path):
    """Issue 54: `recommend --budget fine-tune` reads the CPU experiment at its factor. Where another
    experiment is quoted (at ×4 the 400-step one, with passkey cells), the CPU run is said beside it, with
    its numbers, retrieval and status, and a command for its `_cpu` recipe that `ropescale train` accepts;
    where the CPU run is the one quoted, it is not said twice."""
    from ropescale.evals.advice.evidence import Measured
    from ropescale.evals.advice.recommend import recommend
    from ropescale.evals.advice.recommend_finetune import cpu_experiment

    def experiment(name: str, command: str, ft_ppl: dict, passkey: dict, retrieval: str = "", status=""):
        rows = [
            Measured("none", "default", ppl={8192: 31.5}, passkey={4096: 1.0} if passkey else {}),
            Measured("fine-tuned yarn", "yarn", 4, ppl=ft_ppl, passkey=passkey),
            Measured("control", "default", ppl={8192: 25.49}),
        ]
        rows = [replace(r, commands=(command,)) for r in rows]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(evidence_dict(rows, Plan(), "t", None, status, retrieval)))
        return load_measured(path)

    bench = "python benchmarks/bench_extension.py --overrides train.max_steps=400 --output runs/x4"
    gpu = experiment("gpu", bench, {8192: 24.0, 32768: 23.7}, {4096: 0.9, 32768: 0.4})
    said = "RULER's 4 countable tasks at 32k: 70 % of the unscaled model's score at 4k (goal ≥ 85 %)"
    cpu = experiment(
        "cpu",
        "python benchmarks/cpu_finetune_x2.py --factor 4 --steps 640 --output runs/cpu-x4-640steps",
        {8192: 25.95, 16384: 25.99, 32768: 26.38},
        {},
        said,
    )
    rec = recommend("smollm2-135m", 8192, 32768, "fine-tune", evidence=[gpu, cpu], train_recipe=RECIPE)
    assert "gpu.json" in rec.why  # the quoted one stays the most complete
    (line,) = [a for a in rec.also if a.startswith("on a CPU")]
    assert line.startswith("on a CPU (smollm2-135m/yarn_x4_cpu with train.max_steps=640, ")
    assert "PPL 8k/16k/32k 25.95/25.99/26.38 against its control's 25.49 at 8k (1.035× at 32k)" in line
    assert line.endswith(said)
    command = dict(rec.commands)["fine-tune on a CPU"]
    words = shlex.split(command)  # (the CLI drops the keys the recipe sets already)
    assert (
        words[:4] == ["ropescale", "train", "--config", "smollm2-135m/yarn_x4_cpu"]
        and words[-1] == "train.max_steps=640"
    )
    config = load_config(words[3], words[4:])  # one `ropescale train` accepts, training what was measured
    assert config.train.max_steps == 640 and config.scaling.factor == 4 and config.pose.target_length == 32768
    assert [what for what, _ in rec.commands].index("fine-tune on a CPU") == 1  # after the recipe's own
    # a CPU experiment that qualifies its numbers says so; the quoted CPU run is not said again
    late = experiment("late", cpu.rows[1].commands[0], {32768: 26.4}, {}, said, "not converged: the curve falls")
    assert cpu_experiment([gpu, late, cpu], "smollm2-135m", 4, gpu) is cpu
    assert cpu_experiment([late], "smollm2-135m", 4, gpu).status.startswith("not converged")
    assert cpu_experiment([gpu, cpu], "smollm2-135m", 4, cpu) is None
    assert cpu_experiment([gpu, cpu], "smollm2-135m", 2, gpu) is None  # another factor
    alone = recommend("smollm2-135m", 8192, 32768, "fine-tune", evidence=[cpu], train_recipe=RECIPE)
    assert not [a for a in alone.also if a.startswith("on a CPU")] and "fine-tune on a CPU" not in dict(alone.commands)
