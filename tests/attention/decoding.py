"""Helpers shared by the attention-mode tests: teacher-forced cached decoding vs recomputation."""

from __future__ import annotations

import torch


def cached_vs_full(model, ids: torch.Tensor, prompt: int, attention_mask: torch.Tensor | None = None):
    """Decode ``ids[:, prompt:]`` one token at a time with the KV cache (teacher forcing) and
    return, per step, the next-token logits from the cache and from a fresh full forward pass over
    the same prefix. # lists of [b, vocab]

    Each step's full pass runs *after* the cached step, so a module whose state depends on the
    order of calls (transformers' growth-only dynamic cache) would show up as a difference.
    """
    cached, full = [], []
    mask = attention_mask
    with torch.no_grad():
        out = model(ids[:, :prompt], attention_mask=None if mask is None else mask[:, :prompt], use_cache=True)
        cache = out.past_key_values
        cached.append(out.logits[:, -1])
        full.append(cached[-1])
        for n in range(prompt + 1, ids.shape[1] + 1):
            step_mask = None if mask is None else mask[:, :n]
            out = model(ids[:, n - 1 : n], attention_mask=step_mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            cached.append(out.logits[:, -1])
            full.append(model(ids[:, :n], attention_mask=step_mask, use_cache=False).logits[:, -1])
    return cached, full


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def assert_padded_batch_equals_rows_alone(model, short: int, long: int, new_tokens: int, tol: float = 1e-5) -> None:
    """Greedy generation for a left-padded batch of two prompts equals generating each alone."""
    prompts = [torch.randint(1, 128, (1, short)), torch.randint(1, 128, (1, long))]
    pad = long - short
    batch = torch.cat((torch.cat((torch.zeros(1, pad, dtype=torch.long), prompts[0]), 1), prompts[1]))  # [2, long]
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    kwargs = dict(
        max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0
    )
    out = model.generate(batch, attention_mask=mask, **kwargs)
    for row, ids in enumerate(prompts):
        alone = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        assert torch.equal(alone.sequences[0, ids.shape[1] :], out.sequences[row, long:])
        assert max_diff([lg[row] for lg in out.logits], [lg[0] for lg in alone.logits]) < tol
