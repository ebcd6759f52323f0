"""Chat data (JSONL rows with messages): rendered by the tokenizer's chat template, loss on the assistant's
turns only or on every token, refused without a template."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ropescale.data.chat import chat_tokens
from ropescale.data.documents import load_documents
from ropescale.errors import RopescaleError
from ropescale.scoring.nll import IGNORE_INDEX
from ropescale.training.data import WindowDataset, WindowSpec, tokenize_stream
from tests.training.conftest import char_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello?"},
    {"role": "assistant", "content": "Hi there."},
    {"role": "user", "content": "Bye."},
    {"role": "assistant", "content": "Farewell."},
]


def _chat_tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_assistant_loss_covers_the_assistant_turns_only():
    tok = _chat_tokenizer()
    ids, mask = chat_tokens(tok, CONVERSATION, "assistant", where="t")
    text = "".join(tok.convert_ids_to_tokens(ids.tolist()))
    assert text.startswith("<system>Be brief.</>") and "<s>" not in text  # the packing adds BOS
    trained = "".join(tok.convert_ids_to_tokens([int(i) for i in ids[mask.astype(bool)]]))
    assert trained == "Hi there.</>\nFarewell.</>\n"
    all_ids, none = chat_tokens(tok, CONVERSATION, "all", where="t")
    assert none is None and all_ids.tolist() == ids.tolist()


def test_chat_jsonl_windows_put_loss_on_assistant_tokens_only(tmp_path):
    pytest.importorskip("datasets")
    tok = _chat_tokenizer()
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": CONVERSATION}, {"messages": CONVERSATION[1:3]}] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = load_documents(str(path))
    assert len(docs) == 6 and isinstance(docs[0][1], list)
    stream = tokenize_stream(tok, docs, packing="documents", chat_loss="assistant")
    ds = WindowDataset(stream, WindowSpec(64, tok.bos_token_id, documents=True))
    assistant = set("Hi there.Farewell</>\n") | {"</s>"}  # characters of the assistant turns, and EOS
    for slot in range(len(ds)):
        w = ds.window(slot, slot)
        labels = w["labels"][w["labels"] != IGNORE_INDEX].tolist()
        assert labels and set(tok.convert_ids_to_tokens(labels)) <= assistant
        user_side = w["input_ids"][w["labels"] == IGNORE_INDEX].tolist()
        assert "?" in tok.convert_ids_to_tokens(user_side) or "B" in tok.convert_ids_to_tokens(user_side)


def test_chat_without_a_template_is_refused():
    with pytest.raises(RopescaleError, match=r"holds chat messages, but the tokenizer .* has no chat template"):
        chat_tokens(char_tokenizer(), CONVERSATION, "assistant", where="chat.jsonl[0]")


@pytest.mark.parametrize("loss", ["all", "assistant"])
def test_a_template_that_is_not_jinja_is_one_line(loss):
    """Before: jinja2's TemplateSyntaxError, exit 1, with no word of the template or its file."""
    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }"
    with pytest.raises(RopescaleError) as err:
        chat_tokens(tok, CONVERSATION, loss, where="chat.jsonl[0]")
    assert str(err.value).startswith("the chat template of '")
    assert "does not render (TemplateSyntaxError: " in str(err.value) and "fix chat_template.jinja" in str(err.value)


def test_template_that_rewrites_earlier_turns_is_refused_for_assistant_loss():
    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{{ messages | length }}{% endfor %}"
    with pytest.raises(RopescaleError, match=r"does not render the conversation turn by turn.*chat_loss=all"):
        chat_tokens(tok, CONVERSATION, "assistant", where="t")
    ids, _ = chat_tokens(tok, CONVERSATION, "all", where="t")
    assert np.asarray(ids).size > 0
