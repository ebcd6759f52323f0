"""The model a recipe trains: the base model scaled by its method, LoRA around it, and the loss module.

``load_base_model → scale_model → wrap_lora`` builds it (the rotary module is patched before peft
wraps the model); :class:`CausalLMLoss` is what accelerate wraps (DDP/FSDP), so the loss is
computed inside the wrapped forward; :func:`apply_memory_options` applies the recipe's activation
checkpointing, offloading and MLP tiling (:mod:`ropescale.training.memory`).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ..errors import RopescaleError
from ..scaling import Scaling
from ..scoring.nll import IGNORE_INDEX, summed_nll
from .config import TrainConfig
from .memory import check_mlp_tiling, enable_activation_checkpointing, tile_mlps


def resolve_attn_implementation(requested: str, dtype: str = "bfloat16") -> str:
    """``auto`` → flash_attention_2 when flash-attn is installed, a GPU is present and the weights
    are 16-bit (flash-attn has no fp32 kernel), else sdpa — as for evaluation
    (:func:`ropescale.models.runtime.resolve_runtime`)."""
    if requested != "auto":
        return requested
    from ..models.runtime import auto_attention

    return auto_attention(torch.cuda.is_available(), dtype)


def load_base_model(config: TrainConfig, dtype: str | None = None) -> Any:
    """The recipe's base model, scaled by its method (the rotary module is patched before LoRA).

    Under context parallelism (``train.context_parallel > 1``) ``auto`` attention is SDPA: torch's
    context-parallel attention replaces SDPA only.
    """
    from ..models.loading import from_pretrained, load_config

    scaling = recipe_scaling(config, load_config(config.model.name, config.scaling.original_max_position_embeddings))
    dtype = dtype or config.model.dtype
    attn = config.model.attn_implementation
    attn = "sdpa" if attn == "auto" and config.train.context_parallel > 1 else resolve_attn_implementation(attn, dtype)
    return from_pretrained(config.model.name, scaling, dtype=getattr(torch, dtype), attn_implementation=attn)


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
    return patch(model, recipe_scaling(config, model.config))


def recipe_scaling(config: TrainConfig, hf_config: Any) -> Scaling:
    """The recipe's :class:`~ropescale.scaling.Scaling` on ``hf_config``'s model: its method, factor and
    trained context, its parameters, its sliding window, and whether it composes on or replaces a scaling
    the checkpoint carries (:func:`ropescale.training.shipped.shipped_mode`, the rule patch and recommend
    follow). One place for the trainer, the dry run and the preflight, so the three plan the same model."""
    from .shipped import shipped_mode

    s = config.scaling
    return Scaling.of(
        s.method,
        s.factor,
        s.original_max_position_embeddings,
        replace=shipped_mode(config, hf_config) != "compose",
        sliding_window=config.model.sliding_window,
        **dict(s.params),
        **({"shipped_context": config.model.shipped_context} if config.model.shipped_context else {}),
        **({"compose": True} if shipped_mode(config, hf_config) == "compose" else {}),
    )


def target_length(base: Any, config: TrainConfig) -> int:
    """The context the run trains for: ``pose.target_length``, else the scaled model's context."""
    from ..patching.plan import provenance

    block = provenance(base.config) or {}
    extended = int(block.get("extended_context") or base.config.max_position_embeddings)
    return int(config.pose.target_length or extended)


def check_lengths(base: Any, config: TrainConfig) -> None:
    """Windows and PoSE targets must fit the scaled context; context parallelism needs full attention."""
    c, limit = config, base.config.max_position_embeddings
    if c.pose.enabled and c.pose.target_length and c.pose.target_length > limit:
        raise RopescaleError(
            f"pose.target_length {c.pose.target_length} exceeds the scaled context {limit}; raise scaling.factor"
        )
    if not c.pose.enabled and c.data.seq_len > limit:
        raise RopescaleError(f"data.seq_len {c.data.seq_len} exceeds the scaled context {limit}")
    if c.train.context_parallel > 1 and getattr(base.config, "sliding_window", None):
        raise RopescaleError(
            f"train.context_parallel={c.train.context_parallel} needs full attention, but the model has a sliding "
            f"window of {base.config.sliding_window}: set model.sliding_window=null"
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


class FullFinetune(nn.Module):
    """A causal LM with every weight trainable (``lora.enabled: false``), behind the calls the trainer
    and the export make of a peft model (``get_base_model``, ``merge_and_unload``, ``save_pretrained``).

    The weights are float32 master weights (autocast computes in bf16 under ``train.mixed_precision``);
    checkpoints hold them all, so ``ropescale export`` loads the base and copies them in.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.base_model = model
        for param in model.parameters():
            param.requires_grad_(True)
            if param.dtype != torch.float32:
                param.data = param.data.float()

    @property
    def config(self) -> Any:
        return self.base_model.config

    def get_base_model(self) -> nn.Module:
        return self.base_model

    def merge_and_unload(self) -> nn.Module:
        return self.base_model

    def save_pretrained(self, path: Any) -> None:
        """Nothing beside the trainable weights, which the caller writes (there is no adapter)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base_model(*args, **kwargs)


def wrap_lora(model: Any, config: TrainConfig) -> Any:
    """LoRA (peft) around a scaled model, plus optionally trainable embeddings and norms; with
    ``lora.enabled: false`` a :class:`FullFinetune` instead (every weight trains)."""
    if not config.lora.enabled:
        return FullFinetune(model)
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


def apply_memory_options(causal_lm: Any, config: TrainConfig) -> None:
    """The recipe's activation checkpointing (optionally offloaded) and MLP tiling on the causal LM."""
    t = config.train
    if t.gradient_checkpointing:
        enable_activation_checkpointing(causal_lm, offload=t.offload_activations)
    if t.mlp_tile_tokens:
        why = check_mlp_tiling(causal_lm)
        if why is not None:
            raise RopescaleError(f"train.mlp_tile_tokens={t.mlp_tile_tokens}: cannot tile this model's MLP ({why})")
        tile_mlps(causal_lm, t.mlp_tile_tokens)


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


def summed_shifted_nll(hidden: torch.Tensor, lm_head: nn.Module, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Summed cross entropy where position ``t`` predicts ``targets[:, t]`` (labels already shifted).

    Context parallelism cuts the sequence into shards before the model sees it, so the shift that
    pairs a position with the next token is done on the whole sequence first
    (:func:`ropescale.training.parallel.shift_labels`); a shard's last position predicts the first
    token of the next shard.
    """
    # summed_nll pairs hidden[:, t] with labels[:, t + 1]: one padding column makes that targets[:, t]
    pad = hidden.new_zeros(hidden.shape[0], 1, hidden.shape[2])  # [B, 1, H], never scored
    head = torch.full_like(targets[:, :1], IGNORE_INDEX)  # [B, 1]
    total, _ = summed_nll(torch.cat([hidden, pad], 1), lm_head, torch.cat([head, targets], 1), chunk)
    return total


class CausalLMLoss(nn.Module):
    """``forward(input_ids, position_ids, labels) -> loss`` around a peft-wrapped (or
    :class:`FullFinetune`) causal LM.

    This is the module accelerate wraps (DDP/FSDP), so the loss is computed inside the wrapped
    forward. An all-ones attention mask is passed on purpose: with ``attention_mask=None``
    transformers reads non-consecutive ``position_ids`` (PoSE skips) as several packed sequences
    and would block attention between the chunks (under context parallelism accelerate's hooks drop
    the mask and attend causally, which is the same). With ``seq_ids`` (``data.packing: documents``)
    attention stays within each document instead (:func:`ropescale.training.packing.document_attention`);
    with ``short`` the forward runs at the unscaled rotary (:mod:`ropescale.training.short`).

    With ``targets`` (labels shifted beforehand: context parallelism) instead of ``labels`` the
    forward returns ``sum of the shard's NLL / normalizer``.
    """

    def __init__(self, peft_model: nn.Module, loss_chunk: int = 1024):
        super().__init__()
        self.model = peft_model
        self.loss_chunk = loss_chunk
        causal_lm = peft_model.get_base_model()
        self._no_split_modules = getattr(causal_lm, "_no_split_modules", None)  # FSDP auto-wrap

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        normalizer: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
        short: torch.Tensor | None = None,
    ) -> torch.Tensor:
        import contextlib

        from .packing import document_attention
        from .short import original_rotary

        causal_lm = self.model.get_base_model()
        if seq_ids is None:
            attention = {"attention_mask": torch.ones_like(input_ids)}
        else:
            attention = document_attention(causal_lm, position_ids, seq_ids)
        rotary = original_rotary(causal_lm) if short is not None else contextlib.nullcontext()
        with rotary:  # a short micro-batch: the unscaled frequencies (training/short.py)
            out = causal_lm.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False, **attention)
        if targets is None:
            return chunked_causal_lm_loss(out.last_hidden_state, causal_lm.lm_head, labels, self.loss_chunk)  # []
        total = summed_shifted_nll(out.last_hidden_state, causal_lm.lm_head, targets, self.loss_chunk)
        return (total / normalizer).float()  # []
