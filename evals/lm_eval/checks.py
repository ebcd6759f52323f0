"""Two lm-eval traps for long-context runs, checked on the requests before the model runs any of them.

* **Over-long prompts.** lm-eval's HF model cuts a prompt from the LEFT when it does not fit:
  ``generate_until`` keeps the last ``max_length - max_gen_toks`` tokens, ``loglikelihood`` the
  last ``max_length + 1`` of context and continuation, with one log line. For retrieval tasks that
  silently evaluates another task (the instructions, or the needle, are gone). The ``ropescale``
  model stops instead, before the first request runs: :func:`check_generation` and
  :func:`check_loglikelihood` raise a :class:`~ropescale.errors.RopescaleError` naming the task,
  the longest prompt and ``max_length``, and what to set. ``truncate_prompts=true`` (a model
  argument) restores lm-eval's truncation for tasks where it is intended.
* **RULER at its default length.** lm-eval's RULER tasks build their prompts at
  ``max_seq_lengths`` from the task metadata, ``[4096]`` unless told. A scaled model evaluated at
  4k within its trained context tests nothing of the scaling, and the results look fine.
  :func:`ruler_note` logs one warning per run when every RULER prompt of a scaled model's run fits
  in the trained context, saying which lengths RULER used and how to set them.
  (:func:`~ropescale.evals.lm_eval.runner.run_harness` and ``ropescale eval harness`` set
  ``max_seq_lengths`` to ``[max_length]`` unless given; lm-eval's own CLI does not.)

The checks read what lm-eval hands the model (``Instance`` objects, or token lists for
``loglikelihood``) and the model's ``max_length``, ``tok_encode`` and ``ropescale_config``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ropescale.errors import RopescaleError

log = logging.getLogger(__name__)

#: the fields of a RULER document (lm_eval/tasks/ruler/prepare_niah.py and friends)
RULER_FIELDS = frozenset({"input", "outputs", "max_length"})
OPT_OUT = "or model_args truncate_prompts=true to let lm-eval cut prompts from the left"


def _max_gen_toks(gen_kwargs: Any, default: int) -> int:
    """The generation budget lm-eval's HF model reserves for a request (its aliases included)."""
    try:
        from lm_eval.models.utils import normalize_gen_kwargs

        return int(normalize_gen_kwargs(dict(gen_kwargs or {}), default)["max_gen_toks"])
    except (ImportError, KeyError, TypeError):  # an older lm-eval: its one key
        return int((gen_kwargs or {}).get("max_gen_toks", default))


def check_generation(lm: Any, requests: Sequence[Any]) -> None:
    """Stop when a ``generate_until`` prompt plus its generation budget exceeds ``lm.max_length``.

    Args:
        lm: the ``ropescale`` model (``max_length``, ``max_gen_toks``, ``tok_encode``).
        requests: lm-eval ``Instance`` objects; ``args`` is ``(context, gen_kwargs)``.

    Raises:
        RopescaleError: one line naming the task, the prompt length, the budget and ``max_length``.
    """
    worst: tuple[int, int, str] | None = None  # (prompt tokens, budget, task)
    for req in requests:
        context, gen_kwargs = req.args[0], req.args[1] if len(req.args) > 1 else {}
        budget = _max_gen_toks(gen_kwargs, lm.max_gen_toks)
        n = len(lm.tok_encode(context))
        if n + budget > lm.max_length and (worst is None or n + budget > worst[0] + worst[1]):
            worst = (n, budget, req.task_name or "?")
    if worst is None:
        return
    n, budget, task = worst
    raise RopescaleError(
        f"{task}: a prompt of {n:,} tokens plus {budget} to generate exceeds max_length {lm.max_length:,}, "
        f"and lm-eval would cut {n + budget - lm.max_length:,} tokens from its start: set max_length >= {n + budget} "
        f"(--max-length, model_args max_length=N; beyond the scaled context only deliberately), shorten the "
        f"task's prompts (RULER: --metadata max_seq_lengths), {OPT_OUT}"
    )


def check_loglikelihood(lm: Any, requests: Sequence[Any]) -> None:
    """Stop when a ``loglikelihood`` context plus continuation exceeds ``lm.max_length + 1`` tokens.

    Args:
        lm: the ``ropescale`` model.
        requests: what lm-eval passes to ``_loglikelihood_tokens``: ``(strings, context_ids,
            continuation_ids)`` triples (rolling-window requests never exceed the limit).

    Raises:
        RopescaleError: one line naming the request length and ``max_length``.
    """
    longest = max((len(r[1]) + len(r[2]) for r in requests), default=0)
    if longest > lm.max_length + 1:
        raise RopescaleError(
            f"a loglikelihood request of {longest:,} tokens (context and continuation) exceeds max_length "
            f"{lm.max_length:,}, and lm-eval would cut {longest - lm.max_length - 1:,} tokens from its start: "
            f"set max_length >= {longest - 1} (--max-length, model_args max_length=N), {OPT_OUT}"
        )


def ruler_lengths(requests: Sequence[Any]) -> tuple[list[str], int | None]:
    """The RULER tasks among ``requests`` and the longest length their documents were built for."""
    tasks, longest = set(), None
    for req in requests:
        doc = getattr(req, "doc", None)
        if isinstance(doc, dict) and RULER_FIELDS <= doc.keys() and isinstance(doc["max_length"], int):
            tasks.add(req.task_name or "?")
            longest = max(longest or 0, doc["max_length"])
    return sorted(tasks), longest


def ruler_note(lm: Any, requests: Sequence[Any], trained: int) -> str | None:
    """A one-line warning when a scaled model's RULER prompts all fit in its trained context.

    Args:
        lm: the ``ropescale`` model (``ropescale_config``, ``max_length``).
        requests: lm-eval ``Instance`` objects of one ``generate_until`` call.
        trained: the model's trained context L.

    Returns:
        The message (also logged as a warning), or None when there is nothing to say: the model is
        not scaled, no RULER task runs, or some RULER prompt goes beyond L.
    """
    extended = (lm.ropescale_config or {}).get("extended_context")
    if not extended or extended <= trained:
        return None
    tasks, longest = ruler_lengths(requests)
    if longest is None or longest > trained:
        return None
    target = min(int(extended), int(lm.max_length))
    message = (
        f"ropescale: RULER ({', '.join(tasks)}) builds prompts of at most {longest:,} tokens here, within the "
        f"trained context {trained:,}, so the scaled context {extended:,} is not tested (lm-eval's RULER uses "
        f"max_seq_lengths [4096] unless told): set --metadata '{{\"max_seq_lengths\": [{target}]}}' "
        f"(ropescale eval harness: --metadata max_seq_lengths=[{target}])"
    )
    log.warning(message)
    return message
