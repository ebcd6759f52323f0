"""Chat data: conversations (JSONL rows with ``messages``) rendered by the tokenizer's chat template.

Each conversation is one training document: the text the model's own chat template makes of it,
so fine-tuning sees the format the model is served with. ``data.chat_loss`` chooses the targets:

* ``assistant`` (default): only the assistant's turns — their text and the template's end-of-turn
  marker after it — are predicted; system and user text and the template's headers are context.
  An assistant turn is found as the text the template adds between the conversation rendered up
  to the turn's generation prompt and rendered through the turn; a template that rewrites earlier
  turns as the conversation grows (some drop past reasoning) is refused in one line.
* ``all``: every token of the rendered conversation.

A tokenizer without a chat template is refused in one line (no format is guessed).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import RopescaleError


def _name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or "the model's tokenizer")


def _messages(messages: Any, where: str) -> list[dict[str, str]]:
    ok = isinstance(messages, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    )
    if not ok or not messages:
        raise RopescaleError(f"data '{where}': 'messages' must be a non-empty list of {{role, content}} strings")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _render(tokenizer: Any, messages: list[dict[str, str]], prompt: bool = False) -> str:
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
    except TemplateError as exc:  # a template that is not valid Jinja: jinja2's class name and nothing else
        line = f", line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise RopescaleError(
            f"the chat template of '{_name(tokenizer)}' does not render ({type(exc).__name__}: "
            f"{' '.join(str(exc.message or exc).split())[:200]}{line}); fix chat_template.jinja (or "
            "tokenizer_config.json's chat_template), or give text (a 'text' field)"
        ) from None
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        text = text[len(bos) :]  # the packing adds BOS before every document
    return text


def chat_text(tokenizer: Any, messages: Any, where: str) -> str:
    """The conversation as the tokenizer's chat template writes it (BOS left to the caller)."""
    if not getattr(tokenizer, "chat_template", None):
        raise RopescaleError(
            f"data '{where}' holds chat messages, but the tokenizer of '{_name(tokenizer)}' has no chat template; "
            "give text (a 'text' field) or a model whose tokenizer has one"
        )
    return _render(tokenizer, _messages(messages, where))


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]], text: str, where: str) -> list[tuple[int, int]]:
    """Character ranges of ``text`` (the whole rendered conversation) that the assistant's turns add."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], prompt=True) if i else ""
        through = _render(tokenizer, messages[: i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise RopescaleError(
                f"data '{where}': the chat template of '{_name(tokenizer)}' does not render the conversation turn "
                f"by turn (message {i} changes the text before it), so its assistant turns cannot be told apart; "
                "set data.chat_loss=all"
            )
        spans.append((len(before), len(through)))
    return spans


def chat_tokens(tokenizer: Any, messages: Any, loss: str, where: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Token ids of one conversation and, for ``loss="assistant"``, 1 on the assistant's tokens.

    Returns:
        ``(ids, mask)``: ``mask`` None for ``loss="all"``. # [n] int32, [n] uint8
    """
    text = chat_text(tokenizer, messages, where)
    if loss == "all":
        return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32), None
    spans = assistant_spans(tokenizer, _messages(messages, where), text, where)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], np.int32)
    offsets = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)  # [n, 2] character range of each token
    mask = np.zeros(ids.size, np.uint8)
    for lo, hi in spans:
        mask[(offsets[:, 0] < hi) & (offsets[:, 1] > lo)] = 1
    return ids, mask
