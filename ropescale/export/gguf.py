"""Export a (patched) Llama, Mistral, Qwen2 or Qwen3 checkpoint to a GGUF file that llama.cpp runs with
the same RoPE scaling, no command-line flags needed.

    ropescale.export.export_gguf("smollm2-135m", "smollm2-yarn4.gguf", "f16", method="yarn", factor=4)

What is written follows llama.cpp's own converter (``convert_hf_to_gguf.py``, classes ``LlamaModel``,
``Qwen2Model``, ``Qwen3Model``): architecture ``llama`` (Mistral included: llama.cpp runs it as
Llama), ``qwen2`` or ``qwen3``; tensor names ``token_embd``, ``blk.N.attn_q/k/v/output`` (with
Qwen2's q/k/v biases), ``attn_q_norm``/``attn_k_norm`` (Qwen3), ``ffn_gate/up/down``, ``attn_norm``,
``ffn_norm``, ``output_norm``, ``output``; for ``llama`` only, q and k rows permuted from
transformers' rotate-half layout (pair i = dims i and i + d/2) to ggml's interleaved one (pair i =
dims 2i and 2i+1): qwen2/qwen3 rotate NeoX-style, as transformers does. 1-D tensors are always
fp32. What llama.cpp can carry is :func:`ropescale.interop.gguf_support.carry` (the answer
``ropescale doctor`` gives too); the rope metadata comes from :mod:`ropescale.export.gguf_rope`, the
tokenizer from :mod:`ropescale.export.gguf_vocab`. Everything that can be refused is refused before
the file is opened, and the file appears under its name only when complete (temporary file + rename).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import __version__
from .._io import _create_sibling
from ..errors import RopescaleError, UnsupportedModelError
from ..interop.engines import CANNOT
from ..interop.gguf_support import GGUF_ARCH, carry
from ..interop.verdict import intent_of
from ..methods import RotarySpec, ScalingMethod, get_method, method_class
from ..patching.model import patch_config
from ..patching.plan import _head_dim, original_geometry, plan_from_provenance
from .gguf_rope import GGUFMetadata, GGUFRope, NotExpressibleError, rope_for_gguf
from .gguf_vocab import vocab_metadata

U32_MAX = 2**32 - 1
DTYPES = ("f32", "f16", "q8_0")
#: model types export-gguf writes (as :data:`~ropescale.interop.gguf_support.GGUF_ARCH` maps them)
EXPORTABLE = tuple(GGUF_ARCH)
#: transformers rope_type → ropescale method, for checkpoints ropescale did not patch
NATIVE_ROPE_TYPES = {
    "default": "default",
    "linear": "linear",
    "dynamic": "dynamic_ntk",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
}
_LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",  # Qwen3's per-head RMSNorm of q and k
    "self_attn.k_norm": "attn_k_norm",
}
_GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def permute_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a q/k projection (or bias) head by head from rotate-half to interleaved pairs.

    Within each head of size d, output row 2j + k is input row k·d/2 + j (k ∈ {0, 1}): the same
    reshape(heads, 2, d/2) → swap → reshape as llama.cpp's ``LlamaModel.permute``.
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise RopescaleError(f"cannot permute {rows} rows into {n_heads} heads of rotary pairs")
    return weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensor_name(hf_name: str, arch: str = "llama") -> str | None:
    """GGUF name of a transformers Llama/Mistral/Qwen2/Qwen3 tensor; None for buffers that are not weights."""
    if hf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[hf_name]
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None
    parts = hf_name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        module, leaf = ".".join(parts[3:-1]), parts[-1]
        if module in _LAYER_TENSORS and leaf in ("weight", "bias"):
            return f"blk.{int(parts[2])}.{_LAYER_TENSORS[module]}.{leaf}"
    raise UnsupportedModelError(f"tensor '{hf_name}' has no GGUF name in the {arch} architecture")


def scaling_of(config: Any) -> tuple[ScalingMethod, RotarySpec, bool]:
    """(method, original geometry, kv_consistent) of a config: its provenance block if ropescale
    patched it, else its own ``rope_parameters`` (a plain or natively scaled HF checkpoint)."""
    plan = plan_from_provenance(config)
    if plan is not None:
        return plan.method, plan.spec, plan.kv_consistent
    rope = dict(getattr(config, "rope_parameters", None) or {})
    original, _, L = original_geometry(config)
    spec = RotarySpec(
        _head_dim(config), float(original["rope_theta"]), int(L), float(rope.get("partial_rotary_factor", 1.0))
    )
    rope_type = rope.get("rope_type", "default")
    if rope_type not in NATIVE_ROPE_TYPES:
        raise RopescaleError(f"rope_type '{rope_type}' in the model's config is not one ropescale can export")
    cls = method_class(NATIVE_ROPE_TYPES[rope_type])
    params = {k: v for k, v in rope.items() if k in cls.parameter_defaults() and v is not None}
    return get_method(cls.name, **params), spec, False


def check_exportable(config: Any) -> str:
    """The GGUF architecture of a config, or the one-line refusal ``ropescale doctor`` gives too.

    What llama.cpp can carry is :func:`ropescale.interop.gguf_support.carry` on the config as it would
    be saved: the architectures, attention windows and rope forms it refuses, export refuses.
    """
    data = json.loads(config.to_json_string(use_diff=False))
    answer = carry(data, intent_of(data))
    if answer.verdict == CANNOT:
        if answer.model_refusal:
            raise UnsupportedModelError(answer.why)
        raise NotExpressibleError(f"method '{answer.method}' cannot be exported to GGUF: {answer.why}")
    arch = str(answer.arch)
    context = int(config.max_position_embeddings)
    if context > U32_MAX:  # llama.cpp's context_length field is a uint32
        raise RopescaleError(
            f"max_position_embeddings = {context} does not fit GGUF's {arch}.context_length (uint32, at most "
            f"{U32_MAX}); use a smaller --factor"
        )
    return arch


def model_metadata(config: Any, rope: GGUFRope, name: str, file_type: int, arch: str = "llama") -> GGUFMetadata:
    """The ``general.*`` and ``<arch>.*`` keys of the file (rope included)."""
    head_dim = _head_dim(config)
    out: GGUFMetadata = {
        "general.type": "model",
        "general.name": name,
        "general.file_type": file_type,
        "general.quantization_version": 2,
        f"{arch}.vocab_size": int(config.vocab_size),
        f"{arch}.context_length": int(config.max_position_embeddings),
        f"{arch}.embedding_length": int(config.hidden_size),
        f"{arch}.feed_forward_length": int(config.intermediate_size),
        f"{arch}.block_count": int(config.num_hidden_layers),
        f"{arch}.attention.head_count": int(config.num_attention_heads),
        f"{arch}.attention.head_count_kv": int(
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        ),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
    }
    # as llama.cpp's converter: whenever the config names head_dim (Qwen3's differs from hidden / heads)
    if getattr(config, "head_dim", None) is not None or head_dim != config.hidden_size // config.num_attention_heads:
        out[f"{arch}.attention.key_length"] = head_dim
        out[f"{arch}.attention.value_length"] = head_dim
    out.update(rope.metadata(arch))
    return out


def _source_tensors(source: Any) -> Iterator[tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]]:
    """(name, shape, loader) of every tensor: a loaded model's state dict, or a directory's
    safetensors read one tensor at a time (a 7B model never sits in memory twice)."""
    if isinstance(source, torch.nn.Module):
        for name, tensor in source.state_dict().items():
            yield name, tuple(tensor.shape), (lambda t=tensor: t)
        return
    from safetensors import safe_open

    files = sorted(Path(source).glob("*.safetensors"))
    if not files:
        raise RopescaleError(f"'{source}' has no *.safetensors weights (save it with `ropescale patch --output`)")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        for name, shape in shapes.items():
            yield name, shape, (lambda file=file, name=name: _read_one(file, name))


def _read_one(file: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor(name)


def _ggml_type(shape: tuple[int, ...], dtype: str):
    """GGML type of one tensor: 1-D (norms, rope factors) fp32; matrices per ``dtype``, q8_0 only where a
    row is a multiple of its 32-value blocks (f16 otherwise, as llama.cpp's converter falls back)."""
    from gguf import GGMLQuantizationType as Q

    if len(shape) == 1 or dtype == "f32":
        return Q.F32
    if dtype == "q8_0" and shape[-1] % 32 == 0:
        return Q.Q8_0
    return Q.F16


def _encode(tensor: torch.Tensor, qtype) -> np.ndarray:
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    data = tensor.detach().to(torch.float32).cpu().numpy()
    if qtype == Q.F32:
        return np.ascontiguousarray(data)
    if qtype == Q.F16:
        return np.ascontiguousarray(data.astype(np.float16))
    return quantize(data, qtype)


def _plan_tensors(
    config: Any, source: Any, rope: GGUFRope, dtype: str, arch: str = "llama"
) -> list[tuple[str, Callable[[], torch.Tensor], Any, tuple[int, ...]]]:
    """(gguf name, encoder, ggml type, logical shape) for every tensor, in writing order."""
    interleaved = arch == "llama"  # ggml's "normal" rope; qwen2/qwen3 rotate NeoX-style, like transformers
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    tied = bool(getattr(config, "tie_word_embeddings", False))
    planned = []
    for hf_name, shape, load in _source_tensors(source):
        name = gguf_tensor_name(hf_name, arch)
        if name is None or (tied and name == "output.weight"):
            continue  # llama.cpp reuses token_embd when there is no output tensor

        def encoder(load=load, name=name):
            tensor = load()
            if not interleaved:
                return tensor
            if ".attn_q." in name:
                tensor = permute_rotary_rows(tensor, n_heads)
            elif ".attn_k." in name:
                tensor = permute_rotary_rows(tensor, n_kv)
            return tensor

        planned.append((name, encoder, _ggml_type(shape, dtype), shape))
    if not any(p[0] == "token_embd.weight" for p in planned):
        raise RopescaleError("the checkpoint has no model.embed_tokens.weight")
    for name, values in rope.tensors.items():
        planned.append(
            (f"{name}.weight", (lambda v=values: torch.from_numpy(v)), _ggml_type((1,), dtype), tuple(values.shape))
        )
    return planned


def _resolve(
    model: Any, tokenizer: Any, method: str | None, factor: Any, replace: bool, **params: Any
) -> tuple[Any, Any, Callable[[], Any], str]:
    """(config, weights source, tokenizer getter, display name) for a directory, embedded name or loaded model
    (``params``: the method's keyword arguments, passed on to :func:`ropescale.patch_config`)."""
    if isinstance(model, torch.nn.Module):
        if method is not None or factor is not None or params:
            raise ValueError("patch a loaded model with ropescale.patch before exporting it; method= is for paths")
        if tokenizer is None:
            raise ValueError("exporting a loaded model needs its tokenizer (tokenizer=...)")
        return model.config, model, (lambda: tokenizer), str(getattr(model.config, "_name_or_path", "") or "model")
    from ..models.loading import load_config, load_tokenizer, resolve_model

    resolved = resolve_model(model)
    if "gguf_file" in resolved.kwargs or not Path(resolved.path).is_dir():
        raise RopescaleError(f"'{model}' is not a local checkpoint directory or embedded model")
    config = load_config(model)
    if method is not None:
        window = params.pop("sliding_window", "keep")
        config = patch_config(config, method, factor, replace=replace, sliding_window=window, **params)
    elif factor is not None or params:
        raise ValueError("factor/method parameters given without a method")
    return config, resolved.path, (lambda: tokenizer or load_tokenizer(model)), Path(str(model)).name


def export_gguf(
    model: Any,
    path: str | os.PathLike,
    dtype: str = "f16",
    *,
    tokenizer: Any = None,
    method: str | None = None,
    factor: Any = None,
    replace: bool = False,
    pre_tokenizer: str | None = None,
    overwrite: bool = False,
    **params: Any,
) -> Path:
    """Write a Llama/Mistral/Qwen2/Qwen3 checkpoint with its RoPE scaling as one GGUF file.

    Args:
        model: a checkpoint directory (saved by ropescale or plain transformers), an embedded model
            name (``smollm2-135m``) or a loaded (patched) model.
        path: the ``.gguf`` file to write.
        dtype: ``f32``, ``f16`` or ``q8_0`` for the matrices (1-D tensors stay fp32).
        tokenizer: the tokenizer (required with a loaded model; default: the checkpoint's).
        method, factor, replace, **params: patch on the fly (a directory or name only), as
            :func:`ropescale.patch_config` (``sliding_window=None`` included).
        pre_tokenizer: llama.cpp pre-tokenizer name, if it cannot be read off the tokenizer.
        overwrite: replace an existing file.

    Returns:
        ``path``. Raises :class:`~ropescale.export.gguf_rope.NotExpressibleError` for scalings
        llama.cpp cannot run (:func:`ropescale.interop.gguf_support.carry`: what ``ropescale doctor``
        says), before anything is loaded or written.
    """
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = Path(path).expanduser()
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists (pass overwrite=True / --overwrite to replace it)")
    config, source, get_tokenizer, name = _resolve(model, tokenizer, method, factor, replace, **params)
    arch = check_exportable(config)
    rope = rope_for_gguf(*scaling_of(config))
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[dtype]
    metadata = model_metadata(config, rope, name, int(file_type), arch)
    metadata["ropescale.provenance"] = json.dumps(getattr(config, "ropescale", None) or {}, sort_keys=True)
    metadata["ropescale.version"] = __version__
    metadata.update(vocab_metadata(get_tokenizer(), int(config.vocab_size), pre_tokenizer))
    _write(path, metadata, _plan_tensors(config, source, rope, dtype, arch), arch)
    return path


def _write(path: Path, metadata: GGUFMetadata, planned: list, arch: str = "llama") -> None:
    """Header, metadata, tensor infos, then one tensor at a time into a sibling temp file; rename."""
    import gguf
    from gguf.quants import quant_shape_to_byte_shape

    Q = gguf.GGMLQuantizationType
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_sibling(path)
    os.close(fd)
    writer = gguf.GGUFWriter(tmp, arch)
    try:
        for key, value in metadata.items():
            _add_kv(writer, key, value)
        for name, _, qtype, shape in planned:
            if qtype in (Q.F32, Q.F16):
                np_dtype = np.float32 if qtype == Q.F32 else np.float16
                writer.add_tensor_info(
                    name, shape, np.dtype(np_dtype), int(np.prod(shape)) * np.dtype(np_dtype).itemsize, raw_dtype=qtype
                )
            else:  # quantized: described by its byte shape
                byte_shape = quant_shape_to_byte_shape(shape, qtype)
                writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, encode, qtype, _ in planned:
            writer.write_tensor_data(_encode(encode(), qtype))
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _add_kv(writer: Any, key: str, value: Any) -> None:
    import gguf

    T = gguf.GGUFValueType
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], int) and not isinstance(value[0], bool):
        writer.add_key_value(key, value, T.ARRAY, sub_type=T.INT32)  # token types are int32 in llama.cpp
    elif isinstance(value, list) and value and isinstance(value[0], float):
        writer.add_key_value(key, value, T.ARRAY, sub_type=T.FLOAT32)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise TypeError(f"no GGUF type for metadata {key}={value!r}")
