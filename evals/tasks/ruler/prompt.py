"""How a RULER prompt reaches the model: ``plain`` (lm-eval's text as it is) or ``chat`` (wrapped in the
tokenizer's chat template, as RULER, arXiv 2404.06654, runs instruct models).

``chat`` builds the turns as lm-eval does with ``--apply_chat_template`` for a task with a
``gen_prefix``: the sample's input is the user turn, the ``gen_prefix`` opens the assistant turn, and the
template renders them with ``continue_final_message`` so the model continues the prefix. The template's
own tokens (a default system turn, the role markers) are taken off the length lm-eval's generator fills,
as RULER's ``model_template_token`` does, so a chat prompt plus its answer still fits the cell's length.
"""

from __future__ import annotations

from typing import Any

#: the prompt formats, the first the default
PROMPTS = ("plain", "chat")


def check_prompt(prompt: str, tokenizer: Any, model: str = "") -> None:
    """Refuse an unknown format, or ``chat`` with a tokenizer that has no chat template (a base model).

    Raises:
        ValueError: naming the value, or the model and the key (``chat_template``) it lacks, or a
            template that does not render (not valid Jinja, or one that raises on a user turn).
    """
    if prompt not in PROMPTS:
        raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    if prompt == "chat" and not getattr(tokenizer, "chat_template", None):
        where = f"model '{model}'" if model else "the model"
        raise ValueError(
            f"prompt chat: {where} has no chat template (neither chat_template.jinja nor tokenizer_config.json's "
            "chat_template); "
            "a base model takes the plain prompt"
        )
    if prompt == "chat":
        try:  # transformers compiles the template on first use: after the weights, in the first cell
            chat_text(tokenizer, "", "")
        except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError, a raise_exception() in it...
            where = f"model '{model}'" if model else "the model"
            line = f", line {exc.lineno}" if getattr(exc, "lineno", None) else ""
            text = " ".join(str(getattr(exc, "message", None) or exc).split())[:200]
            raise ValueError(
                f"prompt chat: the chat template of {where} does not render ({type(exc).__name__}: {text}{line}); "
                "fix chat_template.jinja (or tokenizer_config.json's chat_template), or take the plain prompt"
            ) from None


def chat_text(tokenizer: Any, user: str, prefix: str) -> str:
    """``user`` as the user turn and ``prefix`` opening the assistant's, rendered by the tokenizer's
    chat template (lm-eval's turns for a ``gen_prefix`` task, continued, not closed)."""
    turns = [{"role": "user", "content": user}, {"role": "assistant", "content": prefix}]
    return tokenizer.apply_chat_template(turns, tokenize=False, continue_final_message=True)


def template_tokens(tokenizer: Any) -> int:
    """Tokens the chat template adds around empty turns: what RULER takes off the generator's length."""
    from ropescale.evals.tasks.generation import encode

    return len(encode(tokenizer, chat_text(tokenizer, "", "")))


def starts_with_bos(tokenizer: Any, text: str) -> bool:
    """Whether the rendered text already opens with the tokenizer's BOS (Llama 3's template writes it;
    a second one would be added otherwise)."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and text.startswith(bos)


__all__ = ["PROMPTS", "chat_text", "check_prompt", "starts_with_bos", "template_tokens"]
