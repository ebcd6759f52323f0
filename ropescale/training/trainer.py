"""The fine-tuning recipe: a plain PyTorch loop driven by ``accelerate.Accelerator``.

Why not ``transformers.Trainer``: the loop needs per-window ``position_ids`` (PoSE), a loss that
never materialises ``[tokens, vocab]`` logits, an attention function switched between training and
evaluation (S²-Attn), checkpoints holding only the trainable weights, and an exact resume (data
position = step count). Each is a few lines here and a callback or subclass there; the loop below
reads top to bottom (``setup → train → save_checkpoint``), and accelerate still provides devices,
DDP/FSDP wrapping, mixed precision and gradient synchronisation.

Output folder (``train.output_dir``, default ``runs/<recipe>``)::

    config.yaml              the resolved recipe (resume checks it)
    data/train_tokens.npy    the packed training stream (tokenized once)
    checkpoints/step-N/      trainable weights, optimizer, scheduler, RNG, state.json (atomic)
    metrics.jsonl            one line per step (loss, lr, tokens/s) and per evaluation
    adapter/                 final LoRA adapter (peft format) + trainable_params.safetensors
    merged/                  with ``merge``: the merged checkpoint (see ropescale.training.export)
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import random
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._io import atomic_write_json, atomic_write_text
from ..errors import MissingDependencyError, RopescaleError
from ..scoring.nll import summed_nll
from .config import TrainConfig, config_from_dict, dump_config
from .data import (
    WindowDataset,
    WindowSpec,
    cached_stream,
    micro_batch_indices,
    split_holdout,
    tokenize_stream,
)

CHECKPOINTS = "checkpoints"
TRAINABLE_FILE = "trainable.safetensors"
# Sections a resumed run must share with the checkpoint (eval/log/save cadence may change).
FINGERPRINT_SECTIONS = ("model", "scaling", "lora", "data", "pose", "s2attn", "optim")
FINGERPRINT_TRAIN_KEYS = ("max_steps", "batch_size", "grad_accum", "seed", "mixed_precision")


def _require_training_deps() -> None:
    for name in ("peft", "accelerate"):
        if importlib.util.find_spec(name) is None:
            raise MissingDependencyError(f"training needs {name}: pip install 'ropescale[train]'")


# ----------------------------------------------------------------------------------- the model


def resolve_attn_implementation(requested: str, dtype: str = "bfloat16") -> str:
    """``auto`` → flash_attention_2 when flash-attn is installed, a GPU is present and the weights
    are 16-bit (flash-attn has no fp32 kernel), else sdpa — as for evaluation
    (:func:`ropescale.models.runtime.resolve_runtime`)."""
    if requested != "auto":
        return requested
    from ..models.runtime import auto_attention

    return auto_attention(torch.cuda.is_available(), dtype)


def load_base_model(config: TrainConfig, dtype: str | None = None) -> Any:
    """The recipe's base model, scaled by its method (the rotary module is patched before LoRA)."""
    from ..models.loading import from_pretrained

    s = config.scaling
    return from_pretrained(
        config.model.name,
        method=s.method,
        factor=s.factor,
        method_params=dict(s.params),
        replace=True,
        original_max_position_embeddings=s.original_max_position_embeddings,
        sliding_window=config.model.sliding_window,
        dtype=getattr(torch, dtype or config.model.dtype),
        attn_implementation=resolve_attn_implementation(config.model.attn_implementation, dtype or config.model.dtype),
    )


def scale_model(model: Any, config: TrainConfig) -> Any:
    """Apply the recipe's scaling to an already loaded model (kept if it already carries exactly it)."""
    from ..methods import get_method
    from ..patching.model import patch
    from ..patching.plan import provenance

    s = config.scaling
    wanted = get_method(s.method, factor=s.factor, **s.params)
    block = provenance(model.config)
    if block is not None and block["method"] == wanted.name and block["params"] == wanted.params():
        return model
    return patch(
        model,
        s.method,
        s.factor,
        s.original_max_position_embeddings,
        replace=True,
        sliding_window=config.model.sliding_window,
        **s.params,
    )


def extra_trainable_names(model: nn.Module, kinds: list[str]) -> list[str]:
    """Names of the non-LoRA parameters made fully trainable: embeddings and/or norms (LongLoRA)."""
    names = []
    for name, _ in model.named_parameters():
        if "lora_" in name:
            continue
        leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
        if ("embed" in kinds and "embed" in leaf) or ("norm" in kinds and "norm" in leaf):
            names.append(name)
    return names


def wrap_lora(model: Any, config: TrainConfig) -> Any:
    """LoRA (peft) around a scaled model, plus optionally trainable embeddings and norms."""
    from peft import LoraConfig, get_peft_model

    lc = config.lora
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in lc.target_modules if m not in present]
    if missing:
        raise RopescaleError(f"lora.target_modules: the model has no module named '{missing[0]}'")
    peft_config = LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=list(lc.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft reads the deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, peft_config)
    extra = set(extra_trainable_names(peft_model, lc.trainable))
    for name, param in peft_model.named_parameters():
        if name in extra:
            param.requires_grad_(True)
            if param.dtype != torch.float32:  # trainable weights stay fp32 (autocast computes in bf16)
                param.data = param.data.float()
    return peft_model


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant: frozen
    embeddings need no ``enable_input_require_grads``)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (tied parameters appear once)."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable parameters into ``model``; every trainable parameter must be present."""
    params = dict(model.named_parameters())
    wanted = {n for n, p in params.items() if p.requires_grad}
    missing, unexpected = sorted(wanted - set(tensors)), sorted(set(tensors) - set(params))
    if missing or unexpected:
        raise RopescaleError(
            f"checkpoint does not match the model: {len(missing)} trainable parameters missing "
            f"({missing[:1]}), {len(unexpected)} unexpected ({unexpected[:1]})"
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))


def chunked_causal_lm_loss(hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean next-token cross entropy, ``chunk`` positions through ``lm_head`` at a time.

    Each chunk's logits are recomputed in the backward pass (:func:`ropescale.scoring.nll.summed_nll`),
    so peak memory is ``chunk × vocab`` logits instead of ``tokens × vocab`` (4 GB in fp32 for 32k
    tokens and a 32k vocabulary). Labels follow transformers: position ``t`` predicts ``labels[:, t + 1]``.
    """
    total, n = summed_nll(hidden, lm_head, labels, chunk)
    return (total / max(n, 1)).float()  # []


class CausalLMLoss(nn.Module):
    """``forward(input_ids, position_ids, labels) -> loss`` around a peft-wrapped causal LM.

    This is the module accelerate wraps (DDP/FSDP), so the loss is computed inside the wrapped
    forward. An all-ones attention mask is passed on purpose: with ``attention_mask=None``
    transformers reads non-consecutive ``position_ids`` (PoSE skips) as several packed sequences
    and would block attention between the chunks.
    """

    def __init__(self, peft_model: nn.Module, loss_chunk: int = 1024):
        super().__init__()
        self.model = peft_model
        self.loss_chunk = loss_chunk
        causal_lm = peft_model.get_base_model()
        self._no_split_modules = getattr(causal_lm, "_no_split_modules", None)  # FSDP auto-wrap

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        causal_lm = self.model.get_base_model()
        out = causal_lm.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, attention_mask=torch.ones_like(input_ids), use_cache=False
        )
        return chunked_causal_lm_loss(out.last_hidden_state, causal_lm.lm_head, labels, self.loss_chunk)  # []


# ------------------------------------------------------------------------------- optimization


def lr_lambda(config: TrainConfig) -> Callable[[int], float]:
    """LR multiplier after ``k`` scheduler steps: linear warm-up, then linear/cosine/constant.

    The first optimizer step runs at ``lr / warmup_steps`` (HF's schedules start at 0 and waste it).
    """
    o, total = config.optim, config.train.max_steps
    warm, floor = o.warmup_steps, o.min_lr_ratio

    def f(k: int) -> float:
        if k < warm:
            return (k + 1) / warm
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (k - warm + 1) / max(1, total - warm))
        if o.schedule == "linear":
            return floor + (1.0 - floor) * (1.0 - progress)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay only on LoRA matrices (never on norms, biases or embeddings)."""
    o = config.optim
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 and "lora_" in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=o.lr, betas=tuple(o.betas), eps=o.eps)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def fingerprint(config: TrainConfig) -> dict[str, Any]:
    """What a checkpoint's recipe must share with the run that resumes it."""
    d = config.to_dict()
    return {**{s: d[s] for s in FINGERPRINT_SECTIONS}, "train": {k: d["train"][k] for k in FINGERPRINT_TRAIN_KEYS}}


def _first_difference(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
    return f"{prefix.rstrip('.')}: {a!r} -> {b!r}"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (partial ones are hidden dot-folders)."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-") and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


# ---------------------------------------------------------------------------------- the trainer


@dataclass
class TrainResult:
    step: int
    losses: list[float] = field(default_factory=list)  # per step of this session
    evals: list[dict[str, Any]] = field(default_factory=list)
    output_dir: Path | None = None
    seconds: float = 0.0
    tokens: int = 0


class Trainer:
    """Fine-tune a scaled model with LoRA: ``Trainer(config).train()``.

    Args:
        config: a validated :class:`TrainConfig`.
        model: an already loaded causal LM to use instead of loading ``config.model.name`` (tests);
            it is scaled by the recipe's method if it is not already.
        tokenizer: its tokenizer (default: loaded from ``config.model.name``); may be None when
            ``train_tokens`` are given.
        train_tokens: a packed token stream to train on instead of ``config.data``. # [T]
        eval_tokens: held-out token documents for perplexity (default: the held-out documents).
        progress: show a progress bar.
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        model: Any = None,
        tokenizer: Any = None,
        train_tokens: np.ndarray | None = None,
        eval_tokens: list[list[int]] | None = None,
        progress: bool = True,
    ):
        _require_training_deps()
        self.config, self._model_in, self.tokenizer = config, model, tokenizer
        self._train_tokens, self.eval_tokens = train_tokens, eval_tokens
        self.progress = progress
        self.output_dir = config.output_dir
        self.step = 0
        self.tokens_seen = 0
        self.elapsed = 0.0
        self._ready = False

    # ------------------------------------------------------------------------------ setup

    def setup(self, resume: bool = False, overwrite: bool = False) -> None:
        """Load and wrap the model, build data/optimizer/scheduler, and restore a checkpoint."""
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        c = self.config
        self.accelerator = acc = Accelerator(mixed_precision=c.train.mixed_precision)
        if self._fsdp() and (c.eval.every or c.eval.at_end):
            raise RopescaleError(
                "evaluation during training is not supported under FSDP: set eval.every=0 "
                "eval.at_end=false and evaluate the export"
            )
        self._check_output_dir(resume, overwrite)
        set_seed(c.train.seed)
        base = self._model_in if self._model_in is not None else load_base_model(c)
        base = scale_model(base, c)
        if self.tokenizer is None and self._train_tokens is None:
            from ..models.loading import load_tokenizer

            self.tokenizer = load_tokenizer(c.model.name)
        base.config.use_cache = False
        self.base_attn = base.config._attn_implementation
        self.target_length = self._target_length(base)
        self._check_lengths(base)
        self.peft_model = wrap_lora(base, c)
        if c.train.gradient_checkpointing:
            enable_activation_checkpointing(self.peft_model.get_base_model())
        if c.s2attn.enabled:
            from .s2attn import enable_s2attn

            enable_s2attn(self.peft_model.get_base_model(), c.s2attn.group_ratio)
        with acc.main_process_first():
            self.dataset = self._build_dataset()
        state = self._restore_weights() if resume else None
        self.module = acc.prepare(CausalLMLoss(self.peft_model, c.train.loss_chunk))
        self.trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = acc.prepare(build_optimizer(self.module, c))
        # The scheduler is stepped by hand: accelerate's wrapper steps it once per process.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer.optimizer, lr_lambda(c))
        if state is not None:
            self._restore_training_state(state)
        elif acc.is_main_process:  # a fresh start: no metrics of an earlier, checkpoint-less attempt
            atomic_write_text(self.output_dir / "config.yaml", dump_config(c))
            (self.output_dir / "metrics.jsonl").unlink(missing_ok=True)
        acc.wait_for_everyone()
        self._ready = True

    def _target_length(self, base: Any) -> int:
        from ..patching.plan import provenance

        block = provenance(base.config) or {}
        extended = int(block.get("extended_context") or base.config.max_position_embeddings)
        return int(self.config.pose.target_length or extended)

    def _check_lengths(self, base: Any) -> None:
        c = self.config
        if c.pose.enabled and c.pose.target_length and c.pose.target_length > base.config.max_position_embeddings:
            raise RopescaleError(
                f"pose.target_length {c.pose.target_length} exceeds the scaled context "
                f"{base.config.max_position_embeddings}; raise scaling.factor"
            )
        if not c.pose.enabled and c.data.seq_len > base.config.max_position_embeddings:
            raise RopescaleError(
                f"data.seq_len {c.data.seq_len} exceeds the scaled context {base.config.max_position_embeddings}"
            )

    def _check_output_dir(self, resume: bool, overwrite: bool) -> None:
        out = self.output_dir
        if self.accelerator.is_main_process:
            if list_checkpoints(out) and not resume:
                if not overwrite:
                    raise RopescaleError(
                        f"output directory '{out}' already holds checkpoints: pass --resume to continue "
                        "or --overwrite to start again"
                    )
                shutil.rmtree(out / CHECKPOINTS)
                for name in ("metrics.jsonl", "adapter", "merged"):
                    target = out / name
                    if target.is_dir():
                        shutil.rmtree(target)
                    elif target.exists():
                        target.unlink()
            out.mkdir(parents=True, exist_ok=True)
        self.accelerator.wait_for_everyone()

    def _build_dataset(self) -> WindowDataset:
        c = self.config
        stream = self._train_tokens
        if stream is None:
            from ..data.documents import load_documents

            def build() -> np.ndarray:
                docs = load_documents(c.data.source, text_field=c.data.text_field)
                train, _ = split_holdout(docs, c.data.holdout)
                return tokenize_stream(self.tokenizer, train, c.data.max_tokens)

            key = {
                "source": c.data.source,
                "holdout": c.data.holdout,
                "max_tokens": c.data.max_tokens,
                "tokenizer": getattr(self.tokenizer, "name_or_path", "?"),
                "vocab": len(self.tokenizer),
            }
            stream = cached_stream(self.output_dir / "data" / "train_tokens.npy", key, build)
        bos = None
        if c.data.bos_each_window and self.tokenizer is not None:
            bos = self.tokenizer.bos_token_id
        elif c.data.bos_each_window:
            bos = getattr(self.peft_model.config, "bos_token_id", None)
        spec = WindowSpec(
            c.data.seq_len, bos, self.target_length if c.pose.enabled else None, c.pose.chunks, c.pose.content
        )
        self.bos_token_id = bos
        return WindowDataset(stream, spec, seed=c.train.seed)

    # --------------------------------------------------------------------------- checkpoints

    def _restore_weights(self) -> dict[str, Any] | None:
        """Load the newest checkpoint's trainable weights before wrapping; returns its state."""
        found = list_checkpoints(self.output_dir)
        if not found:
            return None  # --resume on a fresh directory starts from scratch
        path = found[-1]
        state = json.loads((path / "state.json").read_text())
        if state.get("fingerprint") != fingerprint(self.config):
            raise RopescaleError(
                f"checkpoint {path} was made with a different recipe ("
                f"{_first_difference(state.get('fingerprint'), fingerprint(self.config))}); "
                "use another train.output_dir or the original settings"
            )
        from safetensors.torch import load_file

        load_trainable(self.peft_model, load_file(path / TRAINABLE_FILE))
        state["path"] = str(path)
        return state

    def _restore_training_state(self, state: dict[str, Any]) -> None:
        path, acc = Path(state["path"]), self.accelerator
        if self._fsdp():
            from accelerate.utils import load_fsdp_optimizer

            load_fsdp_optimizer(acc.state.fsdp_plugin, acc, self.optimizer.optimizer, self.module, str(path), 0)
        else:
            self.optimizer.optimizer.load_state_dict(
                torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
            )
        self.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        rng = path / f"rng-{acc.process_index}.pt"
        if rng.is_file():
            _set_rng_state(torch.load(rng, weights_only=False))
        self.step, self.tokens_seen, self.elapsed = state["step"], state["tokens"], state["elapsed"]
        if acc.is_main_process:
            self._trim_metrics(self.step)

    def _fsdp(self) -> bool:
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type == DistributedType.FSDP

    def save_checkpoint(self) -> Path:
        """Write ``checkpoints/step-N`` atomically: staged in a hidden folder, renamed when complete."""
        from safetensors.torch import save_file

        acc, root = self.accelerator, self.output_dir / CHECKPOINTS
        final = root / f"step-{self.step:08d}"
        staging = root / f".step-{self.step:08d}.partial"
        if acc.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        acc.wait_for_everyone()
        if self._fsdp():  # every rank takes part in gathering
            from accelerate.utils import save_fsdp_optimizer

            full = acc.get_state_dict(self.module)
            names = {f"model.{n}" for n, p in self.peft_model.named_parameters() if p.requires_grad}
            weights = {k[len("model.") :]: v for k, v in full.items() if k in names}
            save_fsdp_optimizer(acc.state.fsdp_plugin, acc, self.optimizer.optimizer, self.module, str(staging), 0)
        else:
            weights = trainable_state(self.peft_model)
        torch.save(_rng_state(), staging / f"rng-{acc.process_index}.pt")
        if acc.is_main_process:
            save_file({k: v.contiguous().cpu() for k, v in weights.items()}, staging / TRAINABLE_FILE)
            if not self._fsdp():
                torch.save(self.optimizer.optimizer.state_dict(), staging / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), staging / "scheduler.pt")
            atomic_write_json(
                staging / "state.json",
                {
                    "step": self.step,
                    "tokens": self.tokens_seen,
                    "elapsed": self.elapsed,
                    "world_size": acc.num_processes,
                    "fingerprint": fingerprint(self.config),
                },
            )
        acc.wait_for_everyone()
        if acc.is_main_process:
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            for old in list_checkpoints(self.output_dir)[: -self.config.train.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()
        return final

    def _trim_metrics(self, step: int) -> None:
        """Drop metric lines of steps lost after the checkpoint a run resumes from."""
        path = self.output_dir / "metrics.jsonl"
        if path.is_file():
            lines = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
            atomic_write_text(path, "".join(ln + "\n" for ln in lines))

    def _log(self, record: dict[str, Any]) -> None:
        if self.accelerator.is_main_process:
            with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    # ----------------------------------------------------------------------------- evaluation

    def _eval_documents(self) -> list[list[int]]:
        if self.eval_tokens is None:
            from ..data.documents import load_documents, tokenize_documents

            c = self.config
            if c.eval.data is not None:
                docs = load_documents(c.eval.data, text_field=c.data.text_field)
            else:
                if not c.data.holdout:
                    raise RopescaleError(
                        "evaluation needs held-out text: set data.holdout (titles or a count) or eval.data"
                    )
                _, docs = split_holdout(load_documents(c.data.source, text_field=c.data.text_field), c.data.holdout)
            length = c.eval.length or self.target_length
            self.eval_tokens = tokenize_documents(
                self.tokenizer, docs, max_tokens=c.eval.max_tokens or length, min_tokens=length
            )
            if not self.eval_tokens:
                raise RopescaleError(f"no held-out document has the {length} tokens an evaluation window needs")
        return self.eval_tokens

    def evaluate(self) -> dict[str, Any]:
        """Perplexity at the target length on held-out text, with full attention, in eval mode."""
        from ..scoring.perplexity import evaluate_perplexity
        from .s2attn import disable_s2attn, enable_s2attn

        c, acc = self.config, self.accelerator
        record: dict[str, Any] = {}
        if acc.is_main_process:
            hf = self.peft_model.get_base_model()
            if c.s2attn.enabled:
                disable_s2attn(hf, self.base_attn)
            self.peft_model.eval()
            try:
                length = c.eval.length or self.target_length
                with acc.autocast():
                    result = evaluate_perplexity(
                        self.peft_model,
                        self._eval_documents(),
                        window=length,
                        mode=c.eval.mode,
                        bos_token_id=self.bos_token_id,
                        max_tokens=c.eval.max_tokens,
                        progress=False,
                    )
                record = {
                    "step": self.step,
                    "eval_length": length,
                    "eval_ppl": result.ppl,
                    "eval_tokens": result.tokens_scored,
                    "eval_seconds": result.elapsed_s,
                }
            finally:
                self.peft_model.train()
                if c.s2attn.enabled:
                    enable_s2attn(hf, c.s2attn.group_ratio)
            self._log(record)
        acc.wait_for_everyone()
        return record

    # --------------------------------------------------------------------------------- train

    def train(
        self, resume: bool = False, overwrite: bool = False, on_step: Callable[[Trainer, float], None] | None = None
    ) -> TrainResult:
        """Run (or continue) training to ``train.max_steps``; returns what this session did.

        Args:
            resume: continue from the newest checkpoint in the output folder (a fresh start if none).
            overwrite: discard an earlier run's checkpoints in the output folder.
            on_step: called after every optimizer step with ``(trainer, loss)`` (tests use it to
                interrupt a run).
        """
        from tqdm.auto import tqdm

        if not self._ready:
            self.setup(resume=resume, overwrite=overwrite)
        c, acc = self.config, self.accelerator
        world, accum, bs = acc.num_processes, c.train.grad_accum, c.train.batch_size
        step_tokens = bs * accum * world * c.data.seq_len
        result = TrainResult(step=self.step, output_dir=self.output_dir)
        bar = tqdm(
            total=c.train.max_steps,
            initial=self.step,
            disable=not (self.progress and acc.is_local_main_process),
            desc="train",
            unit="step",
            dynamic_ncols=True,
        )
        self.module.train()
        session_start = time.perf_counter()
        while self.step < c.train.max_steps:
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=acc.device)
            for micro in range(accum):
                batch = self.dataset.batch(micro_batch_indices(self.step, micro, (bs, accum, world), acc.process_index))
                batch = {k: v.to(acc.device) for k, v in batch.items()}
                sync = contextlib.nullcontext() if micro == accum - 1 else acc.no_sync(self.module)
                with sync:
                    loss = self.module(**batch)
                    acc.backward(loss / accum)
                loss_sum += loss.detach().float()
            grad_norm = None
            if c.optim.max_grad_norm is not None:
                grad_norm = float(acc.clip_grad_norm_(self.trainable, c.optim.max_grad_norm))
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = float(acc.reduce(loss_sum / accum, reduction="mean"))
            if not math.isfinite(step_loss):
                raise RopescaleError(f"loss became {step_loss} at step {self.step + 1}; lower optim.lr or use fp32")
            self.step += 1
            self.tokens_seen += step_tokens
            dt = time.perf_counter() - t0
            self.elapsed += dt
            result.losses.append(step_loss)
            if self.step % c.train.log_every == 0 or self.step == c.train.max_steps:
                self._log(
                    {
                        "step": self.step,
                        "loss": step_loss,
                        "lr": lr,
                        "grad_norm": grad_norm,
                        "tokens": self.tokens_seen,
                        "tokens_per_s": step_tokens / dt,
                        "elapsed": self.elapsed,
                    }
                )
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.4f}", tok_s=f"{step_tokens / dt:.0f}", lr=f"{lr:.2e}")
            if c.eval.every and self.step % c.eval.every == 0:
                result.evals.append(self.evaluate())
            if (c.train.save_every and self.step % c.train.save_every == 0) or self.step == c.train.max_steps:
                self.save_checkpoint()
            if on_step is not None:
                on_step(self, step_loss)
        bar.close()
        if c.eval.at_end and (not c.eval.every or self.step % c.eval.every):
            result.evals.append(self.evaluate())
        self.save_adapter()
        result.step, result.seconds = self.step, time.perf_counter() - session_start
        result.tokens = self.tokens_seen
        return result

    def save_adapter(self) -> Path | None:
        """``adapter/``: the LoRA adapter in peft format plus the other trainable weights."""
        from safetensors.torch import save_file

        acc, out = self.accelerator, self.output_dir / "adapter"
        if self._fsdp():
            return None  # the last checkpoint holds the gathered weights; export reads it
        acc.wait_for_everyone()
        if acc.is_main_process:
            from .._io import atomic_directory

            with atomic_directory(out, overwrite=True) as tmp:
                self.peft_model.save_pretrained(tmp)
                extra = {
                    n: p.detach().contiguous().cpu()
                    for n, p in self.peft_model.named_parameters()
                    if p.requires_grad and "lora_" not in n
                }
                if extra:
                    save_file(extra, tmp / "trainable_params.safetensors")
                atomic_write_text(tmp / "ropescale_train.yaml", dump_config(self.config))
        acc.wait_for_everyone()
        return out


def load_run_config(output_dir: str | Path) -> TrainConfig:
    """The resolved recipe a run wrote to its output folder."""
    import yaml

    path = Path(output_dir) / "config.yaml"
    if not path.is_file():
        raise RopescaleError(f"'{output_dir}' is not a training run folder (no config.yaml)")
    raw = yaml.safe_load(path.read_text())
    return config_from_dict(raw, name=raw.get("name") or Path(output_dir).name)
