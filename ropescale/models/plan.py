"""A plan before a GPU hour: peak memory per GPU and time per step (training) or per prompt
(evaluation) for a model's shape, a length, a dtype and the memory options, on a named card.

Nothing here loads weights or touches a GPU: it is arithmetic on the shape in ``config.json``.

**Memory, from first principles.** What a training step holds at its peak on one GPU:

* weights: frozen ones in the model dtype, trainable ones (LoRA, embeddings, norms, or every weight
  of a full fine-tune) as fp32 master weights (:mod:`ropescale.training.modeling` keeps them fp32);
* their gradients (fp32) and AdamW's two moments (fp32), sharded over the GPUs under FSDP;
* with activation checkpointing, every decoder layer's input (``layers × tokens × hidden``; zero on
  the device with ``train.offload_activations``), plus the working set of the one layer being
  recomputed and differentiated: tensors of ``tokens × hidden`` (norms, q, attention output,
  residuals, their gradients), ``tokens × kv`` (k, v) and ``tokens × intermediate`` (the MLP's gate,
  up, activation and product and their gradients; only ``mlp_tile_tokens`` at a time when the MLP is
  tiled). Attention is SDPA with flash / memory-efficient kernels: the ``tokens²`` scores are never
  materialised. The logits exist ``loss_chunk`` positions at a time.

The counts of those per-token tensors ("units", in copies of the compute dtype) come out of the
computation graph of a Llama/Mistral/Qwen decoder layer (the forward's saved tensors: two RMSNorms whose
fp32 upcast is a copy under bf16 autocast, q, k, v and their rotated copies, the attention output,
gate, up, SiLU, product; the backward's gradients and flash attention's fp32 accumulator), and are
then **calibrated** on the cells measured so far (``benchmarks/README.md``, "Training memory per
step": a Llama-2-7B shape on an H200 with checkpointing alone at 16k–128k tokens and on an H100 with
offloading and MLP tiles at 128k; a 4-layer fp32 shape on the CPU at 1k–8k): the per-token slope of
the measured peaks fixes the hidden and intermediate units. ``tests/models/test_plan.py`` reads
every measured cell from that file and holds the estimate within 15 %.

**Time**, from the work: ``2 × parameters`` FLOPs per token per matrix pass (forward, recompute,
backward: 3 passes for frozen weights, 4 for trained ones) and ``2 × length × q_dim`` per token and
layer for causal attention (4.5 passes with checkpointing: flash attention's backward is ~2.5
forwards), at a fraction of the card's dense bf16 peak calibrated on the same H200 cells (the first,
16k cell includes CUDA's warm-up and is left out); offloading adds the two host copies of every layer
input at an effective bandwidth calibrated on the H100 cell. Evaluation prefill uses the forward
alone at the same fraction; that fraction and the evaluation memory are not calibrated yet
(``benchmarks/gpu_plan_check.py`` measures them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Card:
    name: str
    label: str
    memory_mib: int  # what torch.cuda.get_device_properties reports as total memory
    bf16_tflops: float  # dense tensor-core peak (no sparsity)
    hbm_tb_s: float  # memory bandwidth (decoding reads every weight once per token)


CARDS = {
    c.name: c
    for c in (
        Card("h100-80gb", "NVIDIA H100 80GB (SXM)", 81559, 989.0, 3.35),
        Card("h200-141gb", "NVIDIA H200 141GB", 143771, 989.0, 4.8),
        Card("a100-80gb", "NVIDIA A100 80GB", 81920, 312.0, 2.04),
        Card("a100-40gb", "NVIDIA A100 40GB", 40960, 312.0, 1.55),
        Card("l40s-48gb", "NVIDIA L40S 48GB", 46068, 362.0, 0.864),
        Card("rtx4090-24gb", "NVIDIA RTX 4090 24GB", 24564, 165.0, 1.008),
    )
}
#: what a process holds beyond max_memory_allocated: CUDA context, cuBLAS/flash workspaces, allocator slack
RESERVE_MIB = 2048


@dataclass(frozen=True)
class Units:
    """Per-token tensors of one decoder layer at its backward peak, in copies of the compute dtype."""

    hidden: float  # of hidden_size (norms and their fp32 upcasts, q, attention output, residuals, grads)
    kv: float  # of num_key_value_heads x head_dim (k, v, rotated k, their grads)
    intermediate: float  # of intermediate_size (gate, up, SiLU, product, their grads)


#: First-principles counts (``kv`` stays at its count: k, v, rotated k saved; dk, dv in the backward),
#: ``hidden`` and ``intermediate`` calibrated on the measured cells (module docstring): on CUDA under bf16
#: autocast the H200 checkpointing-only slope (0.546 MiB per token for Llama-2-7B, of which 0.25 are the
#: layer inputs) and the H100 offloaded+tiled cell; fp32 on the CPU the 4-layer shape's 4k->8k slopes.
#: Counted from the graph: 26 hidden and 7 intermediate units (bf16 autocast), 12 and 7 (fp32, no upcasts).
UNITS = {
    "autocast": Units(hidden=19.2, kv=5.0, intermediate=5.3),
    "fp32": Units(hidden=6.5, kv=5.0, intermediate=5.8),
}
#: what the measured cells cover (tokens on one GPU, no context parallelism): beyond it a plan is extrapolated
CALIBRATED_TOKENS = 131072
#: fraction of the card's dense bf16 peak a training step reaches (H200 cells at 32k-128k: 0.43-0.50)
TRAIN_EFFICIENCY = 0.47
#: host<->device bytes per second the offloaded layer inputs move at, effective (the H100 128k cell)
OFFLOAD_BYTES_PER_S = 4.5e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only RoPE model that memory and time depend on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    name: str = ""

    @classmethod
    def from_config(cls, config: Any) -> Shape:
        """From a transformers config (or anything with its attributes)."""
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        model_type = str(getattr(config, "model_type", ""))
        return cls(
            hidden=hidden,
            intermediate=int(config.intermediate_size),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            vocab=int(config.vocab_size),
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            name=str(getattr(config, "_name_or_path", "") or model_type),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of every linear layer of one decoder layer, by module name."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        linear = sum(a * b for a, b in self.linear_shapes().values())
        bias = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        return linear + bias + self.norm_params_per_layer()

    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    def embed_params(self) -> int:
        return self.vocab * self.hidden

    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.embed_params() + head + self.layers * self.layer_params() + self.hidden

    def matmul_params(self) -> int:
        """Weights a token multiplies through: every linear layer and the output projection."""
        return self.layers * sum(a * b for a, b in self.linear_shapes().values()) + self.vocab * self.hidden

    def lora_params(self, targets: list[str], r: int) -> int:
        shapes = self.linear_shapes()
        return self.layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)


@dataclass
class Options:
    """What a training step runs with (a recipe's settings, or the benchmark's)."""

    tokens: int  # window length x windows per micro-batch, before context parallelism
    trainable: int  # trainable parameters (fp32 master weights)
    full: bool = False  # every weight trains (no frozen base)
    weight_dtype: str = "bfloat16"
    autocast: bool = True  # bf16 compute (train.mixed_precision bf16); False: fp32 throughout
    checkpointing: bool = True
    offload: bool = False
    tile: int = 0
    loss_chunk: int = 1024
    context_parallel: int = 1
    gpus: int = 1
    fsdp: bool = False  # weights, gradients and optimizer sharded over the GPUs
    optimizer: bool = True  # AdamW moments held (False: a forward+backward only, as the benchmark)
    attention_span: int | None = None  # keys a query sees at most (S2-Attn groups, a sliding window); None: all
    window: int | None = None  # tokens of one sequence (attention stays within it); None: all the tokens


@dataclass
class Estimate:
    """A plan's answer: the parts of the peak (bytes) and the time (seconds)."""

    parts: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    tokens: int = 0

    @property
    def peak(self) -> float:
        return sum(self.parts.values())

    def peak_mib(self) -> float:
        return self.peak / MIB


def train_estimate(shape: Shape, o: Options, card: Card | None = None) -> Estimate:
    """Peak memory per GPU and seconds per micro-step (forward + backward of one micro-batch)."""
    total = shape.params()
    frozen = 0 if o.full else max(total - o.trainable, 0)
    shard = o.gpus if o.fsdp else 1
    wb = DTYPE_BYTES[o.weight_dtype]
    ab = 2 if o.autocast else 4
    units = UNITS["autocast" if o.autocast else "fp32"]
    t = o.tokens // max(o.context_parallel, 1)  # tokens this GPU holds
    parts = {
        "weights": (frozen * wb + o.trainable * 4) / shard,
        "gradients": o.trainable * 4 / shard,
        "optimizer": (o.trainable * 8 / shard) if o.optimizer else 0.0,
    }
    if o.fsdp and o.gpus > 1:  # one decoder layer gathered whole at a time (two: prefetch)
        parts["gathered layer"] = 2 * shape.layer_params() * (4 if o.full else wb)
    per_token_layer = ab * (units.hidden * shape.hidden + units.kv * shape.kv_dim)
    mlp_tokens = min(t, o.tile) if o.tile else t
    working = t * per_token_layer + mlp_tokens * ab * units.intermediate * shape.intermediate
    # the loss's backward (one chunk's fp32 logits, log-softmax and their gradients: 5 copies, with the
    # final hidden states and their gradient) comes before the layers' and does not coincide with it
    chunk = min(o.loss_chunk, t)
    loss = 5 * chunk * shape.vocab * 4 + 2 * t * shape.hidden * ab
    if o.context_parallel > 1:
        # torch's context parallelism with accelerate's cp_comm_strategy allgather (torch's _AllGatherRotater)
        # holds the whole window's keys and values for the layer it computes, forward and backward; the
        # backward adds the shard's K/V gradients in fp32 three times (accumulators, the buffer it sends on,
        # the one it receives: _templated_ring_attention_backward)
        parts["gathered K/V"] = 2 * o.tokens * shape.kv_dim * ab + 3 * 2 * t * shape.kv_dim * 4
    if o.checkpointing:
        parts["layer inputs"] = 0.0 if o.offload else shape.layers * t * shape.hidden * ab
        parts["one layer's activations" if working >= loss else "loss chunk"] = max(working, loss)
    else:
        parts["activations (every layer)"] = shape.layers * working + loss
    return Estimate(parts=parts, seconds=train_seconds(shape, o, t, card), tokens=t)


def train_seconds(shape: Shape, o: Options, t: int, card: Card | None = None) -> float:
    """Seconds of one micro-step on ``card`` (H200/H100-class peak when None)."""
    peak = (card.bf16_tflops if card else 989.0) * 1e12 * TRAIN_EFFICIENCY
    linear_passes = (4 if o.full else 3) - (0 if o.checkpointing else 1)
    attn_passes = 4.5 if o.checkpointing else 3.5
    window = o.window or o.tokens  # attention spans one sequence (ring attention splits the work, not the span)
    if o.attention_span and o.attention_span < window:  # a query sees at most the span's keys
        window = o.attention_span * (2 - o.attention_span / window)
    flops = t * (linear_passes * 2 * shape.matmul_params() + attn_passes * 2 * window * shape.q_dim * shape.layers)
    if o.tile and o.checkpointing and t > o.tile:  # each tile's MLP is recomputed once more
        flops += t * 2 * 3 * shape.hidden * shape.intermediate * shape.layers
    seconds = flops / peak
    if o.offload and o.checkpointing:
        seconds += 2 * shape.layers * t * shape.hidden * 2 / OFFLOAD_BYTES_PER_S
    return seconds


def eval_estimate(
    shape: Shape,
    length: int,
    weight_dtype: str = "bfloat16",
    kv_cache: bool = True,
    decode_tokens: int = 0,
    loss_chunk: int = 1024,
    card: Card | None = None,
) -> Estimate:
    """Peak memory and seconds of one evaluation prompt of ``length`` tokens (prefill, then
    ``decode_tokens`` generated tokens): weights, the KV cache, one layer's inference activations
    (the MLP's gate/up/product, q/k/v, the residual and the RMSNorm's fp32 upcast) and the logits
    (one ``loss_chunk`` for perplexity, the last position for generation). Not calibrated yet."""
    wb = DTYPE_BYTES[weight_dtype]
    ab = wb
    parts = {"weights": shape.params() * wb}
    if kv_cache:
        parts["KV cache"] = 2 * shape.layers * length * shape.kv_dim * ab
    per_token = ab * (3 * shape.intermediate + 2 * shape.q_dim + 2 * shape.kv_dim + 3 * shape.hidden) + 8 * shape.hidden
    parts["one layer's activations"] = length * per_token
    parts["logits"] = (min(loss_chunk, length) if not kv_cache else 1) * shape.vocab * 4 * 2
    peak = (card.bf16_tflops if card else 989.0) * 1e12 * TRAIN_EFFICIENCY
    flops = length * (2 * shape.matmul_params() + 2 * length * shape.q_dim * shape.layers)
    seconds = flops / peak
    if decode_tokens:
        bandwidth = (card.hbm_tb_s if card else 3.35) * 1e12 * 0.7
        per_token_bytes = shape.params() * wb + parts.get("KV cache", 0.0)
        seconds += decode_tokens * per_token_bytes / bandwidth
    return Estimate(parts=parts, seconds=seconds, tokens=length)


def outside_calibration(o: Options) -> str | None:
    """Why a plan lies outside the measured cells (None when it lies within): the memory units and the
    time fraction were fitted on one GPU at 16k-128k tokens, so a longer window, or one sharded by context
    parallelism (whose communication is not counted), is an extrapolation of them."""
    t = o.tokens // max(o.context_parallel, 1)
    why = []
    if t > CALIBRATED_TOKENS:
        why.append(f"{t:,} tokens a GPU")
    if (o.window or o.tokens) > CALIBRATED_TOKENS:
        why.append(f"a {(o.window or o.tokens):,}-token window (attention time grows with it)")
    if o.context_parallel > 1:
        why.append(f"context parallel over {o.context_parallel} (its communication is not counted)")
    if not why:
        return None
    return (
        f"outside the measured cells (one GPU, {CALIBRATED_TOKENS // 1024}k tokens at most): "
        + ", ".join(why)
        + "; an estimate, not a measurement"
    )


def fits(estimate: Estimate, card: Card) -> bool:
    return estimate.peak + RESERVE_MIB * MIB <= card.memory_mib * MIB


def advice(shape: Shape, o: Options, card: Card) -> list[str]:
    """What to turn on, in order of cost, until the step fits ``card`` (empty when it fits)."""
    if fits(train_estimate(shape, o), card):
        return []
    tips, trial = [], replace(o)
    steps = [
        ("train.gradient_checkpointing=true", {"checkpointing": True}),
        (f"train.mlp_tile_tokens={shape.hidden}", {"tile": shape.hidden}),
        ("train.offload_activations=true", {"offload": True}),
        ("train.loss_chunk=512", {"loss_chunk": min(o.loss_chunk, 512)}),
    ]
    for text, change in steps:
        candidate = replace(trial, **change)
        if train_estimate(shape, candidate).peak >= train_estimate(shape, trial).peak:
            continue  # already on, or no lower here
        trial = candidate
        tips.append(text)
        if fits(train_estimate(shape, trial), card):
            return tips
    if not trial.fsdp and o.gpus > 1:
        trial = replace(trial, fsdp=True)
        tips.append("FSDP over the GPUs (configs/accelerate/fsdp.yaml)")
        if fits(train_estimate(shape, trial), card):
            return tips
    for cp in (2, 4, 8):
        if o.tokens % (2 * cp) == 0 and cp > trial.context_parallel:
            trial = replace(trial, context_parallel=cp, fsdp=True, gpus=max(trial.gpus, cp))
            if fits(train_estimate(shape, trial), card):
                tips.append(f"train.context_parallel={cp} --gpus {cp} (launch with configs/accelerate/fsdp2_cp.yaml)")
                return tips
    tips.append(
        f"nothing listed fits {card.name}: a shorter window (data.seq_len with pose.enabled=true) or a larger card"
    )
    return tips


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def card(name: str) -> Card:
    from ..errors import RopescaleError

    if name not in CARDS:
        raise RopescaleError(f"unknown --gpu {name!r}; known: {', '.join(CARDS)}")
    return CARDS[name]


def tokens_per_second(estimate: Estimate) -> float:
    return estimate.tokens / estimate.seconds if estimate.seconds else math.inf
