"""The preflight (ropescale/training/preflight.py): every check a run can fail after its weights load
fires before they load, in ``train`` and in ``train --dry-run``.

Tested the hard way: the model folder has no weights file (its config and tokenizer only; a garbage
file would be refused by the header check that every load, the tokenizer's included, makes first), so
a check that needed the weights, or came after their load, would end in the load's error instead of
its own line.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

from ropescale.cli.main import main
from tests.conftest import tiny_model
from tests.training.conftest import char_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TEXT = "It is a truth universally acknowledged, that a single man in possession of a good fortune. " * 8


@pytest.fixture
def broken_model(tmp_path):
    """A tiny Llama folder (context 64) with its tokenizer and no weights to load."""
    path = tmp_path / "model"
    tiny_model("llama", attn_implementation="sdpa").save_pretrained(path)
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    (path / "model.safetensors").unlink()
    return path


def _recipe(tmp_path, model, **sections) -> str:
    raw = {
        "model": {"name": str(model), "attn_implementation": "sdpa"},
        "scaling": {"method": "yarn", "factor": 4},
        "lora": {"r": 2, "alpha": 4},
        "data": {"seq_len": 32},
        "optim": {"warmup_steps": 1},
        "train": {"max_steps": 2, "output_dir": str(tmp_path / "run"), "gradient_checkpointing": False},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _folder(tmp_path, name: str, texts: dict[str, str]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    for title, text in texts.items():
        (folder / f"{title}.txt").write_text(text)
    return str(folder)


def _jsonl(tmp_path, name: str, rows: list[dict]) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _refused_twice(recipe: str, capsys, expected: str) -> str:
    """The real run and the dry run both stop on ``expected`` (exit 2), the run before its weights load
    (there are no weights: a later stop would print the load's error)."""
    for extra in ([], ["--dry-run"]):
        code = main(["train", "--config", recipe, "--no-progress", *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        assert expected in err, err
        assert "safetensors" not in err.lower()
    return err


def test_chat_without_an_assistant_turn_is_refused_before_the_weights(tmp_path, broken_model, capsys):
    rows = [{"messages": [{"role": "user", "content": TEXT}]}, {"messages": [{"role": "system", "content": TEXT}]}]
    recipe = _recipe(tmp_path, broken_model, data={"source": _jsonl(tmp_path, "chat.jsonl", rows)})
    _refused_twice(recipe, capsys, "none of its 2 conversations has an assistant turn, so data.chat_loss=assistant")
    assert not (tmp_path / "run").exists()


def test_a_stream_with_no_target_is_refused_where_it_is_packed():
    from ropescale.errors import RopescaleError
    from ropescale.training.data import tokenize_stream

    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    with pytest.raises(RopescaleError, match="no token of the training text is a target"):
        tokenize_stream(tok, [("c", [{"role": "user", "content": "hi"}])], packing="documents")


def test_a_jsonl_of_text_and_chat_rows_keeps_both(tmp_path, broken_model, capsys):
    from ropescale.data.documents import load_documents

    chat = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    user = [{"role": "user", "content": "Anyone?"}]  # no target of its own: the text rows still train
    rows = [{"messages": user}, {"text": TEXT}, {"messages": chat}, {"text": TEXT}]
    docs = load_documents(_jsonl(tmp_path, "mixed.jsonl", rows))
    assert [type(text) for _, text in docs] == [list, str, list, str]  # before: the chat rows were dropped
    assert docs[2] == ("mixed[2]", chat)
    recipe = _recipe(tmp_path, broken_model, data={"source": str(tmp_path / "mixed.jsonl")})
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    assert "4 training documents, 2 of them conversations" in capsys.readouterr().out


def test_weights_that_overflow_their_sum_are_refused(tmp_path, broken_model, capsys):
    a, b = _folder(tmp_path, "a", {"a": TEXT}), _folder(tmp_path, "b", {"b": TEXT})
    sources = [{"source": a, "weight": 1e308}, {"source": b, "weight": 1e308}]
    recipe = _recipe(tmp_path, broken_model, data={"sources": sources})
    line = "data.sources weights sum past the largest float (1e+308 + 1e+308); only their ratios count"
    _refused_twice(recipe, capsys, line)
    assert main(["data", "list", "--config", recipe]) == 2  # before: 0 % / 0 %
    assert line in capsys.readouterr().err


def test_evaluation_without_held_out_text_is_refused_before_the_first_step(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT, "b": TEXT})
    recipe = _recipe(tmp_path, broken_model, data={"source": source}, eval={"every": 1})
    _refused_twice(recipe, capsys, "evaluation needs held-out text: set data.holdout (titles or a count) or eval.data")


def test_an_evaluation_window_longer_than_the_held_out_text_is_refused(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT, "b": TEXT[:100]})
    recipe = _recipe(tmp_path, broken_model, data={"source": source, "holdout": ["b"]}, eval={"every": 1})
    # the target length (64 x 4) is the evaluation's length: the held-out book has 100 tokens
    err = _refused_twice(recipe, capsys, "no held-out document has the 256 tokens an evaluation window needs")
    assert "the longest has 100): lower eval.length" in err
    recipe = _recipe(tmp_path, broken_model, data={"source": source, "holdout": ["b"]}, eval={"every": 1, "length": 64})
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    assert "evaluation: held-out text holds a window of 64 tokens (every 1 steps)" in capsys.readouterr().out


def test_a_pose_target_longer_than_the_text_is_refused(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT[:200]})
    recipe = _recipe(tmp_path, broken_model, data={"source": source}, pose={"enabled": True})
    _refused_twice(recipe, capsys, "fewer than one window needs (256 for PoSE target 256 with content=skip)")


@pytest.mark.parametrize("kind", ["empty folder", "fifo", "malformed jsonl"])
def test_unreadable_data_is_refused_before_the_weights(tmp_path, broken_model, capsys, kind):
    if kind == "empty folder":
        source, line = str(tmp_path / "empty"), "has no .txt files"
        os.mkdir(source)
    elif kind == "fifo":
        source, line = str(tmp_path / "pipe"), "is not a regular file or folder (a FIFO"
        os.mkfifo(source)
    else:
        source = str(tmp_path / "rows.jsonl")
        with open(source, "w") as f:
            f.write('{"text": "a"}\n{"text": "b"\n{"text": "c"}\n')
        line = f"data '{source}' line 2 is not valid JSON (Expecting ',' delimiter); each line must be one JSON object"
    recipe = _recipe(tmp_path, broken_model, data={"source": source})
    _refused_twice(recipe, capsys, line)


def test_an_unknown_source_in_a_mix_stops_the_run_and_the_dry_run_says_it(tmp_path, broken_model, capsys):
    a = _folder(tmp_path, "a", {"a": TEXT})
    sources = [{"source": a}, {"source": "austn"}]
    recipe = _recipe(tmp_path, broken_model, data={"sources": sources})
    assert main(["train", "--config", recipe, "--no-progress"]) == 2
    assert "data 'austn' not found here" in capsys.readouterr().err
    assert main(["train", "--config", recipe, "--dry-run"]) == 0  # it may be there where the run runs
    out = capsys.readouterr().out
    assert "data: data 'austn' not found here" in out and "windows: 'austn' not checked" in out


def test_a_hub_source_offline_and_not_cached_is_said_by_the_dry_run(tmp_path, broken_model, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = _recipe(tmp_path, broken_model, data={"source": "hub:nobody/no-such-dataset"})
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    assert "cannot be read here: HF_HUB_OFFLINE=1 and it is not in the datasets cache" in capsys.readouterr().out
    assert main(["train", "--config", recipe, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "data 'hub:nobody/no-such-dataset' cannot be read here: HF_HUB_OFFLINE=1" in err


def test_a_symlink_loop_in_a_python_source_is_left_out(tmp_path, broken_model, capsys):
    from ropescale.data.sources import SourceSpec, describe_source
    from ropescale.training.mixing import source_fingerprint

    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n" * 100)
    (root / "pkg" / "loop.py").symlink_to("loop.py")
    spec = SourceSpec(f"python:{root}")
    assert source_fingerprint(spec) and describe_source(spec)["documents"] == 1  # before: OSError (ELOOP)
    recipe = _recipe(tmp_path, broken_model, data={"sources": [{"source": spec.source}]})
    assert main(["data", "list", "--config", recipe]) == 0
    capsys.readouterr()
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    assert f"data: 'python:{root}' readable, 1 training documents" in capsys.readouterr().out


def test_a_warm_up_longer_than_the_run_is_refused(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT})
    recipe = _recipe(
        tmp_path, broken_model, data={"source": source}, optim={"warmup_steps": 20}, train={"max_steps": 3}
    )
    _refused_twice(recipe, capsys, "optim.warmup_steps 20 is more than train.max_steps 3: the learning rate")


def test_an_output_folder_that_cannot_be_created_is_refused(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT})
    (tmp_path / "file").write_text("x")
    recipe = _recipe(
        tmp_path, broken_model, data={"source": source}, train={"output_dir": str(tmp_path / "file" / "run")}
    )
    code = main(["train", "--config", recipe, "--dry-run"])
    assert code == 2
    assert f"train.output_dir '{tmp_path / 'file' / 'run'}' cannot be created: '{tmp_path / 'file'}' is a file" in (
        capsys.readouterr().err
    )


def test_the_dry_run_prints_what_it_checked(tmp_path, broken_model, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT, "b": TEXT})
    recipe = _recipe(
        tmp_path, broken_model, data={"source": source, "holdout": ["a"]}, pose={"enabled": True}, eval={"at_end": True}
    )
    recipe = _recipe(
        tmp_path, broken_model, data={"source": source, "holdout": ["b"]}, pose={"enabled": True}, eval={"at_end": True}
    )
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("preflight:") : out.index("---")].splitlines()
    assert [line.split(":")[0].strip() for line in block] == [
        "preflight",
        "output",
        "data",
        "windows",
        "evaluation",
    ]
    assert block[0] == "preflight:     schedule: 1 warm-up steps within 2 steps, lr reaches 2e-05"
    assert f"data: '{source}' readable, 1 training documents, 1 held out" in out
    assert "windows: '" + source + "' holds a window of 256 text tokens (PoSE target 256)" in out


def test_the_sliding_window_warning_names_the_recipe_key(tmp_path, capsys):
    path = tmp_path / "mistral"
    tiny_model("mistral", sliding_window=32).config.save_pretrained(path)
    recipe = _recipe(tmp_path, path)
    with pytest.warns(UserWarning, match="sliding_window=32 is smaller") as caught:
        assert main(["train", "--config", recipe, "--dry-run"]) == 0
    text = " ".join(str(w.message) for w in caught)
    assert "Set model.sliding_window=null to attend over the whole context" in text
    assert "--sliding-window" not in text  # a flag of `patch`, not of train


def test_train_help_points_to_a_page_that_exists(capsys):
    from pathlib import Path

    from cli.train import TRAIN_EXAMPLES

    root = Path(__file__).resolve().parents[2]
    pages = [w.strip("(),") for w in TRAIN_EXAMPLES.split() if w.strip("(),").endswith(".md")]
    assert "docs/finetuning.md" in pages and all((root / page).is_file() for page in pages)
    assert "## Fine-tuning" not in (root / "README.md").read_text()  # the section the help named before


def test_a_finished_resume_says_there_was_nothing_to_do(tmp_path, model_dir, capsys):
    source = _folder(tmp_path, "books", {"a": TEXT})
    recipe = _recipe(tmp_path, model_dir, data={"source": source})
    assert main(["train", "--config", recipe, "--no-progress"]) == 0
    assert "trained recipe to step 2, loss " in capsys.readouterr().out
    assert main(["train", "--config", recipe, "--no-progress", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "recipe is already trained to step 2 (train.max_steps); nothing to do: raise train.max_steps" in out
    assert " in 0 s" not in out


def test_a_corpus_not_installed_stops_the_run_and_the_dry_run_says_it(tmp_path, broken_model, capsys, monkeypatch):
    import ropescale.data.corpus as corpus

    def not_installed(name):
        raise corpus.CorpusNotInstalledError(name)

    monkeypatch.setattr(corpus, "corpus_manifest", not_installed)
    recipe = _recipe(tmp_path, broken_model, data={"source": "kjv"})
    line = "data 'kjv' is not installed here: python -m ropescale.data.corpus install --name kjv"
    assert main(["train", "--config", recipe, "--dry-run"]) == 0
    assert f"data: {line}" in capsys.readouterr().out
    assert main(["train", "--config", recipe, "--no-progress"]) == 2
    assert line in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["no .py", "empty rows", "unreadable", "python alone"])
def test_a_source_with_nothing_to_read_is_refused(tmp_path, broken_model, capsys, monkeypatch, kind):
    if kind == "no .py":
        (tmp_path / "code").mkdir()
        source, line = f"python:{tmp_path / 'code'}", f"data source 'python:{tmp_path / 'code'}' holds no readable .py"
    elif kind == "python alone":  # before: `data 'python:stdlib' not found` after the weights loaded
        source, line = "python:stdlib", "data.source 'python:stdlib': python: sources are entries of a mix, "
        line += "data.sources=[{source: python:stdlib}]"
    elif kind == "empty rows":
        source = _jsonl(tmp_path, "rows.jsonl", [{"text": ""}, {"text": ""}])
        line = f"data '{source}' holds no document (every row empty?)"
    else:
        import ropescale.data.documents as documents

        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(tmp_path / "books" / "a.txt"))

        source = _folder(tmp_path, "books", {"a": TEXT})
        monkeypatch.setattr(documents, "load_documents", denied)  # root reads every file: the OS error made by hand
        line = f"data '{source}' cannot be read: Permission denied ({tmp_path / 'books' / 'a.txt'})"
    recipe = _recipe(tmp_path, broken_model, data={"source": source} if kind != "no .py" else {"sources": [source]})
    _refused_twice(recipe, capsys, line)


def test_an_output_folder_that_is_a_file_is_refused(tmp_path, broken_model, capsys):
    (tmp_path / "file").write_text("x")
    recipe = _recipe(tmp_path, broken_model, data={"source": _folder(tmp_path, "b", {"a": TEXT})})
    assert main(["train", "--config", recipe, "--dry-run", "--output-dir", str(tmp_path / "file")]) == 2
    assert f"train.output_dir '{tmp_path / 'file'}' is a file, not a folder; give a folder" in capsys.readouterr().err
