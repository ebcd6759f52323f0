"""Cost and effect of KV-cache-consistent dynamic scaling, consistent vs transformers' default, in one run.

For each dynamic method, one model (SDPA, fp32) is patched twice over the same weights:
  * consistent: ``ropescale.patch(model, method, factor)`` (default: the cache keeps keys before
    rotation and every step rotates all of them with the current frequencies)
  * default:    ``kv_consistent=False`` (transformers' behaviour: each key rotated once, on entry)
Both prefill the same ``--prefix`` tokens of real text, then decode ``--new`` tokens with the KV
cache, teacher-forced on the text so both do identical work; decoding alternates between the two
in chunks so that load from other jobs hits both alike. Printed side by side: decode tokens/s and
their ratio, prefill time, and how far the last step's logits are from a full forward pass over
the same prefix + new tokens (max |Δ logit|, and whether the argmax agrees).

``--timing-only`` skips both long passes: the cache is filled with random keys/values of the
prefix length (decode time depends on the cache size, not on what it holds), so many more steps
fit in the same time; logits are then meaningless and not compared.

    python benchmarks/bench_kv_consistency.py [--prefix 9216] [--new 64] [--methods dynamic_ntk]
    python benchmarks/bench_kv_consistency.py --timing-only --new 128 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import ropescale
from ropescale.models.loading import from_pretrained, load_tokenizer


def text_ids(model_name: str, n: int, data: str) -> torch.Tensor:
    """``n`` tokens of the corpus (random ids if it is not installed). # [1, n]"""
    tokenizer = load_tokenizer(model_name)
    try:
        from ropescale.data.documents import load_documents

        text = "\n\n".join(t for _, t in load_documents(data))
        ids = tokenizer(text[: 8 * n], add_special_tokens=False)["input_ids"][: n - 1]
        ids = [tokenizer.bos_token_id or 0] + ids
        if len(ids) == n:
            return torch.tensor([ids])
    except Exception as exc:  # noqa: BLE001 - a benchmark still runs without the corpus
        print(f"(corpus '{data}' unavailable: {exc}; using random tokens)")
    return torch.randint(0, tokenizer.vocab_size, (1, n))


def random_cache(model, n: int):
    """A DynamicCache holding ``n`` random keys/values per layer (timing only)."""
    from transformers import DynamicCache

    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cache = DynamicCache(config=c)
    for layer in range(c.num_hidden_layers):
        cache.update(
            torch.randn(1, c.num_key_value_heads, n, head_dim),
            torch.randn(1, c.num_key_value_heads, n, head_dim),
            layer,
        )  # [b, h_kv, n, hd]
    return cache


class Decoder:
    """A prefilled model that decodes given tokens one at a time with its cache."""

    def __init__(self, model, ids: torch.Tensor, prefix: int, synthetic: bool = False):
        self.model, self.ids, self.n = model, ids, prefix
        start = time.perf_counter()
        if synthetic:
            self.cache, self.logits = random_cache(model, prefix), None
        else:
            with torch.inference_mode():
                out = model(ids[:, :prefix], use_cache=True, logits_to_keep=1)
            self.cache, self.logits = out.past_key_values, out.logits[:, -1]
        self.prefill_s = time.perf_counter() - start
        self.step_s: list[float] = []

    def step(self, k: int) -> None:
        for _ in range(k):
            start = time.perf_counter()
            with torch.inference_mode():
                out = self.model(self.ids[:, self.n : self.n + 1], past_key_values=self.cache, use_cache=True)
            self.step_s.append(time.perf_counter() - start)
            self.cache, self.logits, self.n = out.past_key_values, out.logits[:, -1], self.n + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prefix", type=int, default=9216, help="prompt tokens before decoding (> the trained context)")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded with the cache")
    ap.add_argument("--chunk", type=int, default=8, help="decode steps per turn when alternating the two modes")
    ap.add_argument("--factor", type=float, default=4.0)
    ap.add_argument("--methods", default="dynamic_ntk")
    ap.add_argument("--data", default="austen")
    ap.add_argument("--no-full", action="store_true", help="skip the full-forward comparison (one more long pass)")
    ap.add_argument("--timing-only", action="store_true", help="random cache instead of prefill; no comparison")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = from_pretrained(args.model, attn_implementation="sdpa")
    ids = text_ids(args.model, args.prefix + args.new, args.data)
    if args.timing_only:
        args.no_full = True
    L = model.config.max_position_embeddings
    print(
        f"model {args.model} (L={L}), prefix {args.prefix}, {args.new} new tokens, factor {args.factor:g}, "
        f"{torch.get_num_threads()} threads, fp32, SDPA" + (", random cache (timing only)" if args.timing_only else "")
    )
    header = (
        f"{'method':<13} {'mode':<11} {'prefill s':>9} {'decode tok/s':>12} {'median ms/tok':>13} "
        f"{'max|Δlogit| vs full':>19} {'argmax':>6}"
    )
    rows = []
    for method in args.methods.split(","):
        decoders = {}
        for mode, consistent in (("consistent", True), ("default", False)):
            ropescale.patch(model, method, factor=args.factor, replace=True, kv_consistent=consistent)
            decoders[mode] = Decoder(model, ids, args.prefix, synthetic=args.timing_only)
        done = 0
        while done < args.new:  # alternate, re-patching the shared weights for each turn
            k = min(args.chunk, args.new - done)
            for mode, decoder in decoders.items():
                ropescale.patch(model, method, factor=args.factor, replace=True, kv_consistent=mode == "consistent")
                decoder.step(k)
            done += k
        full = None
        if not (args.no_full or args.timing_only):  # consistent and default are the same model without a cache
            with torch.inference_mode():
                full = model(ids[:, : args.prefix + args.new], use_cache=False, logits_to_keep=1).logits[:, -1]
        for mode, d in decoders.items():
            diff = f"{(d.logits - full).abs().max().item():.3e}" if full is not None else "-"
            agree = str(bool(d.logits.argmax() == full.argmax())) if full is not None else "-"
            rows.append(
                (
                    method,
                    mode,
                    d.prefill_s,
                    len(d.step_s) / sum(d.step_s),
                    1000 * statistics.median(d.step_s),
                    diff,
                    agree,
                )
            )
        a, b = rows[-2][3], rows[-1][3]
        rows.append((method, "ratio", None, a / b, None, "", ""))
    print(header)
    for method, mode, prefill, tps, ms, diff, agree in rows:
        if mode == "ratio":
            print(f"{method:<13} {'cons/def':<11} {'':>9} {tps:>12.3f} {'':>13}")
            continue
        prefill = float("nan") if args.timing_only else prefill
        print(f"{method:<13} {mode:<11} {prefill:>9.1f} {tps:>12.2f} {ms:>13.1f} {diff:>19} {agree:>6}")


if __name__ == "__main__":
    main()
