"""What llama.cpp can carry in a GGUF file, by model type and rope form: the one answer that
``ropescale doctor`` (its llama.cpp row), ``ropescale recommend --serve-with llama.cpp`` (through the
doctor's verdicts) and ``ropescale export-gguf`` (its refusals) all give.

Read from llama.cpp's own code (the copy pinned by ``make llamacpp``, llama-cpp-python 0.3.36):

* ``src/llama-model.cpp`` reads, for every architecture, ``rope.freq_base``,
  ``rope.scaling.type`` (none, linear, yarn, longrope), ``rope.scaling.factor``,
  ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor`` (a multiplier of cos
  and sin; ``llama-context.cpp`` adds YaRN's 0.1 ln s + 1 itself). ``rope.scaling.yarn_beta_*`` and
  ``yarn_attn_factor`` are read only by Grok and Mistral 3: llama, qwen2 and qwen3 keep β = 32, 1.
* ``src/models/llama.cpp`` loads a ``rope_freqs`` tensor (θ_i divided by it: how the converter
  writes Llama 3.1's scaling) or, with ``scaling.type=longrope``, ``rope_factors_long/short``.
* ``src/models/qwen2.cpp`` and ``qwen3.cpp`` load neither and pass no factors to ``ggml_rope_ext``:
  per-dimension scalings (llama3, LongRoPE and the composed scalings saved as LongRoPE) have no
  place there.
* every architecture rotates with frequencies fixed at load and caches rotated keys: no dynamic
  scaling, no KV-consistent re-rotation, nothing that changes attention (Self-Extend is
  llama-completion's ``--grp-attn-n/--grp-attn-w``, not model metadata); Llama and Qwen attend
  over the whole context (no sliding window).

The answer is judged on a config.json dict (as saved, or a config's ``to_dict``), so the CLI need not
import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .engines import APPROXIMATES, CANNOT, KEEPS, NON_NATIVE_PREFIX, PROVENANCE_KEY

#: transformers model_type -> the llama.cpp architecture ``export-gguf`` writes it as
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
#: architectures whose graph takes per-dimension rope factors (``rope_freqs``, ``rope_factors_long/short``)
PER_DIMENSION = frozenset({"llama"})
#: YaRN's ramp ends in llama.cpp's llama/qwen2/qwen3 (hparams defaults; the keys are not read there)
YARN_BETAS = (32.0, 1.0)
#: methods whose frequencies follow the current length (``ScalingMethod.dynamic``; a test pins it)
DYNAMIC_METHODS = frozenset({"dynamic_ntk", "dynamic_yarn"})


@dataclass(frozen=True)
class Carry:
    """llama.cpp's answer for one config.

    Attributes:
        verdict: ``keeps``, ``approximates`` or ``cannot express`` (as the doctor's rows).
        why: one line: what ``export-gguf`` writes, or why nothing can be written.
        method: the scaling's name (the provenance block's method, else the rope type).
        arch: the GGUF architecture (None: a model type llama.cpp's export does not cover here).
        model_refusal: the refusal is about the model (architecture, attention window), not its scaling.
    """

    verdict: str
    why: str
    method: str
    arch: str | None = None
    model_refusal: bool = False


def _window(data: dict) -> int | None:
    """The sliding window a config's attention uses (Qwen: only with use_sliding_window and sliding layers)."""
    window = data.get("sliding_window")
    if window is None or data.get("use_sliding_window", True) is False:
        return None
    layers = data.get("layer_types")
    if isinstance(layers, list) and layers and "sliding_attention" not in layers:
        return None
    return int(window)


def _same(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(float(a), b, rel_tol=1e-9)


def carry(data: dict, intent: Any) -> Carry:
    """Whether llama.cpp can run a config's RoPE scaling from a GGUF file, and in what form.

    Args:
        data: the parsed config.json (or ``config.to_dict()`` of a patched config).
        intent: :func:`ropescale.interop.verdict.intent_of` ``data`` (what the config means: the rope dict,
            the method, whether it is native).

    Returns:
        A :class:`Carry`: ``keeps`` (export-gguf writes it and llama.cpp computes what transformers
        does), ``approximates`` (written; llama.cpp chooses LongRoPE's factors by context size) or
        ``cannot express`` (export-gguf refuses it with this why).
    """
    raw_type = str(data.get("model_type", "?"))
    model_type = raw_type.removeprefix(NON_NATIVE_PREFIX)
    method = intent.method
    arch = GGUF_ARCH.get(model_type)
    if arch is None:
        names = ", ".join(sorted(GGUF_ARCH)[:-1]) + f" and {sorted(GGUF_ARCH)[-1]}"
        why = f"GGUF export supports {names} models, not '{model_type}'"
        return Carry(CANNOT, why, method, model_refusal=True)
    # the context the scaling covers (a linear config.json keeps max_position_embeddings at L)
    window, context = _window(data), intent.extended or data.get("max_position_embeddings")
    if window is not None and context is not None and window < int(context):
        how = (
            "runs Mistral as Llama with full attention"
            if model_type == "mistral"
            else f"runs {arch} with full attention"
        )
        why = f"sliding_window={window} is narrower than the context {context}; llama.cpp {how} (re-patch with --sliding-window none)"
        return Carry(CANNOT, why, method, arch, model_refusal=True)

    def cannot(why: str) -> Carry:
        return Carry(CANNOT, why, method, arch)

    rope = intent.rope
    kind = str(rope.get("rope_type", "default"))
    block = data.get(PROVENANCE_KEY) if isinstance(data.get(PROVENANCE_KEY), dict) else {}
    kv = bool(block.get("kv_consistent"))
    if kind == "dynamic" or method in DYNAMIC_METHODS:
        cache = " (and kv_consistent re-rotates the cached keys with them)" if kv else ""
        static = "yarn" if "yarn" in method else "ntk"
        return cannot(
            f"its frequencies are recomputed from the current length{cache}, while llama.cpp's rope scaling types "
            f"(none, linear, yarn, longrope) are fixed when the model loads and its cache holds rotated keys; export "
            f"the static {static} at the target factor instead"
        )
    if not intent.native or kind.startswith(NON_NATIVE_PREFIX) or raw_type != model_type:
        return cannot(
            "it groups positions inside attention, which llama.cpp's rope metadata cannot express (llama.cpp's own "
            "Self-Extend is llama-completion's --grp-attn-n/--grp-attn-w flags)"
        )
    if kind in ("llama3", "longrope") and arch not in PER_DIMENSION:
        return cannot(
            f"llama.cpp's {arch} architecture takes no per-dimension rope factors (rope_freqs), which {kind} is "
            "(a llama or mistral model can carry them)"
        )
    if kv:
        return cannot(
            "kv_consistent re-rotates cached keys with the current frequencies; llama.cpp caches keys already rotated "
            "(patch with kv_consistent=false to export the plain method)"
        )
    if kind in ("default", "linear"):
        form = "scaling.type=linear" if kind == "linear" else "scaling.type=none"
        return Carry(KEEPS, f"export-gguf writes {arch}.rope.{form} with its freq_base", method, arch)
    if kind == "yarn":
        fast, slow = rope.get("beta_fast", YARN_BETAS[0]), rope.get("beta_slow", YARN_BETAS[1])
        if not (_same(fast, YARN_BETAS[0]) and _same(slow, YARN_BETAS[1])):
            return cannot(
                f"beta_fast={float(fast):g}, beta_slow={float(slow):g}; llama.cpp's {arch} architecture ignores "
                "rope.scaling.yarn_beta_* and always uses 32 and 1"
            )
        if rope.get("truncate", True) is False:
            return cannot("truncate=false; llama.cpp always rounds YaRN's ramp ends to whole pairs")
        return Carry(
            KEEPS,
            f"export-gguf writes {arch}.rope.scaling.type=yarn, factor, original_context_length and attn_factor",
            method,
            arch,
        )
    if kind in ("llama3", "longrope"):
        long = rope.get("long_factor")
        short = rope.get("short_factor") or ([1.0] * len(long) if isinstance(long, list) else None)
        if kind == "longrope" and short != long:
            return Carry(
                APPROXIMATES,
                "export-gguf writes rope_factors_long/short; llama.cpp uses the long factors for every position once "
                "the context size (-c) exceeds L, transformers once the sequence does",
                method,
                arch,
            )
        attn = " and rope.scaling.attn_factor" if kind == "longrope" else ""
        return Carry(KEEPS, f"export-gguf writes the per-dimension factors as a rope_freqs tensor{attn}", method, arch)
    return cannot(f"rope_type '{kind}' is not one llama.cpp's GGUF rope metadata carries")


__all__ = ["Carry", "DYNAMIC_METHODS", "GGUF_ARCH", "PER_DIMENSION", "YARN_BETAS", "carry"]
