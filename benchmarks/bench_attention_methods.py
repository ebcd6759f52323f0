"""Prefill and decode speed of the attention-level methods against YaRN, in one run.

Methods (each a patch of the same weights, SDPA, fp32 by default):
  * yarn                — frequencies only: the model's own SDPA kernel (the speed to match)
  * self_extend         — ropescale.attention.self_extend: log-sum-exp-merged region calls
  * self_extend_legacy  — the previous implementation (one SDPA call per 1024-query block over a
                          doubled head dimension), kept here only for the comparison
  * dca                 — ropescale.attention.dca: intra / successive / inter-chunk calls, merged
  * string              — ropescale.attention.string with YaRN frequencies (its plain-RoPE reach is
                          L + shift, short of 4x)
  * <method>_rotating   — the method without its rotated keys kept beside the cache
                          (``rotated_keys = False``): every decoding step rotates the whole cache
  * <method>_logn       — the method with ``logn=true`` (queries past L scaled by ln(p + 1) / ln(L))
For every length: one prefill of ``n`` random tokens with the cache (tokens/s = n / time), then
``--decode`` single-token steps on that cache (tokens/s = steps / time). Methods alternate within
each repeat so load from other jobs hits them alike; the best of ``--repeats`` is kept. Ratios are
against YaRN at the same length. ``--layers K`` keeps the first K decoder layers (every layer costs
the same, so ratios hold; absolute tokens/s are then K/num_layers of a full pass's cost, roughly).

``--attention-only`` times one layer's attention function alone on random q/k/v of the model's
shape (YaRN: rotating q and k, then the model's SDPA; decoding: SDPA of one query over a cache of
rotated keys; the methods decode over a one-layer DynamicCache, vouched for by the decoder's
pre-hook at every step), which isolates what the methods change from the MLPs and projections they
share.

    python benchmarks/bench_attention_methods.py --lengths 4096 8192 16384 --layers 6 --decode 8
    python benchmarks/bench_attention_methods.py --model random-1b --lengths 4096 --layers 2
    python benchmarks/bench_attention_methods.py --attention-only --lengths 4096 8192 16384 32768
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

import ropescale
from ropescale.models.loading import from_pretrained

LEGACY = "ropescale_self_extend_legacy"
QUERY_BLOCK = 1024


def legacy_self_extend_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The previous Self-Extend kernel: per 1024-query block, one SDPA call over a doubled head
    dimension ([q_near, q_grouped] · [k_near, 0] / [0, k_grouped]) with a boolean mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ropescale.attention.rotate_on_read import at, key_positions, rotary_of, rotate
    from ropescale.methods.self_extend import grouped_positions

    rotary = rotary_of(module)
    G, W = rotary.group_size, rotary.window
    position_ids = kwargs.pop("position_ids")
    q_len, kv_len, head_dim = query.shape[2], key.shape[2], query.shape[-1]
    k_pos = key_positions(position_ids, kv_len)
    k_pos = torch.arange(kv_len, device=query.device)[None] if k_pos is None else k_pos
    q_group, k_group = grouped_positions(position_ids, k_pos, G, W)
    cos, sin = rotary.table(max(kv_len, int(position_ids.max()) + 1, W + 1), query.dtype, query.device)
    query = torch.cat(
        (
            rotate(query, at(cos, position_ids, q_len), at(sin, position_ids, q_len)),
            rotate(query, at(cos, q_group, q_len), at(sin, q_group, q_len)),
        ),
        dim=-1,
    )
    zeros = torch.zeros_like(key)
    near = torch.cat((rotate(key, at(cos, k_pos, kv_len), at(sin, k_pos, kv_len)), zeros), dim=-1)
    far = torch.cat((zeros, rotate(key, at(cos, k_group, kv_len), at(sin, k_group, kv_len))), dim=-1)
    value = torch.cat((value, torch.zeros_like(value)), dim=-1)
    outputs = []
    for r0 in range(0, q_len, QUERY_BLOCK):
        r1 = min(q_len, r0 + QUERY_BLOCK)
        t = torch.arange(kv_len - q_len + r0, kv_len - q_len + r1, device=query.device)
        far_end, near_start, near_end = max(0, int(t[-1]) - W + 1), max(0, int(t[0]) - W + 1), int(t[-1]) + 1
        keys = torch.cat((far[:, :, :far_end], near[:, :, near_start:near_end]), dim=2)
        values = torch.cat((value[:, :, :far_end], value[:, :, near_start:near_end]), dim=2)
        mask = None
        if r1 - r0 > 1 or attention_mask is not None:
            j_far, j_near = torch.arange(far_end), torch.arange(near_start, near_end)
            distance_near = t[:, None] - j_near[None, :]
            mask = torch.cat((t[:, None] - j_far[None, :] >= W, (distance_near >= 0) & (distance_near < W)), dim=1)
            mask = mask[None, None]
            if attention_mask is not None:
                rows = attention_mask[:, :, r0:r1] if attention_mask.shape[2] > 1 else attention_mask
                mask = mask & torch.cat((rows[..., :far_end], rows[..., near_start:near_end]), dim=-1)
        out, _ = sdpa_attention_forward(
            module, query[:, :, r0:r1], keys, values, mask, dropout=dropout, scaling=scaling, is_causal=False, **kwargs
        )
        outputs.append(out[..., :head_dim])
    return torch.cat(outputs, dim=1).contiguous(), None


def load(name: str, layers: int | None):
    if name == "random-1b":  # a Llama-3.2-1B-like shape with random weights (no download)
        import transformers

        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, attn_implementation="sdpa",
        )  # fmt: skip
        if layers:
            config.num_hidden_layers = layers
        return transformers.LlamaForCausalLM(config).eval()
    model = from_pretrained(name, dtype=torch.float32, attn_implementation="sdpa").eval()
    if layers:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    return model


def patch(model, method: str, factor: float) -> None:
    if method == "self_extend_legacy":
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(LEGACY, legacy_self_extend_attention)
        AttentionMaskInterface.register(LEGACY, sdpa_mask)
        ropescale.patch(model, "self_extend", factor=factor, replace=True)
        model.set_attn_implementation(LEGACY)
        model.model.rotary_emb.attention_name = LEGACY
        return
    base, rotating, logn = variant(method)
    extra = {"frequencies": "yarn"} if base == "string" else {}  # plain RoPE reaches only L + shift
    if logn:
        extra["logn"] = True
    ropescale.patch(model, base, factor=factor, replace=True, **extra)
    if rotating:
        model.model.rotary_emb.rotated_keys = False


def variant(method: str) -> tuple[str, bool, bool]:
    """``(base method, without rotated keys, with logn)`` of a name like ``self_extend_logn_rotating``."""
    rotating = method.endswith("_rotating")
    method = method.removesuffix("_rotating")
    logn = method.endswith("_logn")
    return method.removesuffix("_logn"), rotating, logn


@torch.inference_mode()
def measure(model, ids: torch.Tensor, decode: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) for one prefill of ``ids`` and ``decode`` steps."""
    from transformers import DynamicCache

    start = time.perf_counter()  # a cache passed in, as generate() does (the methods keep rotated keys beside it)
    out = model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1)
    prefill = time.perf_counter() - start
    cache, step_ids = out.past_key_values, ids[:, -1:]
    cache = model(step_ids, past_key_values=cache, use_cache=True).past_key_values  # warm-up, untimed
    start = time.perf_counter()
    for _ in range(decode):
        cache = model(step_ids, past_key_values=cache, use_cache=True).past_key_values
    return ids.shape[1] / prefill, decode / max(time.perf_counter() - start, 1e-9)


def attention_functions(model, methods: list[str], factor: float, n: int):
    """method -> (prefill(), decode()) closures over random q/k/v of one layer of ``model`` at length n."""
    from types import SimpleNamespace

    from transformers import DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ropescale.attention import dca, self_extend, string
    from ropescale.attention.rotate_on_read import LAYER_ATTR, rotate
    from ropescale.attention.rotated_cache import observe

    c = model.config
    h, h_kv = c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // h
    q, k, v = torch.randn(1, h, n, d), torch.randn(1, h_kv, n, d), torch.randn(1, h_kv, n, d)
    pos, last = torch.arange(n)[None], torch.tensor([[n - 1]])
    kernels = {"self_extend": self_extend.self_extend_attention, "self_extend_legacy": legacy_self_extend_attention,
               "dca": dca.dca_attention, "string": string.string_attention}  # fmt: skip
    out = {}
    for method in methods:
        patch(model, method, factor)
        rotary = model.model.rotary_emb
        layer = SimpleNamespace(layer_idx=0, num_key_value_groups=h // h_kv, is_causal=True, training=False)
        layer.__dict__[LAYER_ATTR] = rotary
        scale = d**-0.5
        if variant(method)[0] in kernels:
            fn = kernels[variant(method)[0]]
            cache = DynamicCache()  # decoding reads a real cache layer, as in a model
            cache.update(k, v, 0)

            def step(fn=fn, layer=layer, rotary=rotary, cache=cache):
                observe(rotary, cache)  # the decoder's pre-hook: vouches for the rotated keys kept beside it
                keys, values = cache.layers[0].keys, cache.layers[0].values
                return fn(layer, q[:, :, -1:], keys, values, None, scale, position_ids=last)

            out[method] = (lambda fn=fn, layer=layer: fn(layer, q, k, v, None, scale, position_ids=pos), step)
            continue
        cos, sin = (t[None, None, :n] for t in rotary_table(rotary, n))
        k_rot = rotate(k, cos, sin)

        def prefill(layer=layer, cos=cos, sin=sin):
            qr, kr = rotate(q, cos, sin), rotate(k, cos, sin)
            return sdpa_attention_forward(layer, qr, kr, v, None, scaling=scale)

        def decode(layer=layer, k_rot=k_rot, cos=cos, sin=sin):
            qr = rotate(q[:, :, -1:], cos[:, :, -1:], sin[:, :, -1:])
            return sdpa_attention_forward(layer, qr, k_rot, v, None, scaling=scale)

        out[method] = (prefill, decode)
    return out


def rotary_table(rotary, n: int):
    """cos and signed sin of positions 0..n−1 for a rotary module that rotates in the layers."""
    from ropescale.rotary_reference import cos_sin

    cos, sin = cos_sin(rotary.inv_freq, torch.arange(n), rotary.attention_scaling)
    half = cos.shape[-1] // 2
    return cos, torch.cat((-sin[:, :half], sin[:, half:]), -1)


@torch.inference_mode()
def measure_attention(fns, n: int, decode: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) of one layer's attention function."""
    prefill, step = fns
    start = time.perf_counter()
    prefill()
    elapsed = time.perf_counter() - start
    step()  # warm-up, untimed (the first call at a new shape is slow)
    start = time.perf_counter()
    for _ in range(decode):
        step()
    return n / elapsed, decode / max(time.perf_counter() - start, 1e-9)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a model name/path, or random-1b")
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--methods", default="yarn,self_extend,self_extend_legacy,dca")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--decode", type=int, default=8, help="decoding steps per measurement")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="keep only the first K decoder layers")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--attention-only", action="store_true", help="time one layer's attention function alone")
    p.add_argument("--output", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    model = load(args.model, args.layers)
    torch.manual_seed(0)
    layers = "one layer's attention" if args.attention_only else f"{model.config.num_hidden_layers} layers"
    results: dict[str, Any] = {"model": args.model, "layers": layers, "rows": []}
    print(f"model {args.model}, {layers}, fp32, {torch.get_num_threads()} threads")
    print(f"{'length':>7} {'method':<20} {'prefill tok/s':>14} {'vs yarn':>8} {'decode tok/s':>13} {'vs yarn':>8}")
    for n in args.lengths:
        ids = torch.randint(1, model.config.vocab_size, (1, n))
        fns = attention_functions(model, methods, args.factor, n) if args.attention_only else None
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):
            for method in methods:
                if fns is not None:
                    pre, dec = measure_attention(fns[method], n, args.decode)
                else:
                    patch(model, method, args.factor)
                    pre, dec = measure(model, ids, args.decode)
                old = best.get(method, (0.0, 0.0))
                best[method] = (max(old[0], pre), max(old[1], dec))
        base = best.get("yarn")
        for method in methods:
            pre, dec = best[method]
            ratio = (base[0] / pre, base[1] / dec) if base else (float("nan"), float("nan"))
            results["rows"].append(
                {"length": n, "method": method, "prefill_tok_s": pre, "decode_tok_s": dec,
                 "prefill_time_vs_yarn": ratio[0], "decode_time_vs_yarn": ratio[1]}
            )  # fmt: skip
            print(f"{n:>7} {method:<20} {pre:>14.1f} {ratio[0]:>7.2f}x {dec:>13.2f} {ratio[1]:>7.2f}x")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
