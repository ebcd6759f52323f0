"""A training recipe's sections as dataclasses: every key, its type and its default.

The field annotations are what :func:`ropescale.training.config.config_from_dict` checks a YAML value
against, and the defaults are what a recipe that leaves a key out gets; the choices each key allows
and the checks across keys are in :mod:`.validation`. Import these names from
:mod:`ropescale.training.config`, where they are re-exported beside the loaders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RecipeError
from .precision import AUTO

ConfigError = RecipeError  # a training recipe or override is invalid (one-line message)


@dataclass
class ModelSection:
    name: str = ""  # checkpoint dir, .gguf, Hub id or embedded model (see ropescale.from_pretrained)
    dtype: str = AUTO  # dtype of the base weights (auto: see the module docstring)
    attn_implementation: str = "auto"  # auto: flash_attention_2 if installed and on a GPU, else sdpa
    sliding_window: Any = "keep"  # Mistral-style models: keep, null (full attention) or a width
    shipped_scaling: str | None = None  # replace | compose a scaling the checkpoint carries (training/shipped.py)
    # the context the checkpoint serves as shipped, where config.json and the family table are wrong: where
    # the recipe composes on the shipped scaling, its factor multiplies this (patching/shipped.py)
    shipped_context: int | None = None


@dataclass
class ScalingSection:
    method: str = ""
    factor: float = 0.0
    params: dict = field(default_factory=dict)
    original_max_position_embeddings: int | None = None


@dataclass
class LoraSection:
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list = field(default_factory=list)  # "embed", "norm": fully trainable (LongLoRA)
    enabled: bool = True  # false: full fine-tune (every weight trains; the other lora keys are unused)


@dataclass
class DataSection:
    source: str = "austen"  # any --data value (corpus name, file, folder, JSONL/Parquet, hub:org/name)
    holdout: Any = field(default_factory=list)  # titles (list) or a count of last documents, kept for eval
    seq_len: int = 2048  # tokens per training window (BOS included)
    bos_each_window: bool = True  # every window starts with BOS, as the perplexity evaluation does
    max_tokens: int | None = None  # stop tokenizing training text after this many tokens
    text_field: str = "text"
    recall_facts: int = 0  # recall sentences written into every window (training/recall.py); 0: none
    recall_forms: list = field(default_factory=lambda: ["digits"])  # their forms (training/recall.py FORMS)
    packing: str = "auto"  # documents: kept apart in a window; stream: one sequence (auto: see training/packing.py)
    chat_loss: str = "assistant"  # chat JSONL (messages): loss on assistant turns only, or on all tokens
    sources: list = field(default_factory=list)  # a weighted mix [{source, weight}, ...] (data/sources.py)
    short_share: float = 0.0  # share of micro-batches cut in pieces <= L at the unscaled rotary (training/short.py)


@dataclass
class PoseSection:
    enabled: bool = False
    target_length: int | None = None  # default: the scaled context (factor x original)
    chunks: int = 2
    content: str = "skip"  # skip: text skips with the positions; contiguous: unbroken text


@dataclass
class S2AttnSection:
    enabled: bool = False
    group_ratio: float = 0.25  # group size = seq_len x ratio (LongLoRA: 1/4)


@dataclass
class OptimSection:
    lr: float = 2e-5
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 20
    schedule: str = "linear"  # linear | cosine | constant (each after a linear warm-up)
    min_lr_ratio: float = 0.0  # floor of linear/cosine decay, as a fraction of lr
    max_grad_norm: float | None = 1.0


@dataclass
class TrainSection:
    max_steps: int = 400  # optimizer steps
    batch_size: int = 1  # windows per device per micro-batch
    grad_accum: int = 1
    mixed_precision: str = AUTO  # auto | no | bf16 | fp16 (autocast; trainable weights stay fp32)
    gradient_checkpointing: bool = True
    seed: int = 0
    output_dir: str = ""  # default: runs/<recipe name>
    save_every: int = 50  # steps between checkpoints (0: only at the end)
    keep_checkpoints: int = 2
    log_every: int = 1
    loss_chunk: int = 1024  # positions per lm_head+loss chunk (full logits are never materialised)
    offload_activations: bool = False  # checkpointed layer inputs in pinned host memory (training/memory.py)
    mlp_tile_tokens: int = 0  # >0: each decoder MLP runs over checkpointed tiles of this many tokens
    context_parallel: int = 1  # >1: the window is sharded over this many ranks (FSDP2; training/parallel.py)
    compile: bool = False  # each decoder layer through torch.compile (training/compiling.py)
    head_loss: str = "recompute"  # recompute | fused: the fused CPU head loss (scoring/nll.py)


@dataclass
class EvalSection:
    every: int = 0  # steps between perplexity evaluations (0: none during training)
    at_end: bool = False
    length: int | None = None  # default: the target length (pose.target_length or scaled context)
    max_tokens: int | None = None  # tokens of held-out text evaluated (default: one window)
    mode: str = "nonoverlap"
    data: str | None = None  # default: the held-out documents of data.source


#: any one section of a recipe (what :data:`SECTIONS` maps a name to, built)
Section = (
    ModelSection
    | ScalingSection
    | LoraSection
    | DataSection
    | PoseSection
    | S2AttnSection
    | OptimSection
    | TrainSection
    | EvalSection
)

SECTIONS = {
    "model": ModelSection,
    "scaling": ScalingSection,
    "lora": LoraSection,
    "data": DataSection,
    "pose": PoseSection,
    "s2attn": S2AttnSection,
    "optim": OptimSection,
    "train": TrainSection,
    "eval": EvalSection,
}


@dataclass
class TrainConfig:
    """A complete, validated recipe. Build with :func:`load_config` or :func:`config_from_dict`."""

    model: ModelSection = field(default_factory=ModelSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    lora: LoraSection = field(default_factory=LoraSection)
    data: DataSection = field(default_factory=DataSection)
    pose: PoseSection = field(default_factory=PoseSection)
    s2attn: S2AttnSection = field(default_factory=S2AttnSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    name: str = "run"

    def to_dict(self) -> dict[str, Any]:
        """Plain data that :func:`config_from_dict` turns back into an equal config."""
        return {"name": self.name, **{s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}}

    @property
    def output_dir(self) -> Path:
        return Path(self.train.output_dir or Path("runs") / self.name).expanduser()

    def global_batch(self, world_size: int = 1) -> int:
        return self.train.batch_size * self.train.grad_accum * world_size
