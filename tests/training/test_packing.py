"""Documents kept apart in a packed window (data.packing: documents): positions restart, attention and loss
never cross a document boundary, on SDPA and eager, with PoSE, S²-Attn and MLP tiles; flash-attention's
varlen lengths as transformers' own collator makes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ropescale.scoring.nll import IGNORE_INDEX
from ropescale.training.config import ConfigError
from ropescale.training.data import TokenStream, WindowDataset, WindowSpec, pack_stream
from ropescale.training.modeling import CausalLMLoss, FullFinetune
from ropescale.training.packing import document_attention, flash_varlen_kwargs
from ropescale.training.pose import pose_layout
from tests.conftest import tiny_model
from tests.training.conftest import recipe

BOS, EOS = 1, 2
LENGTHS = (9, 23, 5, 30)  # document lengths (text tokens); packed with BOS and EOS: 11, 25, 7, 32


def _stream(seed: int = 0) -> TokenStream:
    rng = np.random.default_rng(seed)
    return pack_stream([rng.integers(4, 128, n) for n in LENGTHS], BOS, EOS, documents=True)


def _logits(model, ids, positions, **attention) -> torch.Tensor:
    hidden = model.get_decoder()(input_ids=ids, position_ids=positions, use_cache=False, **attention)
    return model.lm_head(hidden.last_hidden_state)  # [b, n, vocab]


def _alone(model, ids, positions, seq_ids) -> torch.Tensor:
    """Each document of a window run by itself, its logits put back in window order. # [1, n, vocab]"""
    parts = []
    for s in seq_ids[0].unique():
        where = seq_ids[0] == s
        parts.append(_logits(model, ids[:, where], positions[:, where], attention_mask=torch.ones_like(ids[:, where])))
    return torch.cat(parts, dim=1)


def _window(spec: WindowSpec, slot: int = 0, seed: int = 0) -> dict[str, torch.Tensor]:
    return {k: v[None] for k, v in WindowDataset(_stream(), spec, seed=seed).window(slot, slot).items()}


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pose", [False, True])
def test_packed_window_logits_equal_each_document_alone(arch, attn, pose):
    model = tiny_model(arch, attn_implementation=attn).float()
    spec = WindowSpec(40 if pose else 64, BOS, 75 if pose else None, 3, "skip", documents=True)
    w = _window(spec, slot=0, seed=3)
    assert int(w["seq_ids"].max()) >= 1  # the window holds several documents
    with torch.no_grad():
        packed = _logits(
            model, w["input_ids"], w["position_ids"], **document_attention(model, w["position_ids"], w["seq_ids"])
        )
        alone = _alone(model, w["input_ids"], w["position_ids"], w["seq_ids"])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_transformers_detects_packing_from_restarting_positions(attn):
    """Without PoSE, transformers' own detection (attention_mask None, positions restarting) gives the
    same block-diagonal causal attention as the document ids do."""
    model = tiny_model("qwen2", attn_implementation=attn).float()
    w = _window(WindowSpec(64, BOS, documents=True))
    with torch.no_grad():
        detected = _logits(model, w["input_ids"], w["position_ids"], attention_mask=None)
        ours = _logits(
            model, w["input_ids"], w["position_ids"], **document_attention(model, w["position_ids"], w["seq_ids"])
        )
        stream = _logits(model, w["input_ids"], w["position_ids"], attention_mask=torch.ones_like(w["input_ids"]))
    torch.testing.assert_close(detected, ours, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(stream, ours, atol=1e-3)  # an all-ones mask lets documents see each other


def test_window_positions_restart_and_first_labels_are_ignored():
    stream = _stream()
    starts = stream.starts.tolist()  # [0, 11, 36, 43]
    ds = WindowDataset(stream, WindowSpec(40, BOS, documents=True))
    w = ds.window(0, 0)  # at document 0's own BOS: no second one
    assert w["input_ids"][0] == BOS and w["input_ids"][1] != BOS
    assert w["position_ids"].tolist() == list(range(11)) + list(range(25)) + list(range(4))
    assert [i for i, x in enumerate(w["labels"].tolist()) if x == IGNORE_INDEX] == [0, 11, 36]
    ds = WindowDataset(stream, WindowSpec(20, BOS, documents=True))
    w = ds.window(1, 1)  # text from offset 19 (inside document 1): a prepended BOS starts it
    assert w["input_ids"][0] == BOS and w["seq_ids"].tolist() == [0] * 18 + [1, 1]
    assert w["position_ids"].tolist() == list(range(18)) + [0, 1]
    assert starts == [0, 11, 36, 43]


def test_pose_skip_keeps_the_text_distance_within_a_document():
    """A document whose start a PoSE skip jumped over counts its positions from that start (the text's
    distance), and the chunk boundary inside one document keeps its skip."""
    spec = WindowSpec(16, BOS, 75, 2, "skip", documents=True)
    for index in range(20):
        w = WindowDataset(_stream(), spec, seed=index).window(0, index)
        pos, seq = w["position_ids"].numpy(), w["seq_ids"].numpy()
        # content=skip, slot 0 (at document 0's BOS): window token i is stream token layout position i
        stream_at = pose_layout(16, 75, 2, np.random.default_rng([index, index, 1])).position_ids()
        starts = _stream().starts
        doc = np.searchsorted(starts, stream_at, side="right") - 1
        assert (pos == stream_at - starts[doc]).all()
        assert (seq == np.unique(doc, return_inverse=True)[1]).all()  # documents numbered 0, 1, ... in the window


def test_loss_never_spans_two_documents():
    """The packed loss is the mean of every document's own next-token loss, each document's first token
    unpredicted."""
    model = tiny_model("llama", attn_implementation="sdpa").float()
    w = _window(WindowSpec(64, BOS, documents=True))
    loss = CausalLMLoss(FullFinetune(model), loss_chunk=16)
    with torch.no_grad():
        packed = loss(w["input_ids"], w["position_ids"], w["labels"], seq_ids=w["seq_ids"])
        total, count = 0.0, 0
        for s in w["seq_ids"][0].unique():
            where = w["seq_ids"][0] == s
            ids = w["input_ids"][:, where]
            logits = _logits(model, ids, w["position_ids"][:, where], attention_mask=torch.ones_like(ids))
            nll = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum")
            total, count = total + float(nll), count + ids.shape[1] - 1
    assert float(packed) == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("option", ["s2attn", "mlp_tiles"])
def test_training_paths_keep_documents_apart(option):
    """S²-Attn (its groups see the document mask) and tiled MLPs: changing one document's tokens
    changes no other document's logits."""
    from ropescale.training.memory import tile_mlps
    from ropescale.training.s2attn import enable_s2attn

    model = tiny_model("llama", attn_implementation="sdpa").float()
    if option == "s2attn":
        enable_s2attn(model, 0.25)
        model.train()
    else:
        tile_mlps(model, 8)
    w = _window(WindowSpec(64, BOS, documents=True))
    ids2 = w["input_ids"].clone()
    first = w["seq_ids"][0] == 0
    ids2[0, 1:][first[1:]] = (ids2[0, 1:][first[1:]] + 7) % 128  # another first document
    att = document_attention(model, w["position_ids"], w["seq_ids"])
    with torch.no_grad():
        a = _logits(model, w["input_ids"], w["position_ids"], **att)
        b = _logits(model, ids2, w["position_ids"], **att)
    assert not torch.allclose(a[0, first], b[0, first])
    torch.testing.assert_close(a[0, ~first], b[0, ~first], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("method", ["self_extend", "dca"])
def test_attention_level_methods_keep_documents_apart(method):
    """ropescale's attention functions (registered with SDPA's mask) get the document mask too."""
    from ropescale.patching.model import patch

    model = patch(tiny_model("llama", attn_implementation="sdpa").float(), method, 4, replace=True)
    assert model.config._attn_implementation.startswith("ropescale_")
    w = _window(WindowSpec(64, BOS, documents=True))
    with torch.no_grad():
        packed = _logits(
            model, w["input_ids"], w["position_ids"], **document_attention(model, w["position_ids"], w["seq_ids"])
        )
        alone = _alone(model, w["input_ids"], w["position_ids"], w["seq_ids"])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_flash_attention_gets_the_collators_varlen_lengths():
    """The flash-attention path passes what DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    computes for the same documents laid end to end (flash-attn itself is not installed here)."""
    from transformers import DataCollatorWithFlattening

    w = _window(WindowSpec(32, BOS, documents=True))
    v = _window(WindowSpec(32, BOS, documents=True), slot=1)
    seq_ids = torch.cat([w["seq_ids"], v["seq_ids"]])  # [2, 32]
    features = []
    for row, positions in zip(seq_ids, torch.cat([w["position_ids"], v["position_ids"]])):
        for s in row.unique():
            features.append({"input_ids": positions[row == s].tolist()})
    collated = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features)
    ours = flash_varlen_kwargs(seq_ids)
    assert ours["cu_seq_lens_q"].tolist() == collated["cu_seq_lens_q"].tolist()
    assert ours["max_length_q"] == collated["max_length_q"]

    class Flash:  # only the config is read on the flash path
        config = type("C", (), {"_attn_implementation": "flash_attention_2"})()

    att = document_attention(Flash(), torch.cat([w["position_ids"], v["position_ids"]]), seq_ids)
    assert att["attention_mask"] is None and att["cu_seq_lens_k"].tolist() == ours["cu_seq_lens_k"].tolist()


def test_a_window_of_one_document_needs_no_mask():
    model = tiny_model("llama", attn_implementation="sdpa").float()
    seq_ids = torch.zeros(2, 16, dtype=torch.long)
    att = document_attention(model, torch.arange(16).expand(2, 16), seq_ids)
    assert att["attention_mask"].shape == (2, 16) and bool(att["attention_mask"].all())  # causal, no n x n mask


def test_documents_refused_where_they_cannot_stay_apart(tmp_path):
    with pytest.raises(ConfigError, match=r"data.recall_facts needs data.packing=stream"):
        recipe(tmp_path, data={"source": str(tmp_path), "recall_facts": 1, "seq_len": 128})
    assert recipe(tmp_path, data={"source": str(tmp_path)}).data.packing == "documents"  # a folder: auto
    assert recipe(tmp_path).data.packing == "stream"  # the embedded corpus: whole novels, as shipped


def test_trainer_trains_a_folder_with_documents_apart(tmp_path, model_dir):
    from ropescale.training.trainer import Trainer

    data = tmp_path / "docs"
    data.mkdir()
    for i in range(6):
        (data / f"d{i}.txt").write_text(f"Document {i} says: " + "abcdefghij"[i] * (20 + 9 * i))
    config = recipe(
        tmp_path,
        model={"name": str(model_dir)},
        data={"source": str(data), "seq_len": 48},
        train={"gradient_checkpointing": True},  # the mask goes through checkpointed layers too
    )
    trainer = Trainer(config, progress=False)
    trainer.setup()
    batch = trainer.dataset.batch([0, 1])
    assert "seq_ids" in batch and int(batch["seq_ids"].max()) >= 1
    result = trainer.train()
    assert result.step == config.train.max_steps and all(np.isfinite(result.losses))


def _varlen_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A CPU stand-in for flash_attn_varlen_func: causal SDPA within each [cu[i], cu[i+1]) of the
    flattened batch, reading the lengths transformers hands every attention layer."""
    cu = kwargs["cu_seq_lens_q"].tolist()
    b, h, n, d = query.shape
    key = key.repeat_interleave(h // key.shape[1], dim=1)
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    flat = [x.transpose(1, 2).reshape(b * n, h, d) for x in (query, key, value)]  # [b*n, h, d]
    out = torch.empty_like(flat[0])
    for lo, hi in zip(cu[:-1], cu[1:]):
        q, k, v = (x[lo:hi].transpose(0, 1)[None] for x in flat)  # [1, h, len, d]
        out[lo:hi] = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)[
            0
        ].transpose(0, 1)
    return out.reshape(b, n, h, d), None


def test_varlen_lengths_reach_every_attention_layer(monkeypatch):
    """The flash path's cu_seq_lens go through the decoder to each layer's attention function: with a
    varlen kernel (here SDPA per document, flash-attn being absent) every document's logits equal the
    document run alone."""
    from transformers import AttentionInterface

    import ropescale.training.packing as packing

    AttentionInterface.register("varlen_cpu_test", _varlen_sdpa)  # no mask interface: transformers builds none
    monkeypatch.setattr(packing, "uses_varlen", lambda implementation: implementation == "varlen_cpu_test")
    model = tiny_model("qwen2", attn_implementation="sdpa").float()
    w = _window(WindowSpec(32, BOS, documents=True))
    v = _window(WindowSpec(32, BOS, documents=True), slot=1)
    batch = {k: torch.cat([w[k], v[k]]) for k in w}
    with torch.no_grad():
        alone = torch.cat(
            [_alone(model, *(batch[k][r : r + 1] for k in ("input_ids", "position_ids", "seq_ids"))) for r in (0, 1)]
        )
        model.set_attn_implementation("varlen_cpu_test")
        packed = _logits(
            model,
            batch["input_ids"],
            batch["position_ids"],
            **document_attention(model, batch["position_ids"], batch["seq_ids"]),
        )
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
