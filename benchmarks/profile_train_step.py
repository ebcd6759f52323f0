"""Where one optimizer step of a shipped recipe spends its time on the CPU (issue 54: profile before
changing anything): torch.profiler over the second step of the recipe's own loop, on random token ids,
the operators by self CPU time.

    python benchmarks/profile_train_step.py --recipe smollm2-135m/yarn_x2_cpu     # alone: ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import tempfile


class _Enough(Exception):
    """Stops the loop once the profiled step is done."""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="smollm2-135m/yarn_x2_cpu")
    ap.add_argument("--rows", type=int, default=15)
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from accelerate.state import AcceleratorState

    from ropescale.models.runtime import keep_freed_memory

    keep_freed_memory()  # as the CLI runs (ROPESCALE_MALLOC=system: as before it did)

    import ropescale
    from ropescale.training.config import load_config
    from ropescale.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="profile-train-") as out:
        fixed = [f"train.output_dir={out}", "train.max_steps=100000", "train.save_every=0", "eval.every=0"]
        config = load_config(args.recipe, [*fixed, "eval.at_end=false", "train.log_every=1"])
        vocab = ropescale.load_tokenizer(config.model.name)
        tokens = np.random.default_rng(0).integers(10, len(vocab), size=config.data.seq_len * 64).astype(np.int64)
        AcceleratorState._reset_state(True)
        trainer = Trainer(config, tokenizer=vocab, train_tokens=tokens, progress=False)
        trainer.setup()
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        steps = [0]

        def on_step(_trainer, _loss) -> None:  # the first step warms up; the second is profiled
            steps[0] += 1
            if steps[0] == 1:
                profiler.__enter__()
            elif steps[0] == 2:
                profiler.__exit__(None, None, None)
                raise _Enough

        try:
            trainer.train(on_step=on_step)
        except _Enough:
            pass
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
