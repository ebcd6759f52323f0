"""GPU-only checks (skipped without CUDA): a patched model agrees with native transformers in bf16 on the
GPU (SDPA, and flash-attn 2 when it is installed). CPU runs of the same comparisons are in tests/patching."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import ropescale
from tests.conftest import ORIGINAL_CONTEXT, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

L = ORIGINAL_CONTEXT
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": L}
ATTENTIONS = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_bf16_patched_equals_native_on_the_gpu(attention):
    # initializer_range 0.1: logits of a few units, so the scaling's effect stands far above bf16 noise
    patched = ropescale.patch(
        tiny_model("llama", attn_implementation=attention, initializer_range=0.1), "yarn", factor=4
    )
    native = tiny_model(
        "llama",
        state_dict=patched.state_dict(),
        rope_parameters=copy.deepcopy(YARN),
        max_position_embeddings=4 * L,
        attn_implementation=attention,
    )
    patched, native = (m.to("cuda", torch.bfloat16) for m in (patched, native))
    ids = torch.randint(0, 128, (2, 3 * L + 8), generator=torch.Generator().manual_seed(0)).cuda()
    got, want = _logits(patched, ids), _logits(native, ids)
    assert got.dtype == want.dtype == torch.float32 and torch.isfinite(got).all()
    # same weights and kernels: agreement within bf16 noise (on the CPU they are equal; bf16 vs fp32 differs by 0.05)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-1)
    plain = tiny_model("llama", state_dict=patched.state_dict(), attn_implementation=attention).to(
        "cuda", torch.bfloat16
    )
    assert (_logits(plain, ids) - got).abs().amax() > 1.0  # the scaling changed something beyond L (2.95 on the CPU)
