"""Run one serving engine's own config parsing and rope code on ropescale checkpoints (a subprocess).

``python run_engine.py ENGINE OUT CHECKPOINT...`` with the engine's --target folder (``make engines``)
first on PYTHONPATH (and, for vLLM 0.11, transformers 4.57 after it). For each checkpoint it reads
config.json with the engine's own reader, builds the rotary embedding with the engine's ``get_rope``
and the arguments its ``LlamaAttention`` passes (those few lines are mirrored below, with the file
they come from), applies it with ``forward_native`` to unit vectors at positions ``0..n-1`` for each
prefill length n (so the output is exactly the engine's cos and sin, attention factor included) and
asks the engine for its default context length. ``torch.save`` s the results to OUT.

Only these are stubbed (:data:`STUBS`), none on the config or rope path:
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import torch

STUBS = {
    "vllm.model_executor (package __init__)": "imports the tensor-parallel parameter classes (parallel layers)",
    "vllm.model_executor.layers (package __init__)": "same: the parallel layers",
    "vllm.model_executor.custom_op.CustomOp": "kernel dispatch: forward() calls forward_native()",
    "vllm.platforms.current_platform": "platform detection: vLLM's own CpuPlatform",
    "vllm.config (package __init__, vLLM >= 0.20)": "imports every engine config; get_current_vllm_config() returns "
    "the max_model_len vLLM's own _get_and_verify_max_len derived (no --max-model-len)",
    "torch.device in vllm ... dual_chunk_rope": "platform: DualChunkRotaryEmbedding's caches on the CPU, not cuda:N",
    "vllm._aiter_ops (vLLM >= 0.20)": "ROCm AITER kernels (imports the attention backends): not enabled",
    "vllm._custom_ops (sglang)": "the CPU rope kernel SGLang binds at construction (forward_native does not use it)",
    "triton (sglang)": "GPU kernel compiler: decorators become no-ops (torch is told first there is none)",
    "IPython.display, torchvision (sglang)": "notebook display and image transforms of multimodal configs",
}
__doc__ += "".join(f"\n* {k}: {v}" for k, v in STUBS.items())


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _hollow(name: str) -> None:
    """The package without its ``__init__`` (its submodules still load from the engine's files)."""
    spec = importlib.util.find_spec(name)
    _module(name).__path__ = list(spec.submodule_search_locations)


class _CpuTorch:
    """torch for DualChunkRotaryEmbedding, which puts its caches on the current CUDA device."""

    cuda = types.SimpleNamespace(current_device=lambda: 0)
    accelerator = types.SimpleNamespace(current_device_index=lambda: 0)

    @staticmethod
    def device(*args, **kwargs):
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(torch, name)


class _Placeholder(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else (lambda f: f)


CURRENT = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=None))


def _type_hint(name: str) -> type:
    if name.startswith("_"):
        raise AttributeError(name)
    return type(name, (), {})  # names vllm.config exports, used in type hints on the rope path


def stub_vllm() -> None:
    class CustomOp(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

        @classmethod
        def register(cls, name):
            return lambda c: c

        def forward(self, *args, **kwargs):
            return self.forward_native(*args, **kwargs)

        def enabled(self) -> bool:  # the custom (CUDA) kernel
            return False

    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = platforms.current_platform = CpuPlatform()
    _hollow("vllm.model_executor")
    _hollow("vllm.model_executor.layers")
    _module("vllm.model_executor.custom_op", CustomOp=CustomOp, PluggableLayer=CustomOp)
    if importlib.util.find_spec("vllm.transformers_utils.model_arch_config_convertor") is not None:
        _hollow("vllm.config")
        sys.modules["vllm.config"].__getattr__ = _type_hint
        sys.modules["vllm.config"].get_current_vllm_config = lambda: CURRENT
        _module("vllm._aiter_ops", rocm_aiter_ops=types.SimpleNamespace(is_triton_rotary_embed_enabled=lambda: False))


def stub_sglang() -> None:
    import torch._inductor.compile_fx  # noqa: F401 - torch decides "no triton" before the placeholder
    import torch.utils._triton
    import transformers.utils.import_utils as import_utils

    import_utils.is_torchvision_available()
    torch.utils._triton.has_triton_package()
    for name in ("triton", "triton.language", "triton.runtime", "triton.runtime.jit", "IPython", "IPython.display"):
        sys.modules[name] = _Placeholder(name)
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional", "torchvision.io"):
        sys.modules[name] = _Placeholder(name)
    sys.modules["triton"].__path__ = []
    _module("vllm")
    _module("vllm._custom_ops", rotary_embedding=None)


def _function_from_source(path: Path, name: str, namespace: dict):
    """One function of an engine module, compiled from its own source (the module imports the world)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    code = "from __future__ import annotations\n" + ast.get_source_segment(path.read_text(), node)
    exec(compile(code, str(path), "exec"), namespace)  # noqa: S102 - the engine's own code
    return namespace[name]


def vllm_build(directory: str):
    import vllm
    from vllm.transformers_utils import config as vconfig

    config = vconfig.get_config(directory, trust_remote_code=False)
    head_dim = config.hidden_size // config.num_attention_heads
    max_position = getattr(config, "max_position_embeddings", 8192)
    root = Path(vllm.__file__).parent
    namespace = {
        "logger": logging.getLogger("vllm"),
        "current_platform": sys.modules["vllm.platforms"].current_platform,
    }
    import vllm.envs as envs

    namespace["envs"] = envs
    from vllm.model_executor.layers.rotary_embedding import dual_chunk_rope, get_rope

    dual_chunk_rope.torch = _CpuTorch()

    verify = _function_from_source(root / "config" / "model.py", "_get_and_verify_max_len", namespace)
    if hasattr(vconfig, "iter_rope_parameters"):  # vLLM >= 0.20: models/llama.py LlamaAttention._init_rotary_emb
        from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

        namespace["iter_rope_parameters"] = vconfig.iter_rope_parameters
        arch = types.SimpleNamespace(
            derived_max_model_len_and_key=ModelArchConfigConvertorBase(config, config).derive_max_model_len_and_key()
        )
        context = verify(config, arch, None, None, False, None)
        CURRENT.model_config.max_model_len = context
        rope = getattr(config, "rope_parameters", None)
        dca = getattr(config, "dual_chunk_attention_config", None)  # models/qwen2.py Qwen2Attention
        emb = get_rope(
            head_dim,
            max_position=max_position,
            rope_parameters=rope,
            is_neox_style=True,
            dual_chunk_attention_config=dca,
        )
    else:  # vLLM 0.11 models/llama.py LlamaAttention.__init__ / LlamaDecoderLayer.__init__
        rope = getattr(config, "rope_scaling", None)
        if rope is not None and getattr(config, "original_max_position_embeddings", None):
            rope["original_max_position_embeddings"] = config.original_max_position_embeddings
        base = getattr(config, "rope_theta", 10000)
        dca = getattr(config, "dual_chunk_attention_config", None)  # models/qwen2.py Qwen2Attention
        emb = get_rope(
            head_dim,
            rotary_dim=head_dim,
            max_position=max_position,
            base=base,
            rope_scaling=rope,
            dual_chunk_attention_config=dca,
        )
        rope = {**(rope or {}), "rope_theta": base}
        context = verify(config, None, None, False, None)
    return emb, rope, int(context)


def sglang_build(directory: str):
    from sglang.srt.layers.rotary_embedding import get_rope
    from sglang.srt.utils.hf_transformers_utils import get_config, get_context_length

    config = get_config(directory, trust_remote_code=False)
    head_dim = config.hidden_size // config.num_attention_heads
    # models/llama.py LlamaDecoderLayer.__init__
    rope_parameters = getattr(config, "rope_parameters", None)
    if rope_parameters is not None:
        rope_theta, rope_scaling = rope_parameters.get("rope_theta", 10000), rope_parameters
    else:
        rope_theta, rope_scaling = getattr(config, "rope_theta", 10000), getattr(config, "rope_scaling", None)
    if rope_scaling is not None and getattr(config, "original_max_position_embeddings", None):
        rope_scaling["original_max_position_embeddings"] = config.original_max_position_embeddings
    max_position = getattr(config, "max_position_embeddings", 8192)
    emb = get_rope(head_dim, rotary_dim=head_dim, max_position=max_position, base=rope_theta, rope_scaling=rope_scaling)
    return emb, {**(rope_scaling or {}), "rope_theta": rope_theta}, get_context_length(config)


def dual_chunk(emb, head_dim: int, n: int) -> dict:
    """DualChunkRotaryEmbedding: its sizes, the key rows and the five query rows [n, 5 * head_dim]."""
    half = head_dim // 2
    x = torch.cat([torch.ones(n, half), torch.zeros(n, half)], dim=-1)
    query, key = emb.forward_native(torch.arange(n), x.clone(), x.clone())
    return {"chunk_size": emb.chunk_size, "local_size": emb.local_size, "query": query.reshape(n, -1), "key": key}


def tables(emb, head_dim: int, lengths: list[int]) -> dict:
    """cos and sin [n, head_dim/2] for a prefill of n tokens (neox: x = [1..1, 0..0] -> [cos, sin])."""
    out = {}
    half = head_dim // 2
    for n in lengths:
        q = torch.cat([torch.ones(n, half), torch.zeros(n, half)], dim=-1)
        try:
            forward = getattr(emb, "forward_native", None) or emb.forward
            rotated, _ = forward(torch.arange(n), q.clone(), q.clone())
            out[n] = (rotated[:, :half].float(), rotated[:, half:].float())
        except Exception as exc:  # noqa: BLE001 - what the engine does is the result
            out[n] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return out


def main(engine: str, out: str, lengths: str, *directories: str) -> None:
    torch.set_default_dtype(torch.float32)
    (stub_vllm if engine == "vllm" else stub_sglang)()
    build = vllm_build if engine == "vllm" else sglang_build
    results = {}
    for directory in directories:
        config = json.loads((Path(directory) / "config.json").read_text())
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        try:
            emb, rope, context = build(directory)
        except Exception as exc:  # noqa: BLE001
            results[directory] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if config.get("dual_chunk_attention_config"):
            results[directory] = {
                "class": type(emb).__name__,
                "dca": dual_chunk(emb, head_dim, int(lengths.split(",")[-1])),
            }
            continue
        results[directory] = {
            "class": type(emb).__name__,
            "read": json.loads(json.dumps(rope, default=str)),
            "context": context,
            "tables": tables(emb, head_dim, [int(n) for n in lengths.split(",")]),
        }
    torch.save(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
