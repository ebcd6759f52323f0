"""The preflight: every check a training run can fail after its weights load, made before they load.

A check that fires after training steps costs the steps: a recipe whose evaluation window is longer
than any held-out document used to stop at its first evaluation, hours into a multi-GPU run, with no
adapter written. Each check here reads the recipe, the data, the model's ``config.json`` and its
tokenizer — never the weights — so :class:`~ropescale.training.trainer.Trainer` runs them before it
loads the weights and ``train --dry-run`` runs the same function and prints what each one checked.

Data this machine cannot read (a path not here, a ``hub:`` dataset offline and not cached, a corpus
not installed) is :class:`NotHere`: the run stops on it like on any other failed check; the dry run,
which may plan a run for another machine, says it in a line and goes on, and the checks that need
that text say they were not made.

Adding a check (the parallel layout of a launch, say): a function ``(Preflight) -> str | list[str]``
returning what it checked, raising :class:`~ropescale.errors.RopescaleError` in one line when the run
would fail; append it to :data:`CHECKS`. It may read ``pf.gpus`` (the launch's processes),
``pf.hf_config`` (the scaled model config, or None) and ``pf.tokenizer`` (or None, ``pf.no_tokenizer``
saying why).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..data.readable import NotHere, read_source
from ..errors import RopescaleError
from .config import TrainConfig
from .data import TokenStream, WindowDataset

PREFIX = "preflight:     "
SLIDING_WINDOW_KEY = "Set model.sliding_window=null"  # how train's sliding-window warning names the setting


@dataclass
class SourceText:
    """One source's documents as the run splits them (``train`` None: not read here, ``note`` says why)."""

    label: str
    source: str
    train: list | None
    held: list = field(default_factory=list)
    max_tokens: int | None = None
    note: str = ""


@dataclass
class Preflight:
    """What the checks read.

    Args:
        config: the recipe.
        tokenizer: the model's tokenizer (None: the token-count checks are not made; ``no_tokenizer`` says why).
        hf_config: the model's config scaled by the recipe (None: not read; the checks that need the target
            length take ``pose.target_length`` or are not made).
        dry_run: data not here is said, not refused.
        recipe_data: False when the trainer was handed its tokens (tests): the recipe's data is not read.
        gpus: processes of the launch (the dry run: ``--gpus`` or the accelerate config's; the run: the
            launch's own), for checks of the parallel layout.
    """

    config: TrainConfig
    tokenizer: Any = None
    no_tokenizer: str = ""
    hf_config: Any = None
    dry_run: bool = False
    recipe_data: bool = True
    gpus: int = 1
    sources: list[SourceText] | None = None
    eval_tokens: list[list[int]] | None = None  # the evaluation's documents, for the trainer to reuse
    device: str | None = None  # the run's device type (cpu, cuda); None (the dry run): this machine's

    @property
    def target_length(self) -> int | None:
        """The context the run trains for (``pose.target_length``, else the scaled context), if known."""
        if self.config.pose.target_length:
            return int(self.config.pose.target_length)
        if self.hf_config is None:
            return None
        from .modeling import target_length

        return target_length(_ConfigOnly(self.hf_config), self.config)


class _ConfigOnly:
    def __init__(self, config: Any):
        self.config = config


def run_preflight(pf: Preflight) -> list[str]:
    """Every check of :data:`CHECKS`, in order; returns the lines saying what each checked.

    Raises:
        RopescaleError: the first check the run would fail, in one line (:class:`NotHere` only outside a dry run).
    """
    lines: list[str] = []
    for check in CHECKS:
        out = check(pf)
        lines += [out] if isinstance(out, str) else list(out)
    return lines


# ------------------------------------------------------------------------------------------------ checks


def check_schedule(pf: Preflight) -> str:
    """A warm-up longer than the run never reaches ``optim.lr``: the run would train at a fraction of it."""
    o, t = pf.config.optim, pf.config.train
    if o.warmup_steps > t.max_steps:
        raise RopescaleError(
            f"optim.warmup_steps {o.warmup_steps} is more than train.max_steps {t.max_steps}: the learning rate "
            f"would never reach optim.lr {o.lr:g}; set optim.warmup_steps to at most {t.max_steps}"
        )
    return f"schedule: {o.warmup_steps} warm-up steps within {t.max_steps} steps, lr reaches {o.lr:g}"


def check_output(pf: Preflight) -> str:
    """The output folder must be one this process can create and write (checked without writing)."""
    out = pf.config.output_dir
    if out.exists() and not out.is_dir():
        raise RopescaleError(f"train.output_dir '{out}' is a file, not a folder; give a folder")
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise RopescaleError(f"train.output_dir '{out}' cannot be created: '{probe}' is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RopescaleError(f"train.output_dir '{out}' cannot be written: '{probe}' is not writable here")
    return f"output: {out} {'is' if probe == out else 'can be created and is'} writable"


def check_data(pf: Preflight) -> list[str]:
    """Every source readable here and holding training documents (a mix: each one)."""
    if not pf.recipe_data:
        return ["data: given to the trainer as tokens (the recipe's data is not read)"]
    lines = []
    for s in _sources(pf):
        if s.train is None:
            lines.append(f"data: {s.note}")
            continue
        chats = sum(not isinstance(text, str) for _, text in s.train)
        kind = f", {chats} of them conversations" if chats else ""
        lines.append(f"data: '{s.label}' readable, {len(s.train)} training documents{kind}, {len(s.held)} held out")
    return lines


def check_chat_targets(pf: Preflight) -> list[str]:
    """Under ``data.chat_loss: assistant`` a source of conversations none of which has an assistant
    turn has no token to train on: every step would have loss 0 and gradient 0."""
    if not pf.recipe_data or pf.config.data.chat_loss != "assistant":
        return []
    lines = []
    for s in _sources(pf):
        if s.train is None:
            continue
        chats = [(title, text) for title, text in s.train if not isinstance(text, str)]
        if pf.tokenizer is not None and chats:  # the template renders turn by turn, or the run refuses it
            from ..data.chat import chat_tokens

            chat_tokens(pf.tokenizer, chats[0][1], "assistant", where=chats[0][0])
        if not chats or len(chats) < len(s.train):  # text documents train on every token
            continue
        turns = sum(1 for _, chat in chats for m in chat if isinstance(m, dict) and m.get("role") == "assistant")
        if not turns:
            raise RopescaleError(
                f"data '{s.label}': none of its {len(chats)} conversations has an assistant turn, so "
                "data.chat_loss=assistant leaves no token to train on; add assistant turns or set data.chat_loss=all"
            )
        lines.append(f"chat targets: '{s.label}' has {turns} assistant turns to train on")
    return lines


def check_windows(pf: Preflight) -> list[str]:
    """Each source's training text must hold one window: ``data.seq_len`` tokens, or under PoSE with
    ``content: skip`` the target length it spreads the window over."""
    if not pf.recipe_data:
        return []
    c = pf.config
    if pf.tokenizer is None:
        return [f"windows: not checked here ({pf.no_tokenizer})"]
    spec = window_spec(pf)
    if spec is None:
        return ["windows: not checked here (PoSE's target length needs the model's config.json)"]
    lines = []
    for s in _sources(pf):
        if s.train is None:
            lines.append(f"windows: '{s.label}' not checked (its text is not read here)")
            continue
        cap = s.max_tokens if c.data.sources else c.data.max_tokens
        size = _stream_size(pf, s.train, cap, spec)
        need = spec.text_span + (spec.bos if spec.documents else 0)
        try:  # the trainer's own check, on a stream of the size the data packs into
            WindowDataset(TokenStream(np.zeros(size, np.int32)), spec)
        except RopescaleError as exc:
            raise RopescaleError(f"data source '{s.label}': {exc}" if c.data.sources else str(exc)) from None
        what = f"PoSE target {spec.target_length}" if spec.pose else f"seq_len {spec.seq_len}"
        lines.append(f"windows: '{s.label}' holds a window of {need:,} text tokens ({what})")
    return lines


def check_evaluation(pf: Preflight) -> str | list[str]:
    """``eval.every`` / ``eval.at_end``: a held-out document as long as the evaluation window, found now
    rather than at the first evaluation."""
    c = pf.config
    if not (c.eval.every or c.eval.at_end):
        return []
    length = c.eval.length or pf.target_length
    if length is None:
        return ["evaluation: not checked here (its length needs eval.length or the model's config.json)"]
    if pf.eval_tokens is not None:
        return ["evaluation: held-out tokens given to the trainer"]
    if pf.tokenizer is None:
        return ["evaluation: not checked here (no tokenizer)"]
    from .evaluation import eval_documents

    try:
        if c.eval.data is not None:
            held = read_source(c.eval.data, c.data.text_field, pf.dry_run)
        elif pf.recipe_data:
            if any(s.train is None for s in _sources(pf)):
                return ["evaluation: not checked (the held-out text is not read here)"]
            held = [doc for s in _sources(pf) for doc in s.held]
        else:
            held = None  # the trainer was handed its tokens: the recipe's held-out text, read as evaluate reads it
        pf.eval_tokens = eval_documents(c, pf.tokenizer, length, held)
    except NotHere as exc:
        if not pf.dry_run:
            raise
        return [f"evaluation: not checked ({exc})"]
    when = f"every {c.eval.every} steps" if c.eval.every else "at the end"
    return f"evaluation: held-out text holds a window of {length:,} tokens ({when})"


def check_compile(pf: Preflight) -> list[str]:
    """``train.compile``: torch.compile must be able to build the run's kernels (on a CPU, inductor
    needs a C++ compiler), found now rather than in the first step, after the weights load."""
    if not pf.config.train.compile:
        return []
    import torch

    from .compiling import compile_problem, cpp_compiler

    device = pf.device or ("cuda" if torch.cuda.is_available() else "cpu")
    problem = compile_problem(device)
    if problem is not None:
        if pf.dry_run and pf.device is None:  # the dry run may plan a run for another machine
            return [f"compile: {problem} (a run on this machine stops on it)"]
        raise RopescaleError(problem)
    how = f"C++ compiler {cpp_compiler()[0]}" if device == "cpu" else "Triton kernels"
    return [f"compile: each decoder layer through torch.compile on {device} (inductor, {how}); the first steps compile"]


CHECKS: list[Callable[[Preflight], str | list[str]]] = [
    check_schedule,
    check_compile,
    check_output,
    check_data,
    check_chat_targets,
    check_windows,
    check_evaluation,
]


# ------------------------------------------------------------------------------------------------- reading


def window_spec(pf: Preflight) -> Any:
    """The trainer's :class:`~ropescale.training.data.WindowSpec` for this recipe (None: PoSE's target unknown)."""
    from .data import WindowSpec
    from .packing import resolved_packing

    c = pf.config
    target = pf.target_length if c.pose.enabled else None
    if c.pose.enabled and target is None:
        return None
    bos = pf.tokenizer.bos_token_id if c.data.bos_each_window else None
    return WindowSpec(
        c.data.seq_len,
        bos,
        target,
        c.pose.chunks,
        c.pose.content,
        documents=resolved_packing(c.data) == "documents",
    )


def _stream_size(pf: Preflight, docs: list, cap: int | None, spec: Any) -> int:
    """Tokens of the packed training stream, counted until one window's worth is certain: a long
    document is tokenized only as far as its first part, when that part alone holds the window (a
    32k-token window does not need the Old Testament's 800k tokens counted)."""
    from .data import tokenize_stream
    from .packing import resolved_packing

    c, need = pf.config, spec.text_span + spec.bos + 2
    packing = resolved_packing(c.data)

    def size(part: list, cap: int | None = None) -> int:  # "all": the same tokens, whichever are targets
        return int(tokenize_stream(pf.tokenizer, part, cap, packing, "all").tokens.size)

    taken, count = [], 0
    for title, text in docs:
        head = (title, text[: 8 * need]) if isinstance(text, str) and len(text) > 8 * need else None
        if head is not None and count + size([head]) >= need + 2 * len(taken) + 2:
            taken.append(head)  # this document's first part completes the window
            break
        taken.append((title, text))
        count += size([(title, text)])
        if count >= need + 2 * len(taken):
            break
    return size(taken, cap)


def _sources(pf: Preflight) -> list[SourceText]:
    """Every source's documents, split as the run splits them, read once."""
    if pf.sources is None:
        pf.sources = _read_sources(pf)
    return pf.sources


def _read_sources(pf: Preflight) -> list[SourceText]:
    from ..data.sources import PYTHON_PREFIX, parse_sources, split_source
    from .data import split_holdout

    d = pf.config.data
    out = []
    if not d.sources:
        if d.source.startswith(PYTHON_PREFIX):  # the run reads data.source as --data reads it: no python: there
            raise RopescaleError(
                f"data.source '{d.source}': python: sources are entries of a mix, data.sources=[{{source: {d.source}}}]"
            )
        s = SourceText(d.source, d.source, None)
        try:
            s.train, s.held = split_holdout(read_source(d.source, d.text_field, pf.dry_run), d.holdout)
        except NotHere as exc:
            if not pf.dry_run:
                raise
            s.note = str(exc)
        return [s]
    titles = [] if isinstance(d.holdout, int) else list(d.holdout)
    for spec in parse_sources(d.sources):
        s = SourceText(spec.label, spec.source, None, max_tokens=spec.max_tokens)
        try:
            s.train, s.held = split_source(spec, read_source(spec.source, d.text_field, pf.dry_run), titles)
        except NotHere as exc:
            if not pf.dry_run:
                raise
            s.note = str(exc)
        out.append(s)
    if all(s.train is not None for s in out):  # as mix_documents: every held-out title is somewhere
        found = {title.lower() for s in out for title, _ in s.held}
        missing = [t for t in titles if str(t).strip().lower() not in found]
        if missing:
            raise RopescaleError(f"data.holdout title '{missing[0]}' is in none of data.sources")
    return out


# --------------------------------------------------------------------------------------------- from CLI


def model_inputs(config: TrainConfig, dry_run: bool) -> tuple[Any, str, Any]:
    """``(tokenizer or None, why none, scaled model config or None)`` read without weights.

    A run loads the tokenizer (converting an embedded model once, as loading it would); a dry run
    reads only what is here and converts nothing.
    """
    from ..models.embedded import EMBEDDED_MODELS
    from ..models.loading import load_tokenizer
    from .dryrun import config_source

    name, tokenizer, why = config.model.name, None, ""
    if dry_run and name in EMBEDDED_MODELS:
        try:
            config_source(name)
        except RopescaleError as exc:
            return None, f"no tokenizer here: {exc}", None
    try:
        tokenizer = load_tokenizer(name)
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a missing tokenizer
        if not dry_run:
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = f"no tokenizer for '{name}' here: {first}"
    return tokenizer, why, scaled_config(config)


def scaled_config(config: TrainConfig, hf_config: Any = None) -> Any:
    """The model's config scaled as the recipe says (None where it cannot be read or scaled here: the
    load says why)."""
    from ..patching.model import patch_config
    from .dryrun import config_source
    from .modeling import recipe_scaling

    try:
        if hf_config is None:
            hf_config, _ = config_source(config.model.name)
        scaling = recipe_scaling(config, hf_config)  # as the run scales it
        with warnings.catch_warnings():  # the sliding-window warning is given once, by the load itself
            warnings.simplefilter("ignore")
            return patch_config(hf_config, scaling)
    except Exception:  # noqa: BLE001 - the weights' load reports an unreadable config in its own line
        return None
