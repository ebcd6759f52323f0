"""The training loop on tiny random Llama/Mistral models: the loss falls, only LoRA (+ chosen
embeddings/norms) trains, an interrupted run resumes to the same weights, the merged export matches
the adapter model, and the CLI runs a recipe end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
import yaml

import ropescale
from ropescale.cli.main import main
from ropescale.training.export import export
from ropescale.training.trainer import Trainer, chunked_causal_lm_loss, list_checkpoints
from tests.training.conftest import recipe, repetitive_stream


class Interrupt(Exception):
    pass


@pytest.mark.parametrize(
    "arch, sections",
    [
        ("llama", {"pose": {"enabled": True, "target_length": 256}}),
        ("mistral", {"s2attn": {"enabled": True, "group_ratio": 0.25}}),
        ("llama", {"train": {"gradient_checkpointing": True, "grad_accum": 2}, "optim": {"schedule": "cosine"}}),
    ],
)
def test_loss_is_finite_and_falls_on_repetitive_text(tmp_path, make_model, arch, sections):
    sections = {**sections, "train": {"max_steps": 12, **sections.get("train", {})}}
    config = recipe(tmp_path, arch, **sections)
    # initializer_range 0.1: with the default 0.02 the frozen lm_head cannot express a sharp
    # distribution, and LoRA alone plateaus near uniform (ln 128 = 4.85)
    model = make_model(arch, initializer_range=0.1)
    result = Trainer(config, model=model, train_tokens=repetitive_stream(), progress=False).train()
    losses = result.losses
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
    metrics = [json.loads(ln) for ln in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 13)) and metrics[0]["tokens_per_s"] > 0


@pytest.mark.parametrize("trainable", [[], ["embed", "norm"]])
def test_only_the_intended_parameters_train(tmp_path, make_model, trainable):
    config = recipe(tmp_path, lora={"trainable": trainable, "target_modules": ["q_proj", "v_proj"]})
    trainer = Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False)
    trainer.setup()
    names = {n for n, p in trainer.peft_model.named_parameters() if p.requires_grad}
    lora = {n for n in names if ".lora_" in n}
    assert len(lora) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)
    assert all(".q_proj.lora_" in n or ".v_proj.lora_" in n for n in lora)
    extra = {n.removeprefix("base_model.model.model.") for n in names - lora}
    if trainable:
        norms = {f"layers.{i}.{k}.weight" for i in range(2) for k in ("input_layernorm", "post_attention_layernorm")}
        assert extra == {"embed_tokens.weight", "norm.weight"} | norms
    else:
        assert extra == set()
    assert not any("lm_head" in n for n in names)  # untied in the tiny models: frozen


def _trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.peft_model.named_parameters() if p.requires_grad}


def test_interrupted_run_resumes_to_the_same_parameters(tmp_path, make_model):
    """Dropout, PoSE and gradient accumulation on: RNG, data position, optimizer and scheduler must all
    be restored. The run is killed after step 5; the checkpoint at step 4 is the last one, so one step
    is redone."""
    sections = dict(
        lora={"dropout": 0.1, "trainable": ["norm"]},
        pose={"enabled": True, "target_length": 256},
        optim={"schedule": "linear", "warmup_steps": 2},
        train={"max_steps": 6, "save_every": 2, "grad_accum": 2},
    )
    stream = repetitive_stream()
    straight = Trainer(recipe(tmp_path / "a", **sections), model=make_model(), train_tokens=stream, progress=False)
    full = straight.train()

    config = recipe(tmp_path / "b", **sections)

    def kill_after_5(trainer, loss):
        if trainer.step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        Trainer(config, model=make_model(), train_tokens=stream, progress=False).train(on_step=kill_after_5)
    assert [p.name for p in list_checkpoints(config.output_dir)] == ["step-00000002", "step-00000004"]
    resumed = Trainer(config, model=make_model(), train_tokens=stream, progress=False)
    tail = resumed.train(resume=True)
    assert tail.losses == pytest.approx(full.losses[4:], abs=0)
    got, want = _trainable(resumed), _trainable(straight)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    steps = [json.loads(ln)["step"] for ln in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # the lost step 5 is logged once
    # a finished run resumes to nothing
    assert Trainer(config, model=make_model(), train_tokens=stream, progress=False).train(resume=True).losses == []


def test_changed_recipe_refuses_to_resume(tmp_path, make_model):
    config = recipe(tmp_path, train={"max_steps": 2, "save_every": 1})
    Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()
    other = recipe(tmp_path, lora={"r": 8}, train={"max_steps": 2, "save_every": 1})
    with pytest.raises(ropescale.errors.RopescaleError, match=r"different recipe \(lora.r: 4 -> 8\)"):
        Trainer(other, model=make_model(), train_tokens=repetitive_stream(), progress=False).train(resume=True)
    with pytest.raises(ropescale.errors.RopescaleError, match="--resume"):
        Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False).train()


@pytest.mark.parametrize("method", ["yarn", "dynamic_yarn"])
def test_merged_export_reloads_and_matches_the_adapter_model(tmp_path, model_dir, method):
    config = recipe(
        tmp_path,
        model={"name": str(model_dir)},
        scaling={"method": method, "factor": 4},
        lora={"trainable": ["embed", "norm"]},
        train={"max_steps": 3},
    )
    trainer = Trainer(config, train_tokens=repetitive_stream(), progress=False)
    trainer.train()
    ids = torch.randint(0, 128, (1, 200))  # > 3x the tiny models' 64-token context
    trainer.peft_model.eval()
    with torch.no_grad():
        adapter_logits = trainer.peft_model(input_ids=ids).logits
    out = export(config.output_dir, tmp_path / "merged")
    reloaded = ropescale.from_pretrained(out)
    assert reloaded.config.ropescale["method"] == method
    # trained with its scaling: a later extension composes on it by default (issue 51's rule)
    assert reloaded.config.ropescale["fine_tuned"] is True
    if method == "yarn":
        from ropescale.patching.plan import plan_patch

        assert plan_patch(reloaded.config, "yarn", factor=2).mode == "compose"
    assert not any("lora" in n for n, _ in reloaded.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, adapter_logits, rtol=1e-4, atol=1e-4)
        base = ropescale.from_pretrained(model_dir, method=method, factor=4)
        assert (base(ids).logits - adapter_logits).abs().amax() > 1e-2  # training changed something
    if method == "yarn":  # native: plain transformers builds the same model
        plain = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert plain.config.rope_parameters["rope_type"] == "yarn"
        with torch.no_grad():
            torch.testing.assert_close(plain(ids).logits, adapter_logits, rtol=1e-4, atol=1e-4)


def test_chunked_loss_equals_the_models_loss(make_model):
    model = make_model()
    ids = torch.randint(0, 128, (2, 40))
    labels = ids.clone()
    labels[0, 5] = -100
    want = model(ids, labels=labels).loss
    hidden = model.model(ids).last_hidden_state
    got = chunked_causal_lm_loss(hidden, model.lm_head, labels, chunk=7)
    torch.testing.assert_close(got, want)
    got.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_cli_train_eval_resume_export(tmp_path, model_dir, capsys):
    data = tmp_path / "books"
    data.mkdir()
    (data / "a.txt").write_text("The cat sat on the mat. " * 120)
    (data / "b.txt").write_text("A dog ran in the park and barked at a bird. " * 10)
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
                "scaling": {"method": "yarn", "factor": 4},
                "lora": {"r": 4, "alpha": 8},
                "data": {"source": str(data), "holdout": ["b"], "seq_len": 32},
                "pose": {"enabled": True, "target_length": 128, "content": "contiguous"},
                "optim": {"lr": 1e-2, "warmup_steps": 1},
                "train": {"max_steps": 4, "save_every": 2, "gradient_checkpointing": False},
                "eval": {"every": 2, "length": 96, "max_tokens": 192},
            }
        )
    )
    run = tmp_path / "run"
    code = main(["train", "--config", str(path), "--output-dir", str(run), "--no-progress", "--merge"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "trained tiny to step 4" in out and "perplexity at 96 tokens" in out
    evals = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if "eval_ppl" in ln]
    assert [e["step"] for e in evals] == [2, 4] and all(math.isfinite(e["eval_ppl"]) for e in evals)
    # its last line says whether the held-out curve levelled off, by the rule of training/convergence.py
    from ropescale.training.convergence import curve_falling

    falling, text = curve_falling(evals)
    assert falling is not None and text in out and out.count("held-out curve ") == 1
    assert (run / "adapter" / "adapter_config.json").is_file() and (run / "data" / "train_tokens.npy").is_file()
    assert (run / "merged" / "config.json").is_file()

    code = main(["train", "--config", str(path), "--output-dir", str(run), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "already holds checkpoints" in err and len(err.strip().splitlines()) == 1
    code = main(["train", "--config", str(path), "--output-dir", str(run), "--no-progress", "--resume"])
    assert code == 0, capsys.readouterr().err

    code = main(["export", str(run), "--output", str(tmp_path / "merged"), "--checkpoint", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    model = ropescale.from_pretrained(tmp_path / "merged")
    tokenizer = ropescale.load_tokenizer(tmp_path / "merged")
    assert model.config.ropescale["method"] == "yarn" and tokenizer.bos_token == "<s>"


def test_a_full_fine_tune_evaluates_held_out_text_during_training(tmp_path, model_dir, capsys):
    """eval.every with lora.enabled=false (the issue-41 recipes' held-out curve): the evaluation runs the
    causal LM inside the full fine-tune's wrapper (it failed on the wrapper, which has no decoder)."""
    data = tmp_path / "books"
    data.mkdir()
    (data / "a.txt").write_text("The cat sat on the mat. " * 60)
    (data / "b.txt").write_text("A dog ran in the park and barked at a bird. " * 10)
    path = tmp_path / "full.yaml"
    recipe = {
        "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
        "scaling": {"method": "yarn", "factor": 4},
        "lora": {"enabled": False},
        "data": {"source": str(data), "holdout": ["b"], "seq_len": 32},
        "optim": {"lr": 1e-3, "warmup_steps": 1},
        "train": {"max_steps": 2, "save_every": 0, "gradient_checkpointing": False},
        "eval": {"every": 1, "length": 96, "max_tokens": 192},
    }
    path.write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    code = main(["train", "--config", str(path), "--output-dir", str(run), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    evals = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if "eval_ppl" in ln]
    assert [e["step"] for e in evals] == [1, 2] and all(math.isfinite(e["eval_ppl"]) for e in evals)
    # every line, step and evaluation, says the load it ran under (issue 54: a step timed beside another job)
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(isinstance(rec["load_avg"], float) and rec["load_avg"] >= 0 for rec in lines)


def test_held_out_evaluation_leaves_the_training_as_it_is(tmp_path, model_dir, capsys):
    """A run evaluated every step and one evaluated at its last step only train the same weights, bit for
    bit: benchmarks/fresh_checkout.py retrains a run whose held-out curve is committed with eval.every =
    max_steps, and reads the committed curve and cells as the retrain's. The windows (PoSE's positions,
    short windows, the order) are drawn from generators seeded by the window's index, so an evaluation
    cannot shift them; what it could change is the model or the optimizer's state, and a run whose
    evaluation nudged one weight by 1e-6 fails here (checked by hand)."""
    from safetensors.torch import load_file

    data = tmp_path / "books"
    data.mkdir()
    (data / "a.txt").write_text("The cat sat on the mat and looked at the moon. " * 80)
    (data / "b.txt").write_text("A dog ran in the park and barked at a bird. " * 10)
    runs = {}
    for every in (1, 3):
        path = tmp_path / f"every{every}.yaml"
        recipe = {
            "model": {"name": str(model_dir), "attn_implementation": "sdpa"},
            "scaling": {"method": "yarn", "factor": 4},
            "lora": {"enabled": False},
            "data": {"source": str(data), "holdout": ["b"], "seq_len": 32, "short_share": 0.5},
            "pose": {"enabled": True, "target_length": 96},
            "optim": {"lr": 1e-3, "warmup_steps": 1},
            "train": {"max_steps": 3, "save_every": 0, "grad_accum": 2, "gradient_checkpointing": False},
            "eval": {"every": every, "length": 96, "max_tokens": 192},
        }
        path.write_text(yaml.safe_dump(recipe))
        runs[every] = tmp_path / f"run{every}"
        assert main(["train", "--config", str(path), "--output-dir", str(runs[every]), "--no-progress"]) == 0, (
            capsys.readouterr().err
        )
    lines = {e: [json.loads(ln) for ln in (r / "metrics.jsonl").read_text().splitlines()] for e, r in runs.items()}
    assert [x["step"] for x in lines[1] if "eval_ppl" in x] == [1, 2, 3]
    assert [x["step"] for x in lines[3] if "eval_ppl" in x] == [3]
    loss = {e: [x["loss"] for x in rows if "loss" in x] for e, rows in lines.items()}
    assert len(loss[1]) == 3 and loss[1] == loss[3]
    last = {e: [x["eval_window_nll"] for x in rows if "eval_ppl" in x][-1] for e, rows in lines.items()}
    assert last[1] == last[3]
    weights = {e: load_file(list_checkpoints(r)[-1] / "trainable.safetensors") for e, r in runs.items()}
    assert weights[1].keys() == weights[3].keys() and weights[1]
    for name, tensor in weights[1].items():
        torch.testing.assert_close(weights[3][name], tensor, rtol=0, atol=0, msg=name)
