"""The fine-tuning recipe: a plain PyTorch loop driven by ``accelerate.Accelerator``.

Why not ``transformers.Trainer``: the loop needs per-window ``position_ids`` (PoSE), a loss that
never materialises ``[tokens, vocab]`` logits, an attention function switched between training and
evaluation (S²-Attn), checkpoints holding only the trainable weights, and an exact resume (data
position = step count). Each is a few lines here and a callback or subclass there; the loop below
reads top to bottom (``setup → train → save_checkpoint``), and accelerate still provides devices,
DDP/FSDP wrapping, context parallelism, mixed precision and gradient synchronisation.

The model (:mod:`.modeling`), memory options (:mod:`.memory`), optimizer and schedule (:mod:`.optim`),
checkpoint helpers (:mod:`.checkpoints`), saving and resuming (:mod:`.resume`) and context parallelism (:mod:`.parallel`) live beside it.

Output folder (``train.output_dir``, default ``runs/<recipe>``)::

    config.yaml              the resolved recipe (resume checks it)
    data/train_tokens.npy    the packed training stream (tokenized once; data/source-<i>.npy per source of a mix)
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
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from .._io import atomic_write_text
from ..errors import MissingDependencyError, RopescaleError
from ..models.runtime import load_average
from ..patching.plan import original_spec, sliding_window_setting
from ..scoring import nll
from .checkpoints import left_as_found, list_checkpoints, prepare_output_dir, run_identity
from .config import TrainConfig, dump_config, load_run_config
from .data import WindowDataset, WindowSpec, micro_batch_indices, training_stream
from .evaluation import EvalRecord
from .mixing import mixed_windows
from .modeling import (  # chunked_causal_lm_loss, resolve_attn_implementation: re-exported (older imports)
    CausalLMLoss,
    apply_memory_options,
    check_lengths,
    chunked_causal_lm_loss,
    load_base_model,
    resolve_attn_implementation,
    scale_model,
    target_length,
    wrap_lora,
)
from .optim import build_optimizer, lr_lambda
from .packing import resolved_packing
from .parallel import check_launch, context_parallel_batch, cp_size, data_parallel_rank, parallelism_config
from .preflight import SLIDING_WINDOW_KEY
from .recall import recall_writer
from .resume import Checkpointing
from .state_files import FSDP_OPTIMIZER_FILES, check_fsdp_state_dict_type, refuse_pickles

__all__ = [
    "Trainer",
    "TrainResult",
    "chunked_causal_lm_loss",
    "list_checkpoints",
    "load_run_config",
    "resolve_attn_implementation",
]


def _require_training_deps() -> None:
    for name in ("peft", "accelerate"):
        if importlib.util.find_spec(name) is None:
            raise MissingDependencyError(f"training needs {name}: pip install 'ropescale[train]'")


class _CompiledStep(TypedDict, total=False):
    compiled_layers: int  # train.compile: the decoder layers that ran compiled (absent when off)
    head_loss: str  # "fused": the fused CPU head loss computed the step (train.head_loss; absent: it did not)


class StepRecord(_CompiledStep):
    """One optimizer step's line of ``metrics.jsonl`` (with the load average :meth:`Trainer._log` adds)."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None  # None: optim.max_grad_norm is null (no clipping, no norm computed)
    tokens: int  # seen so far, over every process
    tokens_per_s: float
    elapsed: float  # seconds of training steps so far, over every session of the run


@dataclass
class TrainResult:
    step: int
    losses: list[float] = field(default_factory=list)  # per step of this session
    evals: list[EvalRecord] = field(default_factory=list)
    output_dir: Path | None = None
    seconds: float = 0.0
    tokens: int = 0


class Trainer(Checkpointing):
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
        self.compiled_layers = 0
        self._ready = False

    # ------------------------------------------------------------------------------ setup

    def setup(self, resume: bool = False, overwrite: bool = False) -> None:
        """Load and wrap the model, build data/optimizer/scheduler, and restore a checkpoint; a refused
        setup leaves the output folder as it found it."""
        with left_as_found(self.output_dir, enabled=os.environ.get("RANK", "0") == "0"):
            self._setup(resume, overwrite)

    def _setup(self, resume: bool, overwrite: bool) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        c = self.config
        pc = parallelism_config(c.train.context_parallel)
        self.accelerator = acc = Accelerator(mixed_precision=c.train.mixed_precision, parallelism_config=pc)
        check_launch(acc.num_processes)
        self.fsdp_version = acc.state.fsdp_plugin.fsdp_version if self._fsdp() else None
        if self._fsdp():  # a checkpoint this run writes must be one a resume will load
            check_fsdp_state_dict_type(acc.state.fsdp_plugin)
        if self._fsdp() and (c.eval.every or c.eval.at_end):
            raise RopescaleError(
                "evaluation during training is not supported under FSDP: set eval.every=0 "
                "eval.at_end=false and evaluate the export"
            )
        self.cp = cp_size(acc)
        if self.cp != c.train.context_parallel:
            raise RopescaleError(
                f"train.context_parallel={c.train.context_parallel} but the launch has {self.cp} context-parallel "
                "ranks: set train.context_parallel to the accelerate config's parallelism_config_cp_size"
            )
        self._check_output_dir(resume, overwrite)
        if resume:  # a pickled optimizer/scheduler/RNG file (an earlier version's) is refused before weights load
            for checkpoint in list_checkpoints(self.output_dir):
                refuse_pickles(checkpoint, allowed=FSDP_OPTIMIZER_FILES if self._fsdp() else ())
        self.identity = run_identity(c, self._model_in is None, self._train_tokens is None)
        set_seed(c.train.seed)
        self._announce_shipped_scaling(acc.is_main_process)
        if self.tokenizer is None and self._train_tokens is None:
            from ..models.loading import load_tokenizer

            self.tokenizer = load_tokenizer(c.model.name)
        self._preflight()  # everything the run could fail later, before the weights load
        with sliding_window_setting(SLIDING_WINDOW_KEY):
            base = self._model_in if self._model_in is not None else load_base_model(c)
            base = scale_model(base, c)
        base.config.use_cache = False
        self.base_attn = base.config._attn_implementation
        self.target_length = target_length(base, c)
        check_lengths(base, c)
        self.peft_model = wrap_lora(base, c)
        if nll.fused_wanted(c.train.head_loss):  # asked for where it cannot run: said, not silently dropped
            why = nll.head_problem(self.peft_model.get_base_model().get_output_embeddings(), acc.device.type)
            if why and acc.is_main_process:
                print(f"ropescale: train.head_loss=fused: {why}; its loss takes the recomputing path", file=sys.stderr)
        apply_memory_options(self.peft_model.get_base_model(), c)
        if c.s2attn.enabled:
            from .s2attn import enable_s2attn

            enable_s2attn(self.peft_model.get_base_model(), c.s2attn.group_ratio)
        if c.train.compile:  # after every change to the layers' code (LoRA, memory options, S2-Attn): it is traced
            from .compiling import compile_layers

            self.compiled_layers = compile_layers(self.peft_model.get_base_model())
        with acc.main_process_first():
            self.dataset = self._build_dataset()
        state = self._restore_weights() if resume else None
        # names in the unwrapped peft model: FSDP1 inserts `_fsdp_wrapped_module.` into them
        self.trainable_names = [n for n, p in self.peft_model.named_parameters() if p.requires_grad]
        module = CausalLMLoss(self.peft_model, c.train.loss_chunk)
        if self.fsdp_version == 2:  # FSDP2 replaces the parameters: model and optimizer are prepared together
            self.module, self.optimizer = acc.prepare(module, build_optimizer(module, c))
        else:
            self.module = acc.prepare(module)
            self.optimizer = acc.prepare(build_optimizer(self.module, c))
        # FSDP1 computes the global gradient norm only when given all of the model's parameters
        trainable = [p for p in self.module.parameters() if p.requires_grad]
        self.clip_params = list(self.module.parameters()) if self.fsdp_version == 1 else trainable
        # The scheduler is stepped by hand: accelerate's wrapper steps it once per process.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer.optimizer, lr_lambda(c))
        if state is not None:
            self._restore_training_state(state)
        if acc.is_main_process:  # the recipe in force (a resume may have raised train.max_steps)
            atomic_write_text(self.output_dir / "config.yaml", dump_config(c))
            if state is None:  # a fresh start: no metrics of an earlier, checkpoint-less attempt
                (self.output_dir / "metrics.jsonl").unlink(missing_ok=True)
        acc.wait_for_everyone()
        self._ready = True

    def _announce_shipped_scaling(self, main: bool) -> None:
        """Say what happens to a scaling the checkpoint carries, or refuse when the recipe does not say
        (:mod:`.shipped`), before any weights load."""
        from .dryrun import config_source
        from .shipped import shipped_scaling_line

        if self._model_in is not None:
            hf_config, where = self._model_in.config, "the given model"
        else:
            try:
                hf_config, where = config_source(self.config.model.name)
            except RopescaleError:
                return  # nothing readable before loading: loading says why, or converts the embedded model
        line = shipped_scaling_line(self.config, hf_config, where)
        said = line.split(":", 1)[1].strip()
        if main and said.startswith(("replaced:", "composed:")):
            print("ropescale: shipped scaling " + said, file=sys.stderr)

    def _preflight(self) -> None:
        """The checks of :mod:`.preflight`, on the main process only (the data is read once); the other
        processes stop with it."""
        from .preflight import Preflight, run_preflight, scaled_config

        acc, failure = self.accelerator, None
        if acc.is_main_process:
            given = self._model_in.config if self._model_in is not None else None
            pf = Preflight(
                self.config,
                self.tokenizer,
                "no tokenizer: the trainer was handed its tokens",
                scaled_config(self.config, given),
                recipe_data=self._train_tokens is None,
                gpus=acc.num_processes,
                eval_tokens=self.eval_tokens,
                device=acc.device.type,
            )
            try:
                self.preflight_lines = run_preflight(pf)
                self.eval_tokens = pf.eval_tokens
            except RopescaleError as exc:
                failure = exc
        if acc.num_processes > 1:
            failed = acc.reduce(torch.tensor([float(failure is not None)], device=acc.device), reduction="sum")
            if failure is None and float(failed.sum()) > 0:
                raise RopescaleError("the preflight failed on the main process (its line is printed there)")
        if failure is not None:
            raise failure

    def _check_output_dir(self, resume: bool, overwrite: bool) -> None:
        if self.accelerator.is_main_process:
            from ..data.sources import local_sources

            inputs = {"model": self.config.model.name}
            inputs.update({f"data {i}" if i else "data": s for i, s in enumerate(local_sources(self.config.data))})
            prepare_output_dir(self.output_dir, resume, overwrite, inputs)
        self.accelerator.wait_for_everyone()

    def _build_dataset(self) -> WindowDataset:
        c = self.config
        stream = self._train_tokens
        if stream is None and not c.data.sources:
            stream = training_stream(c, self.tokenizer, self.output_dir / "data" / "train_tokens.npy")
        bos = None
        if c.data.bos_each_window and self.tokenizer is not None:
            bos = self.tokenizer.bos_token_id
        elif c.data.bos_each_window:
            bos = getattr(self.peft_model.config, "bos_token_id", None)
        spec = WindowSpec(
            c.data.seq_len,
            bos,
            self.target_length if c.pose.enabled else None,
            c.pose.chunks,
            c.pose.content,
            documents=resolved_packing(c.data) == "documents",
            short_share=c.data.short_share,
            short_len=min(c.data.seq_len, original_spec(self.peft_model.config).original_max_position_embeddings),
        )
        self.bos_token_id = bos
        recall = recall_writer(self.tokenizer, c.data.recall_facts, c.data.seq_len, c.data.recall_forms)
        if stream is None:  # a weighted mix of sources (data.sources)
            return mixed_windows(c, self.tokenizer, self.output_dir / "data", spec, recall)
        return WindowDataset(stream, spec, seed=c.train.seed, recall=recall)

    def _log(self, record: StepRecord | EvalRecord) -> None:
        """One line of ``metrics.jsonl``, with the load average it ran under (a step timed beside another
        job is slower by its share: the line says so)."""
        if self.accelerator.is_main_process:
            with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({**record, "load_avg": load_average()}) + "\n")

    # ----------------------------------------------------------------------------- evaluation

    def evaluate(self) -> EvalRecord:
        """Perplexity at the target length on held-out text, with full attention, in eval mode."""
        from .evaluation import eval_documents, evaluate_peft_model

        c, acc = self.config, self.accelerator
        record: EvalRecord = {}
        if acc.is_main_process:
            length = c.eval.length or self.target_length
            if self.eval_tokens is None:
                self.eval_tokens = eval_documents(c, self.tokenizer, length)
            result = evaluate_peft_model(
                self.peft_model, c, self.eval_tokens, length, self.bos_token_id, self.base_attn, acc.autocast
            )
            record = {"step": self.step, **result}
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
        accum, bs = c.train.grad_accum, c.train.batch_size
        dp_rank, world = data_parallel_rank(acc)  # the ranks of a context-parallel group read the same windows
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
            t0, fused_before = time.perf_counter(), nll.FUSED_CALLS
            loss_sum = torch.zeros((), device=acc.device)
            for micro in range(accum):
                batch = self.dataset.batch(micro_batch_indices(self.step, micro, (bs, accum, world), dp_rank))
                batch = {k: v.to(acc.device) for k, v in batch.items()}
                sync = contextlib.nullcontext() if micro == accum - 1 else acc.no_sync(self.module)
                with sync, self._inputs(batch) as inputs, nll.head_loss(c.train.head_loss):
                    loss = self.module(**inputs)
                    acc.backward(loss / accum)
                loss_sum += loss.detach().float()
            grad_norm = None
            if c.optim.max_grad_norm is not None:
                grad_norm = float(acc.clip_grad_norm_(self.clip_params, c.optim.max_grad_norm))
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
                record = StepRecord(
                    step=self.step,
                    loss=step_loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    tokens=self.tokens_seen,
                    tokens_per_s=step_tokens / dt,
                    elapsed=self.elapsed,
                )
                if self.compiled_layers:  # what produced the step's numbers (config.yaml says train.compile too)
                    record["compiled_layers"] = self.compiled_layers
                if nll.FUSED_CALLS > fused_before:  # likewise: the fused head loss (train.head_loss)
                    record["head_loss"] = "fused"
                self._log(record)
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

    def _inputs(self, batch: dict[str, torch.Tensor]) -> contextlib.AbstractContextManager:
        """The module's keyword arguments for one micro-batch: the batch itself, or under context
        parallelism this rank's shards (the forward and backward run inside the context)."""
        if self.cp > 1:
            return context_parallel_batch(self.accelerator, batch, self.cp)
        return contextlib.nullcontext(batch)
