"""Which method and factor for a target length, and what to expect: ``ropescale recommend``.

The rule is by the factor s = N / L (N the target, L the trained context) and the budget:

============  ==========================  =====================================================
s             training-free               fine-tune
============  ==========================  =====================================================
≤ 1           nothing to do               nothing to do
(1, 2]        dynamic_ntk ×s              yarn ×s + PoSE (rarely worth it this close to L)
(2, 8]        yarn ×s                     yarn ×s + PoSE
> 8           yarn ×s, with a warning     yarn ×s + PoSE (the default budget above 8)
============  ==========================  =====================================================

Why: dynamic NTK is the unscaled model up to L, and close to L it extrapolates well; further out
YaRN is the training-free method whose perplexity stays flat to s·L; far beyond that no
training-free method holds up (8× training-free YaRN gave PPL > 25 in llama.cpp tests), and
YaRN fine-tunes in few steps, PoSE on windows of L tokens (YaRN arXiv 2309.00071, PoSE arXiv
2309.10400).

Before the rule, a training-free recommendation reads the measured frontier of the same model
(:mod:`.frontier`): if a source measured a method at exactly s that keeps both the native perplexity
and the native retrieval, that method is recommended (the rule's method stays as the alternative
for engines that cannot run it). Another model's measurements never decide, they only illustrate.

The expected trade-offs (:mod:`.tradeoffs`) are read from measured results (:mod:`.evidence`): every
``results.json`` of ``ropescale eval`` for the same model, then those shipped (``evals/measured/*.json``,
each number with its command) for what the runs lack. Each names its file; a fine-tune's retrieval
losses are told apart from the noise of their prompts (Newcombe's interval of the difference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ropescale.evals.advice.evidence import Evidence, same_model, shipped_evidence
from ropescale.evals.advice.evidence import length_text as _k
from ropescale.evals.advice.recommend_finetune import fine_tune_evidence
from ropescale.evals.advice.serving import served_rows, served_rule_method
from ropescale.evals.advice.tradeoffs import LongPerplexity, PasskeyAccuracy, ShortCost, measure, num

__all__ = ["BUDGETS", "Recommendation", "recommend"]

BUDGETS = ("auto", "training-free", "fine-tune")
#: above this factor the default budget is a fine-tune
TRAINING_FREE_LIMIT = 8.0
#: up to this factor dynamic NTK is the training-free choice
DYNAMIC_LIMIT = 2.0


@dataclass
class Recommendation:
    model: str
    original_context: int
    target_length: int
    budget: str  # "training-free" | "fine-tune" | "none"
    method: str | None
    factor: float | None
    params: dict[str, Any] = field(default_factory=dict)
    why: str = ""  # the one line that answers: what backs the choice, with its numbers
    retrieval: str | None = None  # what it does to retrieval, losses first (the short answer says it)
    #: the why already says what retrieval keeps, with its numbers (a measured frontier's pick): the short
    #: answer leaves the retrieval line's per-length counts to --verbose's trade-offs and --json
    retrieval_in_why: bool = False
    perplexity: str | None = None  # the rule's answer: its measured perplexity against the unscaled model's
    also: list[str] = field(default_factory=list)  # another shipped recipe, and what its numbers measure
    serve: str | None = None  # --serve-with: what the engine serves of the candidates
    caveats: list[str] = field(default_factory=list)  # what the user must know before running it
    measured: str | None = None  # the fine-tune measured on this model (the extension experiment), if shipped
    alternative: tuple[str, float, dict[str, Any]] | None = None  # the portable method beside it: (name, ×, params)
    battery: str | None = None  # the RULER battery's line (evals/advice/battery_evidence.py), where it has cells
    battery_record: dict[str, Any] | None = None  # the same, every row, for --json and --verbose
    reasons: list[str] = field(default_factory=list)
    tradeoffs: list[tuple[str, Evidence]] = field(default_factory=list)  # (sentence, its source)
    commands: list[tuple[str, str]] = field(default_factory=list)  # (what, command)
    evidence: list[Evidence] = field(default_factory=list)
    #: on an already extended checkpoint: what the factor builds on (composed on / replacing the shipped
    #: scaling) and where that context came from; on plain RoPE the pretraining context's source
    starts: str | None = None

    @property
    def ratio(self) -> float:
        return self.target_length / self.original_context


def recommend(
    model: str,
    original_context: int,
    target_length: int,
    budget: str = "auto",
    evidence: list[Evidence] | None = None,
    train_recipe: str | None = None,
    patch_flags: str = "",
    serving: Any = None,
    battery: list[Any] | None = None,
) -> Recommendation:
    """Apply the rule of this module; trade-offs are read off ``evidence`` (first source that has them).

    Args:
        model: the ``--model`` value, used in the printed commands.
        original_context: the trained context L.
        target_length: the context N to reach.
        budget: ``auto``, ``training-free`` or ``fine-tune``.
        evidence: measurements, most relevant first (default: the shipped measurements).
        train_recipe: a PoSE recipe for ``ropescale train`` (None: the command is not available, the
            fine-tune step is described by its recipe keys).
        patch_flags: extra flags for the printed ``ropescale patch`` commands (e.g. `` --replace``).
        serving: a :class:`~.serving.Serving` (``--serve-with``): only methods that engine keeps from the
            saved checkpoint are recommended; where it keeps none of the candidates, ``method`` is None
            and ``why`` says what it does serve.
        battery: RULER battery folders (:func:`.battery_evidence.battery_folders`; default: the shipped ones of
            ``model``): the ``battery:`` line, which never changes the choice.
    """
    from ropescale.evals.advice.battery_evidence import battery_folders, battery_line

    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {', '.join(BUDGETS)}, got {budget!r}")
    evidence = list(evidence if evidence is not None else shipped_evidence())
    rec = Recommendation(model, original_context, target_length, budget, None, None, evidence=evidence)
    _choose(rec, train_recipe, patch_flags, serving)
    folders = battery if battery is not None else battery_folders(model)
    rec.battery, rec.battery_record = battery_line(rec, folders)
    if serving is not None and rec.method is not None:
        kept = f"{serving.value} keeps {rec.method} ×{rec.factor:g} as `ropescale patch` saves it (`ropescale doctor`)"
        rec.serve = kept + (f"; {rec.serve}" if rec.serve else "")
    return rec


def _choose(rec: Recommendation, train_recipe: str | None, patch_flags: str, serving: Any) -> Recommendation:
    """The rule's choice for the request ``rec`` holds (model, L, N, budget, evidence), written into it."""
    from ropescale.methods.factor import factor_for_target

    model, original_context, target_length = rec.model, rec.original_context, rec.target_length
    budget, evidence = rec.budget, rec.evidence
    s = target_length / original_context
    if s <= 1:
        rec.budget = "none"
        rec.why = (
            f"the model was trained at {original_context:,} tokens, which covers {target_length:,}: "
            "no scaling needed (every method only changes positions beyond what the model has seen)"
        )
        rec.reasons.append(rec.why)
        return rec
    if budget == "auto":
        budget = "training-free" if s <= TRAINING_FREE_LIMIT else "fine-tune"
    rec.budget = budget
    method = "dynamic_ntk" if budget == "training-free" and s <= DYNAMIC_LIMIT else "yarn"
    if serving is not None:
        method = served_rule_method(rec, serving, method)
        if method is None:
            return rec
    rec.method, rec.factor = method, factor_for_target(method, target_length, original_context)
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(model).name.removesuffix(".gguf")) or "model"

    def patch_command(name: str, extra: str = "", suffix: str = "") -> tuple[str, str]:
        out = f"{slug}-{name}-x{factor_for_target(name, target_length, original_context):g}{suffix}"
        return out, (
            f"ropescale patch --model {model} --method {name} --target-length {target_length}"
            f"{extra}{patch_flags} --output {out}"
        )

    out, patch = patch_command(method)
    rule = (method, rec.factor, {})
    if budget == "training-free":
        own = [ev for ev in evidence if same_model(ev.model, model) and ev.budget != "fine-tune"]
        if serving is not None:
            own = served_rows(rec, own, serving)
        if _from_frontier(rec, own, patch_command, patch):
            rec.alternative = rule
            return rec
        if s <= TRAINING_FREE_LIMIT:
            rec.reasons.append(
                f"no measured frontier of this model at ×{s:g} keeps both native perplexity and retrieval: the rule "
                f"below; `ropescale eval frontier --model {model} --target-length {target_length}` measures one"
            )

    if method == "dynamic_ntk":
        rec.why = (
            f"s = {s:.3g} ≤ {DYNAMIC_LIMIT:g}: dynamic NTK is exactly the original model up to {_k(original_context)} "
            "(no cost at short lengths) and raises the base only as the input grows past it"
        )
        rec.caveats.append(
            "during generation past L the KV cache keeps keys rotated with the earlier base "
            "(transformers #25104); for long generation prefer yarn (alternative below)"
        )
        rec.reasons += [rec.why, "caveat: " + rec.caveats[-1]]
        rec.commands.append(("training-free", patch))
        if serving is None or serving.serves("yarn", target_length):
            rec.commands.append(("alternative", patch_command("yarn")[1]))
            rec.alternative = ("yarn", factor_for_target("yarn", target_length, original_context), {})
    elif budget == "training-free":
        rec.why = (
            f"s = {s:.3g}: YaRN keeps the fast rotary pairs as trained and interpolates only the slow ones, "
            "so without training its perplexity stays nearly flat up to s·L, where dynamic NTK drifts "
            "and linear interpolation pays at every length"
        )
        rec.reasons.append(rec.why)
        measured = max((r.factor or 1.0 for ev in evidence for r in ev.rows if r.method == "yarn"), default=1.0)
        if s > measured:
            rec.caveats.append(
                f"beyond ×{measured:g} no YaRN result is at hand; training-free quality drops with the "
                "factor (8× training-free YaRN gave PPL > 25 in llama.cpp tests): consider "
                "--budget fine-tune"
            )
        if s > TRAINING_FREE_LIMIT:
            rec.caveats.append(
                f"s = {s:.3g} > {TRAINING_FREE_LIMIT:g}: a fine-tune is strongly recommended; "
                "expect the training-free model to lose retrieval and fluency far beyond L"
            )
        rec.reasons += rec.caveats
        rec.commands.append(("training-free", patch))
        if serving is None or serving.serves("yarn", target_length, {"attention_factor": 1.0}):
            af1 = patch_command("yarn", " --param attention_factor=1.0", "-af1")[1]
            rec.commands.append(("retrieval-heavy", af1))
    else:
        if s > TRAINING_FREE_LIMIT:
            rec.reasons.append(
                f"s = {s:.3g} > {TRAINING_FREE_LIMIT:g}: training-free scaling this far degrades badly "
                "(8× training-free YaRN gave PPL > 25 in llama.cpp tests); fine-tune"
            )
        else:
            rec.reasons.append(
                f"s = {s:.3g}: the field's bridge is a short fine-tune at the target scaling (YaRN, PoSE papers); "
                "what it gave on a measured model is below"
            )
        rec.why = rec.reasons[-1]
        rec.reasons += [
            "YaRN fine-tunes in few steps (Llama-2 s = 16: 400 steps, PPL 2.42 at 64k); PoSE trains on windows of "
            f"{_k(original_context)} tokens whose positions are spread over {_k(target_length)}, so memory stays that "
            "of a short window (PoSE: within ~1-3% of full-length fine-tuning)",
        ]
        if s <= DYNAMIC_LIMIT:
            rec.caveats.append(
                f"at s ≤ {DYNAMIC_LIMIT:g} training-free dynamic NTK is usually enough (--budget training-free)"
            )
            rec.reasons.append(rec.caveats[-1])
        # the training recipe applies the scaling to the base model itself
        keys = (
            f"model.name={model} scaling.method=yarn scaling.factor={rec.factor:g} pose.enabled=true "
            f"pose.target_length={target_length}"
        )
        rec.commands.append(
            (
                "fine-tune (PoSE)",
                f"ropescale train --config {train_recipe} {keys}"
                if train_recipe
                else f"a PoSE training recipe with {keys} (`ropescale train` is not in this version yet)",
            )
        )
        rec.commands.append(("training-free meanwhile", patch))
        fine_tune_evidence(rec, evidence, train_recipe, keys)
    found = measure(method, evidence, original_context, target_length)  # training-free rows only
    rec.tradeoffs = [(t.sentence(), t.source) for t in found]
    if budget == "training-free":
        rec.perplexity = _perplexity(rec, found)
    if rec.retrieval is None:
        rec.retrieval = _retrieval(rec, found)
        if rec.retrieval and budget == "fine-tune":
            rec.retrieval = "before the fine-tune (training-free): " + rec.retrieval
    return rec


def _perplexity(rec: Recommendation, found: list) -> str | None:
    """The short answer's measured line for the rule's method: its perplexity within and beyond the trained
    context against the unscaled model's, each with its file (another model's named as such)."""
    short = next((t for t in found if isinstance(t, ShortCost)), None)
    long = next((t for t in found if isinstance(t, LongPerplexity)), None)
    parts, sources = [], []
    if short:
        n = short.length
        parts.append(f"{short.row.ppl[n]:.2f} at {_k(n)} against the unscaled {short.base.ppl[n]:.2f}")
        sources.append(short.source.source)
    if long:
        n, none = long.length, next((r for r in long.others if r.method == "default"), None)
        parts.append(
            f"{num(long.row.ppl[n])} at {_k(n)}" + (f" against the unscaled {num(none.ppl[n])}" if none else "")
        )
        sources.append(long.source.source)
    if not parts:
        return None
    source = (short or long).source
    other = "" if same_model(source.model, rec.model) else f"on {source.model} (the shape, not the numbers): "
    where = ", ".join(dict.fromkeys(sources))
    return f"{other}{(short or long).row.title} PPL " + "; ".join(parts) + f" ({where})"


def _retrieval(rec: Recommendation, found: list) -> str | None:
    """The short answer's retrieval line from the passkey trade-off, the model measured named when it
    is another (its numbers illustrate, they do not transfer)."""
    hit = next((t for t in found if isinstance(t, PasskeyAccuracy)), None)
    if hit is None:
        return None
    other = "" if same_model(hit.source.model, rec.model) else f"on {hit.source.model} (the shape, not the numbers): "
    return other + hit.losses(rec.original_context)


def _from_frontier(rec: Recommendation, evidence: list[Evidence], patch_command, rule_patch: str) -> bool:
    """Take the method the measured frontier of this model says keeps both (:mod:`.frontier`)."""
    from ropescale.evals.advice.frontier import FEW_PROMPTS, frontier_choice

    pick = frontier_choice(evidence, rec.original_context, rec.target_length)
    if pick is None:
        return False
    verdict, ev, ref = pick
    row = verdict.row
    rec.method, rec.factor, rec.params = row.method, row.factor, dict(row.params)
    lengths = [n for n, *_ in verdict.passkey_cells]
    prompts = sorted({t for _, _, t, _ in verdict.passkey_cells if t})
    few = not prompts or min(prompts) < FEW_PROMPTS
    backed = f"{'-'.join(map(str, sorted({prompts[0], prompts[-1]})))} prompts per length" if prompts else "few prompts"
    rec.why = (
        f"measured on this model: keeps the native perplexity (worst {verdict.ppl_ratio:.3f}× of {ref.ppl:.2f} "
        f"at {_k(ref.ppl_length)}, up to {_k(rec.target_length)}) and retrieval (passkey ≥ {verdict.passkey_min:.2f} "
        f"at {_k(lengths[0])}-{_k(lengths[-1])} on {backed}; native {ref.passkey:.2f} at {_k(ref.passkey_length)}), "
        f"{ev.source}"
    )
    if few:
        rec.caveats.append(
            f"{backed} show retrieval not lost, not kept: confirm with `ropescale eval passkey` "
            f"({FEW_PROMPTS} prompts per length by default)"
        )
    if not ev.passkey_jitter and not few:
        rec.caveats.append(
            f"the {backed} place their needles at fixed depths, where a depth's prompts mostly answer alike: "
            "they weigh like a handful of positions (docs/evaluation.md, 'Where the needle sits')"
        )
    rec.reasons.append(
        f"measured on this model ({ev.source}): {row.title} keeps the native perplexity (worst "
        f"{verdict.ppl_ratio:.3f}× native PPL {ref.ppl:.2f} at {_k(ref.ppl_length)}, up to {_k(rec.target_length)}) and "
        f"its retrieval (passkey ≥ {verdict.passkey_min:.2f} at {'/'.join(_k(n) for n in lengths)}"
        + (f", {'/'.join(map(str, prompts))} prompts per length" if prompts else "")
        + f"; native {ref.passkey:.2f} at {_k(ref.passkey_length)}): see `ropescale eval frontier`"
        + (
            f"; with fewer than {FEW_PROMPTS} prompts per length retrieval is only not shown lost: confirm with "
            "`ropescale eval passkey` (25 prompts per length by default)"
            if few
            else ""
        )
    )
    from ropescale.methods import method_class

    if method_class(row.method).attention:
        rec.reasons.append(
            f"{row.method} works at the attention level: it runs where ropescale patches the model "
            "(from_pretrained, patch, eval); vLLM, TGI and llama.cpp cannot express it (`ropescale doctor`), "
            "so the alternative below is the one to serve elsewhere"
        )
    extra = "".join(f" --param {k}={v}" for k, v in row.params.items())
    rec.commands.append(("training-free", patch_command(row.method, extra)[1]))
    rec.commands.append(("alternative", rule_patch))
    first = [ev, *(e for e in evidence if e is not ev)]  # the numbers of the row that decided, then others
    found = measure(row.method, first, rec.original_context, rec.target_length, dict(row.params))
    rec.tradeoffs = [(t.sentence(), t.source) for t in found]
    rec.retrieval = _retrieval(rec, found)
    rec.retrieval_in_why = True
    return True
