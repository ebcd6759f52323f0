"""The ``ropescale`` lm-eval model: lm-eval's HF model, loaded and RoPE-scaled by ropescale.

Model arguments (``--model_args``): ``pretrained`` (model name, directory, .gguf or Hub id, as for
``ropescale.from_pretrained``), ``method`` (none for no scaling), ``factor``,
``target_length`` (instead of factor, where ropescale supports it), ``original_max_position_embeddings``,
``replace``, ``sliding_window`` (keep/none/N),
``param_<name>=value`` for method parameters (``param_beta_fast=32``), ``max_length`` (default:
the scaled context, ``config.ropescale["extended_context"]`` = factor x original, also for the
dynamic methods whose ``max_position_embeddings`` stays at the original), ``dtype``
(auto/float32/bfloat16/float16), ``device`` (default cuda when available, else cpu),
``tokenizer``, ``attn_implementation``, ``truncate_prompts`` (default false: a prompt longer than
``max_length`` stops the run instead of being cut from the left, see
:mod:`ropescale.evals.lm_eval.checks`), plus HFLM's ``batch_size``, ``max_batch_size``,
``add_bos_token``, ``truncation``, ``logits_cache``, ``softmax_dtype``, ``mixed_precision_dtype``,
``prefix_token_id``, ``think_end_token``, ``enable_thinking``, ``chat_template_args``. Unknown
arguments are an error (HFLM would silently ignore them for a ready model). Values are read with
:mod:`ropescale.options`, the parsers the command line uses.

lm-eval 0.4.13 discovers no external models by itself (no entry points): importing
:mod:`ropescale.evals.lm_eval` registers ``ropescale`` (lazily: :data:`MODEL_TARGET` names the
class, built on first use because importing lm-eval's HF model costs seconds).
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict

from ropescale import options
from ropescale.errors import MissingDependencyError
from ropescale.evals.lm_eval.args import (
    MODEL_NAME,
    ScalingOptions,
    default_max_length,
    parse_dtype,
    resolve_device,
    scaling_options,
    split_model_args,
    trained_context,
)
from ropescale.evals.lm_eval.checks import check_generation, check_loglikelihood, ruler_note
from ropescale.evals.tasks.records import JSONValue
from ropescale.interop.config_json import ProvenanceBlock

MODEL_TARGET = "ropescale.evals.lm_eval.model:RopescaleLM"

log = logging.getLogger(__name__)


def lm_eval_missing() -> MissingDependencyError:
    """The error raised when lm-eval is needed and not installed."""
    return MissingDependencyError("lm-eval is not installed: pip install 'lm-eval[ruler]' (or ropescale[eval])")


class ModelInfo(TypedDict):
    """What lm-eval records of the model (``get_model_info``): HFLM's keys without its Hub lookup, and
    the ropescale block of the model's config (None: unpatched)."""

    model_num_parameters: int
    model_dtype: str
    model_name: str
    max_length: int
    ropescale: ProvenanceBlock | None


class _DropReadyModelNotes(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return "model kwarg is not of type `str`" not in text and "already-initialized model" not in text


def _load(name: str, scaling: ScalingOptions, load: dict[str, JSONValue], dtype: Any, device: Any, tokenizer: Any):
    """Load and scale ``name`` with ropescale; the tokenizer too unless given as an object."""
    import ropescale

    if not name:
        raise ValueError(f"model_args for '{MODEL_NAME}' need pretrained=<model name or path>")
    model = ropescale.from_pretrained(name, **scaling, **load, dtype=parse_dtype(dtype))
    model.to(resolve_device(device))
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = ropescale.load_tokenizer(tokenizer or name)
    return model, tokenizer


def _origin(name: str, method: str | None, load: dict[str, JSONValue]) -> str:
    """How the scaling that will run relates to the one ``name`` was saved with (``evals/tasks/saved.py``):
    ``saved``, ``requested`` (an unscaled checkpoint), ``scaling removed`` or ``replaces saved yarn x4``."""
    if method is None:
        return "saved"
    from ropescale.evals.tasks.saved import REMOVED, carried
    from ropescale.models.loading import load_config
    from ropescale.patching.readback import scaling_label

    shared = {k: v for k, v in load.items() if k not in ("attn_implementation",)}
    before = carried(load_config(name, **shared))
    if before is None:
        return "requested"
    return REMOVED if method.lower() in ("none", "default") else f"replaces saved {scaling_label(before)}"


def _ready(pretrained: Any, scaling: ScalingOptions, tokenizer: Any):
    """A model already loaded (and scaled, if wanted) is used as it is, with its tokenizer."""
    import ropescale

    if not hasattr(pretrained, "config"):
        raise ValueError(
            f"pretrained must be a model name or path or a transformers model, got {type(pretrained).__name__}"
        )
    if any(scaling[k] for k in ("method", "factor", "method_params")) or "target_length" in scaling:
        raise ValueError("a ready model is used as it is: scale it first (ropescale.patch) or pass its name")
    if tokenizer is None:
        raise ValueError("a ready model needs its tokenizer: pass tokenizer=")
    if isinstance(tokenizer, str):
        tokenizer = ropescale.load_tokenizer(tokenizer)
    return pretrained, tokenizer


def _build_lm_class() -> type:
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError as exc:
        raise lm_eval_missing() from exc

    class RopescaleLM(HFLM):
        """lm-eval's HF model with the checkpoint loaded and RoPE-scaled by ropescale.

        ``RopescaleLM(pretrained="smollm2-135m", method="yarn", factor=4, max_length=32768)``, or
        ``RopescaleLM(pretrained=<a ready PreTrainedModel>, tokenizer=<its tokenizer>)`` for a model
        already patched (then no scaling arguments). See the module docstring for every argument.
        Prompts longer than ``max_length`` stop the run unless ``truncate_prompts=true``.
        """

        def __init__(
            self,
            pretrained: Any = "smollm2-135m",
            max_length: Any = None,
            dtype: Any = "auto",
            device: Any = None,
            tokenizer: Any = None,
            method_params: dict[str, JSONValue] | None = None,
            truncate_prompts: Any = False,
            **kwargs: Any,
        ) -> None:
            groups = split_model_args(kwargs)
            scaling = scaling_options(groups["scaling"], {**(method_params or {}), **groups["params"]})
            explicit_max_length = None if options.none_like(max_length) else options.length(max_length, "max_length")
            truncate = options.boolean(truncate_prompts, "truncate_prompts")
            if isinstance(pretrained, str):
                name = pretrained.strip()
                origin = _origin(name, scaling["method"], groups["load"])
                model, tokenizer = _load(name, scaling, groups["load"], dtype, device, tokenizer)
            else:
                model, tokenizer = _ready(pretrained, scaling, tokenizer)
                name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
                origin = "as given"
            default = default_max_length(model.config)
            max_length = explicit_max_length or default
            if max_length > default:
                log.warning(
                    "ropescale: max_length %d is beyond the model's %s context %d",
                    max_length,
                    "scaled" if getattr(model.config, "ropescale", None) else "trained",
                    default,
                )
            hf_log = logging.getLogger(HFLM.__module__)
            quiet = _DropReadyModelNotes()
            hf_log.addFilter(quiet)  # HFLM warns twice that it was given a model object: intended here
            try:
                super().__init__(pretrained=model, tokenizer=tokenizer, max_length=max_length, **groups["hflm"])
            finally:
                hf_log.removeFilter(quiet)
            self.pretrained = name
            self.ropescale_config = dict(getattr(model.config, "ropescale", None) or {})
            from ropescale.patching.readback import scaling_of

            #: what runs, read back from the loaded model, and how it relates to the saved scaling
            self.scaling = {**scaling_of(model), "as": origin}
            self.trained_context = trained_context(model.config)
            self.truncate_prompts = truncate

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            """HFLM's generation, after :mod:`ropescale.evals.lm_eval.checks` looked at every prompt."""
            ruler_note(self, requests, self.trained_context)
            if not self.truncate_prompts:
                check_generation(self, requests)
            return super().generate_until(requests, disable_tqdm=disable_tqdm)

        def _loglikelihood_tokens(self, requests: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
            if not self.truncate_prompts:
                check_loglikelihood(self, requests)
            return super()._loglikelihood_tokens(requests, *args, **kwargs)

        def get_model_info(self) -> ModelInfo:
            """HFLM's model info without its Hub lookup (offline-safe), plus the ropescale block."""
            model = self._model
            return ModelInfo(
                model_num_parameters=sum(p.numel() for p in model.parameters()),
                model_dtype=str(getattr(model, "dtype", "")),
                model_name=self.pretrained,
                max_length=self.max_length,
                ropescale=self.ropescale_config or None,
            )

    RopescaleLM.__module__ = MODEL_TARGET.partition(":")[0]
    RopescaleLM.__qualname__ = "RopescaleLM"
    return RopescaleLM


def __getattr__(name: str) -> Any:
    # The class is built on first use: importing lm-eval's HF model costs seconds, and the CLI
    # imports this package just to register its sub-command.
    if name == "RopescaleLM":
        cls = _build_lm_class()
        globals()["RopescaleLM"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_lm_eval_model() -> bool:
    """Register ``ropescale`` in lm-eval's model registry (lazily: the class loads on first use).

    Returns:
        False when lm-eval is not installed.
    """
    try:
        import lm_eval.models  # noqa: F401 - lm-eval's own models first (get_model skips them otherwise)
        from lm_eval.api.registry import model_registry
    except ImportError:
        return False
    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    return True
