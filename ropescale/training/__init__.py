"""LoRA fine-tuning for context extension (``ropescale train`` / ``ropescale export``).

* :mod:`.config`  — recipes: YAML sections validated into dataclasses, ``key=value`` overrides
  (the sections in :mod:`.sections`, the checks across keys in :mod:`.validation`)
* :mod:`.data`    — documents packed with BOS/EOS into one stream, cut into (PoSE) windows
* :mod:`.pose`    — positional skip-wise training layouts (PoSE)
* :mod:`.s2attn`  — LongLoRA's shifted sparse attention, registered with transformers
* :mod:`.modeling` — base model, scaling, LoRA, the loss module accelerate wraps
* :mod:`.memory`  — activation checkpointing (offloaded), MLP tiles: longer windows, same math
* :mod:`.compiling` — ``train.compile``: each decoder layer through ``torch.compile``
* :mod:`.optim`   — AdamW and the LR schedule (a function of step and ``train.max_steps``)
* :mod:`.checkpoints` — fingerprints, RNG, trainable weights gathered under DDP/FSDP
* :mod:`.parallel` — context parallelism (accelerate ``ParallelismConfig``, FSDP2)
* :mod:`.evaluation` — perplexity on held-out text during training
* :mod:`.trainer` — the accelerate-driven loop
* :mod:`.resume`  — the trainer's atomic checkpoints and exact resume
* :mod:`.export`  — merge LoRA and save a checkpoint that carries its RoPE scaling

Needs the ``train`` extra (peft, accelerate); nothing here is imported by ``import ropescale``.
"""
