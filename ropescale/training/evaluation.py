"""Perplexity on held-out text during training: full attention, eval mode, the target length."""

from __future__ import annotations

from typing import Any, TypedDict

from ..errors import RopescaleError
from .config import TrainConfig
from .data import split_holdout


class EvalResult(TypedDict):
    """One evaluation of the model being trained (a line of ``metrics.jsonl`` with its step)."""

    eval_length: int
    eval_ppl: float
    eval_tokens: int
    eval_seconds: float
    eval_window_nll: list[float]  # each window's mean NLL in nats


class EvalRecord(TypedDict, total=False):
    """:class:`EvalResult` with the step it was made at, on the main process; empty on the others (they
    take part in the run but do not evaluate)."""

    step: int
    eval_length: int
    eval_ppl: float
    eval_tokens: int
    eval_seconds: float
    eval_window_nll: list[float]


def eval_documents(
    config: TrainConfig, tokenizer: Any, length: int, held: list[tuple[str, Any]] | None = None
) -> list[list[int]]:
    """Token ids of the held-out documents (``eval.data`` or ``data.holdout``) long enough for one window.

    Args:
        held: the held-out documents when the caller has read them already (the preflight); default:
            read from the recipe.

    Raises:
        RopescaleError: no held-out text, or no document has ``length`` tokens (naming the longest).
    """
    from ..data.documents import load_documents, tokenize_documents

    c = config
    if held is not None:
        docs = held
    elif c.eval.data is not None:
        docs = load_documents(c.eval.data, text_field=c.data.text_field)
    elif c.data.sources:  # a mix: its held-out titles, and Emma wherever austen is mixed in
        from .mixing import mixed_heldout

        docs = mixed_heldout(c)
    else:
        docs = (
            []
            if not c.data.holdout
            else split_holdout(load_documents(c.data.source, text_field=c.data.text_field), c.data.holdout)[1]
        )
    if not docs:
        what = "(titles)" if c.data.sources else "(titles or a count)"
        raise RopescaleError(f"evaluation needs held-out text: set data.holdout {what} or eval.data")
    tokens = tokenize_documents(tokenizer, docs, max_tokens=c.eval.max_tokens or length, min_tokens=length)
    if not tokens:
        longest = max((len(ids) for ids in tokenize_documents(tokenizer, docs)), default=0)
        raise RopescaleError(
            f"no held-out document has the {length} tokens an evaluation window needs (eval.length, else the "
            f"target length; the longest has {longest}): lower eval.length, give eval.data with longer text, "
            "or set eval.every=0 eval.at_end=false"
        )
    return tokens


def evaluate_peft_model(
    peft_model: Any,
    config: TrainConfig,
    documents: list[list[int]],
    length: int,
    bos_token_id: int | None,
    base_attn: str,
    autocast: Any,
) -> EvalResult:
    """Perplexity of the model being trained, with S²-Attn switched off and eval mode for the duration.

    Args:
        peft_model: the peft model (training mode is restored afterwards).
        config: the recipe (``eval.mode``, ``eval.max_tokens``, ``s2attn``).
        documents: held-out token documents (:func:`eval_documents`).
        length: the evaluation window.
        bos_token_id: BOS prepended to every window (None: none).
        base_attn: the attention implementation S²-Attn replaced.
        autocast: a context manager factory (``accelerator.autocast``).

    Returns:
        ``eval_length``, ``eval_ppl``, ``eval_tokens``, ``eval_seconds`` and ``eval_window_nll`` (each
        window's mean NLL in nats: whether a held-out curve may still fall is read from the paired
        differences of two points' windows, ``curve_falling`` in benchmarks/extension_cpu_goal.py).
    """
    from ..scoring.perplexity import evaluate_perplexity
    from .s2attn import disable_s2attn, enable_s2attn

    hf = peft_model.get_base_model()
    if config.s2attn.enabled:
        disable_s2attn(hf, base_attn)
    peft_model.eval()
    try:
        with autocast():  # the causal LM itself: LoRA's layers are injected into it, and a full fine-tune's
            result = evaluate_perplexity(  # wrapper (FullFinetune) has no decoder for the chunked loss to run
                hf,
                documents,
                window=length,
                mode=config.eval.mode,
                bos_token_id=bos_token_id,
                max_tokens=config.eval.max_tokens,
                progress=False,
            )
    finally:
        peft_model.train()
        if config.s2attn.enabled:
            enable_s2attn(hf, config.s2attn.group_ratio)
    return {
        "eval_length": length,
        "eval_ppl": result.ppl,
        "eval_tokens": result.tokens_scored,
        "eval_seconds": result.elapsed_s,
        "eval_window_nll": [round(nll / max(n, 1), 6) for nll, n in zip(result.window_nll, result.window_tokens)],
    }
