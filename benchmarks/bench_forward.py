"""Forward-pass time of ropescale-patched models against native transformers, in one process.

For each method, two models with the same weights run the same input alternately:
  * ropescale: ``ropescale.patch(model, method, factor)``
  * native:    transformers built directly from the equivalent ``rope_parameters``
               (dynamic_yarn has no native form: it is compared with native YaRN at s = ℓ/L,
               which computes the same frequencies)
and the ratio of median times is printed (expect ~1.0).

    python benchmarks/bench_forward.py [--model smollm2-135m] [--length 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import ropescale
from ropescale.models.loading import from_pretrained


def native_rope(method: str, factor: float, base: float, L: int, length: int) -> tuple[dict, int]:
    if method == "linear":
        return {"rope_type": "linear", "rope_theta": base, "factor": factor}, int(factor * L)
    if method == "dynamic_ntk":
        return {"rope_type": "dynamic", "rope_theta": base, "factor": factor}, L
    if method == "yarn":
        return {"rope_type": "yarn", "rope_theta": base, "factor": factor, "original_max_position_embeddings": L}, int(
            factor * L
        )
    if method == "dynamic_yarn":
        s = max(1.0, length / L)
        return {"rope_type": "yarn", "rope_theta": base, "factor": s, "original_max_position_embeddings": L}, length
    raise ValueError(method)


def timed(model, ids) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        model(ids, use_cache=False, logits_to_keep=1)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", default="linear,dynamic_ntk,yarn,dynamic_yarn")
    args = ap.parse_args()
    torch.manual_seed(0)
    base_model = from_pretrained(args.model, attn_implementation="sdpa")
    config = base_model.config
    L, base = config.max_position_embeddings, config.rope_parameters["rope_theta"]
    length = args.length
    ids = torch.randint(0, config.vocab_size, (1, length))
    print(
        f"model {args.model}, {length} tokens, factor {args.factor:g}, {args.repeats} repeats, "
        f"{torch.get_num_threads()} threads, fp32, SDPA"
    )
    print(f"{'method':<14} {'ropescale s':>12} {'native s':>10} {'ratio':>7}  max |logit diff|")
    for method in args.methods.split(","):
        patched = ropescale.patch(copy.deepcopy(base_model), method, factor=args.factor)
        native_config = copy.deepcopy(config)
        native_config.rope_parameters, native_config.max_position_embeddings = native_rope(
            method, args.factor, base, L, length
        )
        native = type(base_model)(native_config).eval()
        native.load_state_dict(base_model.state_dict())
        with torch.inference_mode():
            diff = (
                (patched(ids[:, :512]).logits - native(ids[:, :512]).logits).abs().max().item()
                if method != "dynamic_yarn"
                else (patched(ids).logits[:, -8:] - native(ids).logits[:, -8:]).abs().max().item()
            )
        timed(patched, ids), timed(native, ids)  # warm-up
        ours, theirs = [], []
        for _ in range(args.repeats):  # alternate so drift hits both equally
            ours.append(timed(patched, ids))
            theirs.append(timed(native, ids))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{method:<14} {a:>12.3f} {b:>10.3f} {a / b:>7.3f}  {diff:.2e}")
        del patched, native


if __name__ == "__main__":
    main()
