"""``python -m torch.distributed.run ... tests/training/fsdp_cpu_main.py train ...``: the ropescale CLI under
accelerate's FSDP on CPU processes (gloo).

accelerate enables FSDP only on accelerators (on CPUs its state stays MULTI_CPU and the FSDP plugin is
ignored); FSDP2 (``fully_shard``) itself runs on CPU with gloo. This shim turns a MULTI_CPU state into
an FSDP one when ``ACCELERATE_USE_FSDP=true``, exactly as accelerate does on GPUs; the trainer code
under test is unchanged. Test infrastructure only.
"""

from __future__ import annotations

import os
import sys

import accelerate.state as state
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

_init = state.AcceleratorState.__init__


def _init_with_fsdp_on_cpu(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and os.environ.get("ACCELERATE_USE_FSDP") == "true":
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = FullyShardedDataParallelPlugin()


state.AcceleratorState.__init__ = _init_with_fsdp_on_cpu

if __name__ == "__main__":
    from ropescale.cli.main import main

    sys.exit(main(sys.argv[1:]))
