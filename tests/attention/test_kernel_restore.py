"""Attention-level modes and the user's attention kernel.

The KV-consistent mode runs SDPA (or eager) whatever kernel the model was loaded with: with
flash-attn 2 that is a swap to SDPA. Re-patching must give the user's kernel back, not leave SDPA to
the methods patched later. flash-attn is not installed here: ``my_kernel``, an attention function
registered with transformers that is neither SDPA nor eager, stands for it.
"""

from __future__ import annotations

import pytest
import torch

import ropescale
from ropescale.patching.model import attention_kernel
from tests.conftest import tiny_model

KERNEL = "my_kernel"
CALLS = {"n": 0}


def register_kernel() -> str:
    """Register :data:`KERNEL`: SDPA under another name, counting its calls (idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def counted(*args, **kwargs):
        CALLS["n"] += 1
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register(KERNEL, counted)
    AttentionMaskInterface.register(KERNEL, sdpa_mask)
    return KERNEL


@pytest.fixture
def model():
    model = tiny_model(attn_implementation="sdpa")
    model.set_attn_implementation(register_kernel())
    return model


@pytest.mark.parametrize("mode_method", ["dynamic_ntk", "dynamic_yarn", "self_extend"])
def test_re_patching_gives_the_users_kernel_back(model, mode_method):
    with pytest.warns(UserWarning, match=f"using sdpa instead of '{KERNEL}'"):
        ropescale.patch(model, mode_method, factor=4)
    assert attention_kernel(model) == "sdpa"
    ropescale.patch(model, mode_method, factor=4, replace=True)  # a mode on a mode: still the user's underneath
    ropescale.patch(model, "yarn", factor=4, replace=True)
    assert model.config._attn_implementation == KERNEL and attention_kernel(model) == KERNEL
    before = CALLS["n"]
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 20)))
    assert CALLS["n"] > before  # the user's kernel runs again


def test_sdpa_and_eager_are_kept_by_the_kv_consistent_mode():
    for kernel in ("sdpa", "eager"):
        model = ropescale.patch(tiny_model(attn_implementation=kernel), "dynamic_ntk", factor=4)
        assert attention_kernel(model) == kernel
        ropescale.patch(model, "linear", factor=4, replace=True)
        assert model.config._attn_implementation == kernel
