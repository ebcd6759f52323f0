"""Eager attention written from the reference repositories' code, as transformers attention functions.

Each factory returns ``attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
**kwargs) -> (out [b, q, h, d], None)`` over the unrotated q [b, h, q, d] and the unrotated cache
k/v [b, h_kv, kv, d] an attention-level mode hands over (identity cos/sin in the layers), so it can
replace ropescale's kernel inside a patched model. Each follows one file's forward line by line:
its cos/sin tables (factors multiplied in as the file does), its positions, its masks, one dense
score matrix and one softmax (the files' flash paths merge by log-sum-exp, which is the same
softmax). Nothing here calls ropescale's kernels or position helpers.

* :func:`chunkllama`: HKUNLP/ChunkLlama ``chunkllama_attn_replace.py`` ``forward`` (c = 0.05) and
  ``flash_decoding_chunkllama.py`` (c = 0.1): the prefill's chunk loop and the decode branch.
* :func:`string`: HKUNLP/STRING ``string_for_llama.py`` ``forward`` (``attention_factor``) with the
  decode branch's split (diagonal keys: the last S), ``string_for_qwen2.py``'s YaRN frequencies.
* :func:`self_extend`: datamllab/LongLM ``self_extend_patch/Llama.py`` ``self_extend_forward``
  (``W − W / G``) and ``self_extend_patch/Mistral.py`` (``W − W // G``), ``scale_base`` included.

Only the batch-of-equal-rows, no-padding case the reference files support is covered; the
references run in fp32 like the models under test.
"""

from __future__ import annotations

import math

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def inv_freq_of(module, dim: int) -> torch.Tensor:
    theta = module.config.rope_parameters["rope_theta"]
    return 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))


def table(inv_freq: torch.Tensor, t: torch.Tensor, factor: float = 1.0):
    """The files' ``emb = cat(freqs, freqs)``; ``cos_cached = emb.cos() * factor``. # [len(t), d] each"""
    freqs = torch.outer(t.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * factor, emb.sin() * factor


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The files' ``apply_rotary_pos_emb(x, cos, sin, position_ids)``: rows of the table at position_ids."""
    cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)  # [b, 1, s, d]
    return (x * cos) + (rotate_half(x) * sin)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x.repeat_interleave(n_rep, dim=1)


def finish(scores: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, None]:
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return (probs @ value).transpose(1, 2).contiguous(), None


# --- HKUNLP/ChunkLlama


def get_mscale(scale: float, coefficient: float) -> float:
    """``get_mscale`` of chunkllama_attn_replace.py (0.05) / flash_decoding_chunkllama.py (0.1)."""
    if scale <= 1 or not coefficient:
        return 1.0
    return coefficient * math.log(scale) + 1.0


def chunkllama(chunk_size: int, local_window: int, max_position_embeddings: int, coefficient: float):
    """ChunkLlama's forward; ``coefficient`` 0 for no temperature."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        position_ids = kwargs["position_ids"]
        bsz, _, q_len, head_dim = query.shape
        kv_seq_len = key.shape[2]
        chunk_len = chunk_size - local_window
        # ChunkLlamaRotaryEmbedding._set_cos_sin_cache(seq_len=kv_seq_len)
        mscale = get_mscale(kv_seq_len / max_position_embeddings, coefficient)
        inv_freq = inv_freq_of(module, head_dim)
        q_cos, q_sin = table(inv_freq, torch.arange(chunk_len), mscale)
        qc_cos, qc_sin = table(inv_freq, (torch.arange(chunk_len) + chunk_len).clamp(max=chunk_size), mscale)
        k_cos, k_sin = table(inv_freq, torch.arange(kv_seq_len) % chunk_len, mscale)
        # every key at its own position (the file rotates keys as they arrive; here: at this length's mscale)
        key_states = rope(key, k_cos, k_sin, torch.arange(kv_seq_len)[None].expand(bsz, -1))
        key_states = repeat_kv(key_states, query.shape[1] // key.shape[1])
        value_states = repeat_kv(value, query.shape[1] // value.shape[1])
        position_ids = position_ids % chunk_len

        def scores(q, k):
            return q @ k.transpose(2, 3) / math.sqrt(head_dim)

        if q_len == kv_seq_len:  # the prefill's chunk loop, as one matrix of its blocks
            full = query.new_full((bsz, query.shape[1], q_len, kv_seq_len), -math.inf)
            causal = torch.ones(chunk_len, chunk_len, dtype=torch.bool).tril()
            for begin in range(0, kv_seq_len, chunk_len):
                end = min(begin + chunk_len, kv_seq_len)
                rows = slice(begin, end)
                intra = scores(rope(query[:, :, rows], q_cos, q_sin, position_ids[:, rows]), key_states[:, :, rows])
                full[:, :, rows, rows] = intra.masked_fill(~causal[: end - begin, : end - begin], -math.inf)
                if begin == 0:
                    continue
                q_succ = rope(query[:, :, rows], qc_cos, qc_sin, position_ids[:, rows])
                prev = slice(begin - chunk_len, begin)
                full[:, :, rows, prev] = scores(q_succ, key_states[:, :, prev])
                if begin - chunk_len > 0:
                    inter_pos = position_ids[:, chunk_len - 1][:, None].repeat(1, end - begin)
                    q_inter = rope(query[:, :, rows], qc_cos, qc_sin, inter_pos)
                    full[:, :, rows, : begin - chunk_len] = scores(q_inter, key_states[:, :, : begin - chunk_len])
            return finish(full, value_states)
        assert q_len == 1, "ChunkLlama's decode branch takes one query"
        chunk_num_curr = (kv_seq_len - 1) // chunk_len
        q_intra = rope(query, q_cos, q_sin, position_ids)
        parts = [scores(q_intra, key_states[:, :, chunk_len * chunk_num_curr : kv_seq_len])]
        if chunk_num_curr >= 1:
            q_succ = rope(query, qc_cos, qc_sin, position_ids)
            k_succ = key_states[:, :, chunk_len * (chunk_num_curr - 1) : chunk_len * chunk_num_curr]
            parts = [scores(q_succ, k_succ), *parts]
        if chunk_num_curr >= 2:
            q_inter = rope(query, qc_cos, qc_sin, torch.tensor([[chunk_len - 1]]))
            parts = [scores(q_inter, key_states[:, :, : chunk_len * (chunk_num_curr - 1)]), *parts]
        return finish(torch.cat(parts, dim=-1), value_states)

    return attention


# --- HKUNLP/STRING


def yarn_qwen2_inv_freq(dim: int, base: float, yarn_factor: float, max_position_embeddings: int) -> torch.Tensor:
    """``_compute_yarn_parameters`` of string_for_qwen2.py (its hard-coded 32768 is Qwen2's L: here L)."""
    beta_fast, beta_slow = 32, 1

    def find_correction_dim(num_rotations):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(find_correction_dim(beta_fast)), 0)
    high = min(math.ceil(find_correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq_extrapolation, inv_freq_interpolation = 1.0 / pos_freqs, 1.0 / (yarn_factor * pos_freqs)
    inv_freq_mask = 1 - ramp
    return inv_freq_interpolation * (1 - inv_freq_mask) + inv_freq_extrapolation * inv_freq_mask


def string(diag_size: int, local_window: int, yarn_factor: float | None = None, max_position_embeddings: int = 0):
    """STRING's forward; ``yarn_factor`` set: string_for_qwen2.py's YaRN frequencies."""
    attention_factor = 0.1 * math.log(2) + 1  # replace_with_string

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        position_ids = kwargs["position_ids"]
        bsz, _, q_len, head_dim = query.shape
        kv_seq_len = key.shape[2]
        if yarn_factor is None:
            inv_freq = inv_freq_of(module, head_dim)
        else:
            theta = module.config.rope_parameters["rope_theta"]
            inv_freq = yarn_qwen2_inv_freq(head_dim, theta, yarn_factor, max_position_embeddings)
        cos, sin = table(inv_freq, torch.arange(kv_seq_len), attention_factor)
        key_states = rope(key, cos, sin, torch.arange(kv_seq_len)[None].expand(bsz, -1))
        key_states = repeat_kv(key_states, query.shape[1] // key.shape[1])
        value_states = repeat_kv(value, query.shape[1] // value.shape[1])
        query_states_1 = rope(query, cos, sin, position_ids)
        shifted = (position_ids - diag_size + local_window).clamp(min=0)  # rows nearer than S use none
        query_states_2 = rope(query, cos, sin, shifted)
        diag = query_states_1 @ key_states.transpose(2, 3) / math.sqrt(head_dim)
        far = query_states_2 @ key_states.transpose(2, 3) / math.sqrt(head_dim)
        # the decode branch's split: the last diag_size keys diagonal, the rest (distance >= S) shifted
        # (the flash prefill's window [diag_size, 0] is inclusive and admits distance S to both parts)
        i, j = position_ids[:, None, :, None], torch.arange(kv_seq_len)[None, None, None, :]
        out = torch.where(i - j < diag_size, diag, far).masked_fill(j > i, -math.inf)
        return finish(out, value_states)

    return attention


# --- datamllab/LongLM


def self_extend(group_size_1: int, group_size_2: int, floor_shift: bool, scale_base: int = -1):
    """``self_extend_forward``: Llama.py (``floor_shift`` False: ``W − W / G``) or Mistral.py (True)."""

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        position_ids = kwargs["position_ids"]
        bsz, _, q_len, head_dim = query.shape
        kv_seq_len = key.shape[2]
        if scale_base > 0:
            log_scale = ((position_ids + 1)[:, None, :, None].log() / math.log(scale_base)).clip(1)
            scaled_query = query * log_scale.to(query.dtype)
        else:
            scaled_query = query
        query_position = position_ids
        key_position = position_ids if q_len != 1 else torch.arange(kv_seq_len).view(1, kv_seq_len)
        inv_freq = inv_freq_of(module, head_dim)

        def rotary_emb(positions):  # transformers' LlamaRotaryEmbedding.forward(x, position_ids)
            freqs = positions.float()[..., None] * inv_freq  # [b, s, d/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos()[:, None], emb.sin()[:, None]

        def apply(x, cos_sin):
            cos, sin = cos_sin
            return (x * cos) + (rotate_half(x) * sin)

        _re_group_size_2 = 0 if query_position.max() < group_size_2 else group_size_2
        if floor_shift:  # Mistral.py's apply_grouped_rotary_pos_emb
            group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 // group_size_1
        else:  # Llama.py
            group_query_position = query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 / group_size_1
        group_key_position = key_position // group_size_1
        n_rep = query.shape[1] // key.shape[1]
        neighbor_query_states = apply(scaled_query, rotary_emb(query_position))
        neighbor_key_states = repeat_kv(apply(key, rotary_emb(key_position)), n_rep)
        group_query_states = apply(scaled_query, rotary_emb(group_query_position))
        group_key_states = repeat_kv(apply(key, rotary_emb(group_key_position)), n_rep)
        value_states = repeat_kv(value, n_rep)
        neighbor_attn_weights = neighbor_query_states @ neighbor_key_states.transpose(2, 3) / math.sqrt(head_dim)
        group_attn_weights = group_query_states @ group_key_states.transpose(2, 3) / math.sqrt(head_dim)
        # the model's causal mask (the file adds attention_mask; SDPA's mask function may hand over None)
        causal = torch.ones(q_len, kv_seq_len, dtype=torch.bool).tril(kv_seq_len - q_len)
        if q_len == 1:
            neighbor_attention_mask = torch.zeros((q_len, kv_seq_len))
            neighbor_attention_mask[:, -group_size_2:] = 1
        elif q_len == kv_seq_len:
            neighbor_attention_mask = torch.ones((q_len, kv_seq_len)).tril()
            if q_len - group_size_2 > 0:
                group_attention_mask = torch.ones((q_len - group_size_2, kv_seq_len - group_size_2)).tril()
                neighbor_attention_mask[group_size_2:, :-group_size_2] -= group_attention_mask
        else:
            raise ValueError("q_len should be 1 or seq_len.")
        attn_weights = torch.where(neighbor_attention_mask.bool(), neighbor_attn_weights, group_attn_weights)
        return finish(attn_weights.masked_fill(~causal, -math.inf), value_states)

    return attention
