"""How a recommendation reads: the short answer ``ropescale recommend`` prints by default
(:func:`format_short`), the whole block of ``--verbose`` (:func:`format_recommendation`) and the record
of ``--json`` (:func:`to_record`).

The choice itself is :mod:`.recommend`'s; nothing here decides, it only says what was decided and what
backs it, each evidence file named once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ropescale.evals.advice.evidence import Evidence, same_model
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.tradeoffs import num

if TYPE_CHECKING:
    from ropescale.evals.advice.recommend import Recommendation


def headline(rec: Recommendation) -> str:
    """``recommendation:  yarn ×4, training-free``: the method, its factor and parameters."""
    if rec.method is None:
        return "recommendation:  none"
    exact = "" if abs(rec.factor - rec.ratio) < 1e-9 else f" (rounded up from {rec.ratio:.3g})"
    how = "training-free" if rec.budget == "training-free" else "then fine-tune (PoSE)"
    params = "".join(f", {k}={v}" for k, v in rec.params.items())
    return f"recommendation:  {rec.method} ×{rec.factor:g}{params}{exact}, {how}"


def wrap_field(label: str, text: str, width: int = 110) -> list[str]:
    """``label`` and ``text`` wrapped at ``width`` under an 11-column label, a number kept with its unit and
    its comparison on one line ("< 30 %" is never cut into "<", "30" and "% at 4k")."""
    import textwrap

    held = text
    for joined in (" %", "< ", "> ", "≤ ", "≥ "):
        held = held.replace(joined, joined.replace(" ", "\u00a0"))
    lines = textwrap.wrap(
        held, width, initial_indent=f"{label:<11}", subsequent_indent=" " * 11, break_on_hyphens=False
    )
    return [line.replace("\u00a0", " ") for line in lines]


def format_short(rec: Recommendation) -> str:
    """What ``ropescale recommend`` prints by default: the answer first, in a few lines — the method
    with its parameters, one line of why (with its numbers and how many prompts back them), what to
    know before running it, the commands, and where the detail is."""
    wrap = wrap_field

    if rec.method is None and rec.budget == "none" and rec.ratio > 1:  # --serve-with: nothing it serves
        return f"recommendation:  none: {rec.why}"
    lines = [
        f"{headline(rec)}   ({rec.model}: {rec.original_context:,} → {rec.target_length:,} tokens, ×{rec.ratio:.3g})"
    ]
    if rec.starts and " the shipped " in rec.starts:  # an already extended checkpoint: what it builds on
        lines += wrap("starts:", rec.starts)
    if rec.perplexity:
        lines += wrap("measured:", rec.perplexity)
    lines += wrap("why:", rec.why)
    if rec.retrieval and not rec.retrieval_in_why:  # one line per fact: the why's retrieval is the frontier's
        lines += wrap("retrieval:", _cited_once(rec.retrieval, rec.why))
    if rec.battery_record:
        lines += wrap("battery:", rec.battery_record["short"])
    for other in rec.also:
        lines += wrap("also:", other)
    if rec.serve:
        lines += wrap("serve:", rec.serve)
    for caveat in rec.caveats:
        if caveat != rec.retrieval:
            lines += wrap("caveat:", caveat)
    from ropescale.methods import method_class

    attention = rec.method is not None and bool(method_class(rec.method).attention)
    for what, command in rec.commands:
        if what == "alternative" and attention:
            what = f"for vLLM, SGLang, TGI, llama.cpp ({rec.method} runs only where ropescale patches the model)"
        lines += [f"{what}:", f"  {command}"]
    lines.append("more:      --verbose (every reason, the measured trade-offs and their evidence), --json (the record)")
    return "\n".join(lines)


def _cited_once(text: str, before: str) -> str:
    """``text`` without the evidence files the line above already cites (the short answer names each once)."""
    for path in re.findall(r"evals/measured/[\w./-]+\.json", text):
        if path in before:
            text = text.replace(f", {path}", "").replace(f" ({path})", "")
    return text


def to_record(rec: Recommendation) -> dict[str, Any]:
    """The whole recommendation as JSON-ready data (``ropescale recommend --json``)."""
    from dataclasses import asdict

    def evidence(ev: Evidence) -> dict[str, Any]:
        out = asdict(ev)
        out["commands"] = ev.commands
        return out

    return {
        "model": rec.model,
        "original_context": rec.original_context,
        "target_length": rec.target_length,
        "ratio": rec.ratio,
        "budget": rec.budget,
        "method": rec.method,
        "factor": rec.factor,
        "params": rec.params,
        "why": rec.why,
        "perplexity": rec.perplexity,
        "retrieval": rec.retrieval,
        "battery": rec.battery_record,
        "also": rec.also,
        "serve": rec.serve,
        "caveats": rec.caveats,
        "reasons": rec.reasons,
        "commands": [{"what": what, "command": command} for what, command in rec.commands],
        "tradeoffs": [{"text": text, "source": ev.source} for text, ev in rec.tradeoffs],
        "evidence": [evidence(ev) for ev in rec.evidence],
    }


def format_recommendation(rec: Recommendation, spec: Any = None) -> str:
    """The whole readable block ``ropescale recommend --verbose`` prints."""
    geometry = (
        f" (head_dim {spec.head_dim}, base {spec.base:g}, trained context {rec.original_context:,})" if spec else ""
    )
    lines = [
        f"model:           {rec.model}{geometry}",
        f"target:          {rec.target_length:,} tokens = {rec.ratio:.3g}× the trained context",
    ]
    lines.append(headline(rec))
    lines += ["", "why:"] + [f"  - {r}" for r in rec.reasons]
    if rec.method is not None:
        heading = (
            "expected trade-off (measured"
            if rec.budget == "training-free"
            else "expected trade-off without the fine-tune (measured training-free"
        )
        others = sorted({ev.model for _, ev in rec.tradeoffs if not same_model(ev.model, rec.model)})
        if others:
            heading += f"; on {', '.join(others)}: expect the shape, not the numbers"
        lines += ["", heading + "):"]
        lines += [f"  - {t}" for t, _ in rec.tradeoffs] or [
            f"  - no measurements of {rec.method} found; run `ropescale eval suite` to measure it"
        ]
    if rec.battery_record:
        from ropescale.evals.advice.battery_table import battery_table

        lines += ["", "battery: " + rec.battery_record["line"], *battery_table(rec.battery_record)]
    if rec.commands:
        width = max(len(what) for what, _ in rec.commands) + 1
        lines += ["", "run:"] + [f"  {what + ':':<{width}} {cmd}" for what, cmd in rec.commands]
    used = list(dict.fromkeys(id(ev) for _, ev in rec.tradeoffs))
    for ev in (e for e in rec.evidence if id(e) in used):
        lines += ["", f"evidence: {ev.source} — {ev.note}", evidence_table(ev)]
        lines += [f"  measured with: {command}" for command in ev.commands]
    return "\n".join(lines)


def evidence_table(ev: Evidence) -> str:
    ppl_lengths = sorted({n for r in ev.rows for n in r.ppl})
    pk_lengths = sorted({n for r in ev.rows for n in r.passkey})
    width = max(len(r.title) for r in ev.rows)
    head = f"  {'':<{width}}  " + "".join(f"{'PPL ' + _k(n):>10}" for n in ppl_lengths)
    if pk_lengths:
        head += "  " + "".join(f"{'passkey ' + _k(n):>12}" for n in pk_lengths)
    lines = [head]
    for r in ev.rows:
        line = f"  {r.title:<{width}}  " + "".join(
            f"{num(r.ppl[n]):>10}" if n in r.ppl else f"{'—':>10}" for n in ppl_lengths
        )
        if pk_lengths:
            line += "  " + "".join(f"{r.passkey[n]:>12.0%}" if n in r.passkey else f"{'—':>12}" for n in pk_lengths)
        lines.append(line)
    return "\n".join(lines)
