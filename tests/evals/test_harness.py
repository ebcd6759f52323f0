"""lm-eval integration: the registered ``ropescale`` model, the passkey task YAMLs, run_harness and
``ropescale eval harness``, on a tiny random Llama with a word-level tokenizer saved to disk (offline)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from ropescale.evals import harness  # noqa: E402

TINY_CONTEXT = 512  # L of the tiny model; yarn x4 -> 2048, the length of passkey_2k
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def _utils():
    """evals/tasks/utils.py, loaded by path as lm-eval loads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("passkey_task_utils", harness.TASKS_DIR / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _word_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over the passkey prompt's words, digits one per token, BOS prepended."""
    u = _utils()
    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    words: list[str] = []
    for text in (u.TASK, u.FILLER, u.NEEDLE.format(key=0), u.QUESTION, "0123456789 Remember"):
        for word, _ in pre.pre_tokenize_str(text):
            if word not in words and word not in SPECIALS:
                words.append(word)
    vocab = {tok: i for i, tok in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama (2 layers, hidden 32, L=512) and its tokenizer, saved as a checkpoint."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = _word_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_CONTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _no_env_report(monkeypatch):
    """simple_evaluate runs torch's collect_env (pip list & co., ~5 s) for its results header: skip it."""
    import lm_eval.evaluator

    monkeypatch.setattr(lm_eval.evaluator, "add_env_info", lambda results: None)


def _lm(tiny_dir, **kwargs):
    return lm_eval.api.registry.get_model("ropescale")(pretrained=str(tiny_dir), device="cpu", **kwargs)


# ---------------------------------------------------------------------------------- the model


def test_model_is_registered_as_hflm_subclass():
    from lm_eval.models.huggingface import HFLM

    cls = lm_eval.api.registry.get_model("ropescale")
    assert issubclass(cls, HFLM) and cls.__name__ == "RopescaleLM"
    assert cls is harness.RopescaleLM
    assert lm_eval.api.registry.get_model("hf") is HFLM  # lm-eval's own models still resolve


def test_model_patches_and_sets_max_length(tiny_dir):
    lm = _lm(tiny_dir, method="yarn", factor=4, param_beta_fast=16)
    block = lm.model.config.ropescale
    assert block["method"] == "yarn" and block["params"]["factor"] == 4.0 and block["params"]["beta_fast"] == 16.0
    assert lm.max_length == 4 * TINY_CONTEXT == block["extended_context"]
    assert lm.model.config.max_position_embeddings == 4 * TINY_CONTEXT
    assert lm.get_model_info()["ropescale"]["method"] == "yarn"
    assert lm.tokenizer.bos_token == "<s>" and lm.device.type == "cpu"


def test_dynamic_method_defaults_to_factor_times_original(tiny_dir):
    # through lm-eval's own argument parsing, as `--model_args` reaches the class
    lm = lm_eval.api.registry.get_model("ropescale").create_from_arg_string(
        f"pretrained={tiny_dir},method=dynamic,factor=4", {"device": "cpu", "batch_size": 2}
    )
    assert lm.model.config.max_position_embeddings == TINY_CONTEXT  # dynamic keeps L in the config
    assert lm.max_length == 4 * TINY_CONTEXT and lm.batch_size == 2


def test_explicit_max_length_and_no_method(tiny_dir):
    assert _lm(tiny_dir, method="yarn", factor=4, max_length=1000).max_length == 1000
    plain = _lm(tiny_dir, method=None, dtype="bfloat16")
    assert plain.max_length == TINY_CONTEXT and not getattr(plain.model.config, "ropescale", None)
    assert plain.model.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "yarn", "factor": 4, "bogus": 1}, "unknown model_args for 'ropescale': bogus"),
        ({"method": "nope", "factor": 4}, "unknown method 'nope'"),
        ({"method": "yarn", "factor": "abc"}, "factor must be a number"),
        ({"method": "yarn", "factor": 4, "param_bogus": 1}, "unknown parameter 'bogus'"),
        ({"method": "yarn", "factor": 4, "max_length": 0}, "max_length must be a positive integer"),
        ({"method": "yarn", "factor": 4, "dtype": "int7"}, "dtype must be one of"),
        ({"method": "yarn", "factor": 4, "sliding_window": "wide"}, "sliding_window must be a positive integer"),
        ({"factor": 4}, "without a method"),
    ],
)
def test_bad_model_args_are_one_line_errors(tiny_dir, kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        _lm(tiny_dir, **kwargs)
    assert "\n" not in str(info.value)


def test_missing_model_is_a_ropescale_error(tmp_path):
    from ropescale.errors import RopescaleError

    with pytest.raises(RopescaleError, match="not found"):
        lm_eval.api.registry.get_model("ropescale")(pretrained=str(tmp_path / "nothing"), method="yarn", factor=4)


# ---------------------------------------------------------------------------------- the tasks


def test_passkey_docs_are_seeded_spread_and_scored():
    u = _utils()
    docs = u.make_docs(4096, samples=4)  # no tokenizer: estimated lengths
    assert docs == u.make_docs(4096, samples=4)
    assert [d["depth"] for d in docs] == [0.5, 0.25, 0.75, 0.125]
    assert all(d["sizing"] == "estimate" and len(d["key"]) == 5 and d["key"] in d["input"] for d in docs)
    assert docs[0]["input"].startswith(u.TASK) and docs[0]["input"].endswith(u.QUESTION)
    assert len({d["key"] for d in docs}) == 4 and u.make_docs(4096, samples=4, seed=1)[0]["key"] != docs[0]["key"]
    key = docs[0]["key"]
    assert u.process_results(docs[0], [f" {key}. Remember it."]) == {"acc": 1.0}
    assert u.process_results(docs[0], [f" 1{key}"]) == {"acc": 0.0}
    assert u.process_results(docs[0], [" the pass key"]) == {"acc": 0.0}
    with pytest.raises(ValueError, match="passkey_samples must be a positive integer"):
        u.make_docs(4096, samples=0)


def test_passkey_task_loads_through_include_path_sized_by_the_tokenizer(tiny_dir):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(
        include_path=str(harness.TASKS_DIR), include_defaults=False, metadata={"tokenizer": str(tiny_dir)}
    )
    assert {"ropescale_passkey", "passkey_2k", "passkey_32k", "passkey_128k"} <= set(manager.all_tasks)
    task = manager.load(["passkey_2k"])["tasks"]["passkey_2k"]
    docs = list(task.test_docs())
    tok = _word_tokenizer()
    u = _utils()
    assert len(docs) == u.DEFAULT_SAMPLES
    for d in docs:
        n = len(tok(d["input"])["input_ids"])  # BOS included
        assert d["sizing"] == "tokenizer" and n == d["n_tokens"] <= 2048 - 16
        longer = u.build_text(d["n_filler_sentences"] + 1, d["depth"], int(d["key"]))
        assert len(tok(longer)["input_ids"]) > 2048 - 16  # the most filler that fits
    assert task.config.generation_kwargs["do_sample"] is False
    assert task.doc_to_target(docs[0]) == docs[0]["key"]


def test_passkey_group_holds_2k_to_32k(tiny_dir):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(
        include_path=str(harness.TASKS_DIR),
        include_defaults=False,
        metadata={"tokenizer": str(tiny_dir), "passkey_samples": 1},
    )
    loaded = manager.load(["ropescale_passkey"])
    assert sorted(loaded["tasks"], key=lambda n: int(n[8:-1])) == [f"passkey_{k}k" for k in (2, 4, 8, 16, 32)]
    assert [len(list(t.test_docs())) for t in loaded["tasks"].values()] == [1] * 5


# ---------------------------------------------------------------------------------- runs


def test_run_harness_end_to_end(tiny_dir, tmp_path):
    out = tmp_path / "run"
    results = harness.run_harness(
        str(tiny_dir),
        "passkey_2k",
        method="yarn",
        factor=4,
        limit=2,
        output_path=out,
        device="cpu",
        log_samples=True,
        metadata={"passkey_samples": 3},
    )
    acc = results["results"]["passkey_2k"]["acc,none"]
    assert 0.0 <= acc <= 1.0 and results["n-samples"]["passkey_2k"] == {"original": 3, "effective": 2}
    assert results["ropescale"]["method"] == "yarn" and results["ropescale"]["max_length"] == 2048
    assert results["ropescale"]["metadata"]["tokenizer"] == str(tiny_dir)
    assert results["ropescale"]["metadata"]["max_seq_lengths"] == [2048]  # RULER's lengths follow max_length
    assert results["configs"]["passkey_2k"]["metadata"]["max_seq_lengths"] == [2048]
    assert len(results["samples"]["passkey_2k"]) == 2
    assert json.loads((out / "results.json").read_text())["results"]["passkey_2k"]["acc,none"] == acc
    assert "passkey_2k" in harness.format_results(results)


def test_cli_command(tiny_dir, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    harness.register(parser.add_subparsers())
    out = tmp_path / "res.json"
    args = parser.parse_args(
        [
            "harness",
            "--model",
            str(tiny_dir),
            "--method",
            "dynamic",
            "--factor",
            "4",
            "--tasks",
            "passkey_2k",
            "--limit",
            "1",
            "--device",
            "cpu",
            "--metadata",
            "passkey_samples=3",
            "--output",
            str(out),
        ]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "passkey_2k" in printed and "|acc" in printed and f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert data["ropescale"]["method"] == "dynamic_ntk" and data["n-samples"]["passkey_2k"]["original"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "none", "--factor", "4", "--tasks", "passkey_2k"], "--method none"),
        (["--tasks", "passkey_2k"], "--method yarn needs --factor"),
        (["--method", "yarn", "--factor", "4", "--tasks", "no_such_task"], "unknown task"),
        (["--method", "yarn", "--factor", "4", "--tasks", "passkey_2k", "--limit", "0"], "limit must be a positive"),
        (["--method", "yarn", "--factor", "4", "--tasks", ","], "no tasks given"),
        (["--method", "yarn", "--factor", "4", "--tasks", "passkey_2k", "--metadata", "oops"], "--metadata expects"),
    ],
)
def test_cli_bad_arguments_fail_before_loading(tiny_dir, argv, message, monkeypatch):
    monkeypatch.setattr(harness, "task_manager", _no_defaults_task_manager(harness.task_manager))
    parser = argparse.ArgumentParser()
    harness.register(parser.add_subparsers())
    args = parser.parse_args(["harness", "--model", str(tiny_dir), *argv])
    with pytest.raises(ValueError, match=message):
        args.func(args)


def _no_defaults_task_manager(original):
    """task_manager that never indexes lm-eval's 15k built-in tasks (12 s): unknown names fail fast."""
    from lm_eval.tasks import TaskManager

    def manager(tasks, include_path=None, metadata=None):
        m = TaskManager(include_path=harness._include_paths(include_path), include_defaults=False, metadata=metadata)
        missing = [t for t in tasks if t not in m.all_tasks]
        if missing:
            raise ValueError(f"unknown task(s): {', '.join(missing)}")
        return m

    return manager


def test_lm_eval_cli_wrapper_adds_the_task_folder(monkeypatch):
    import lm_eval.__main__

    seen = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(list(sys.argv[1:])))
    monkeypatch.setattr(sys, "argv", ["harness"])
    harness.lm_eval_main(["run", "--model", "ropescale", "--tasks", "passkey_4k"])
    harness.lm_eval_main(["run", "--include_path", "mine", "--tasks", "x"])
    harness.lm_eval_main(["--help"])
    assert seen[0][-2:] == ["--include_path", str(harness.TASKS_DIR)]
    assert seen[1] == ["run", "--include_path", "mine", "--tasks", "x"]
    assert seen[2] == ["--help"]


def test_target_length_instead_of_factor(tiny_dir):
    import inspect

    import ropescale

    if "target_length" not in inspect.signature(ropescale.from_pretrained).parameters:
        pytest.skip("this ropescale has no target_length")
    lm = _lm(tiny_dir, method="yarn", target_length=4 * TINY_CONTEXT)
    assert lm.model.config.ropescale["params"]["factor"] == 4.0 and lm.max_length == 4 * TINY_CONTEXT


def test_ready_patched_model_and_tokenizer(tiny_dir):
    import ropescale

    model = ropescale.from_pretrained(str(tiny_dir), method="linear", factor=2)
    cls = lm_eval.api.registry.get_model("ropescale")
    lm = cls(pretrained=model, tokenizer=str(tiny_dir))
    assert lm.model is model and lm.max_length == 2 * TINY_CONTEXT
    with pytest.raises(ValueError, match="used as it is"):
        cls(pretrained=model, tokenizer=str(tiny_dir), method="yarn", factor=4)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        cls(pretrained=model)
    with pytest.raises(ValueError, match="used as it is"):
        harness.run_harness(lm, "passkey_2k", method="yarn")
