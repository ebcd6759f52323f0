"""The attention-level kernels on a CUDA device (skipped without one): the CUDA backends of
:func:`ropescale.attention.merge.attend` (memory-efficient attention in fp32, flash-attn 2 in bf16
when installed) must give what the float64 CPU reference gives, in prefill and decoding."""

from __future__ import annotations

import pytest
import torch

from tests.attention import test_dca, test_self_extend_kernel, test_string

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("q_len", [None, 1])
@pytest.mark.parametrize(
    "module,n,params", [(test_self_extend_kernel, 100, (4, 16)), (test_dca, 100, (16, 4)), (test_string, 60, (21, 3))]
)
def test_kernels_match_the_reference_on_cuda(module, n, params, dtype, tol, q_len):
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, q_pos, k_pos = module.tensors(n, q_len)
    q, k, v = (t.to(dtype).float() for t in (q, k, v))  # the reference sees the rounded inputs
    got = module.run(*(t.cuda().to(dtype) for t in (q, k, v)), q_pos.cuda(), None, *params)
    expected = module.reference(q, k, v, q_pos, k_pos, *params)
    torch.testing.assert_close(got.float().cpu().double(), expected, rtol=0, atol=tol)
