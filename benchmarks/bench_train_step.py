"""What each CPU speed change of issue 54 does to one training step, in one run: the shipped recipe's
step (``Trainer.train`` on random ids, as profile_train_step.py runs it) timed in a fresh process per
variant, each after the one before it.

    python benchmarks/bench_train_step.py                       # ALONE: ~5 min on 2 cores
    python benchmarks/bench_train_step.py --recipe smollm2-135m/yarn_x4_long --steps 4

Variants (each adds to the one above):

- ``before``: glibc's malloc as it is (``ROPESCALE_MALLOC=system``), the recomputing head loss
  (``ROPESCALE_FUSED_LOSS=0``): the code before issue 54's changes;
- ``malloc``: freed memory kept mapped (``ropescale.models.runtime.keep_freed_memory``): what ropescale ships;
- ``fused``: the fused head loss (``ropescale.scoring.nll._FusedHeadLoss``, opt-in: ``ROPESCALE_FUSED_LOSS=1``);
- ``compile``: each decoder layer through ``torch.compile`` (the recipe switch ``train.compile=true``, opt-in).

Per variant: the median seconds of the timed steps (the first ``--warmup`` steps are not timed), the
process's user and system CPU seconds, the first step's loss (the same ids in every variant), and the
load average before and after; ``--output`` keeps them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "before": {"ROPESCALE_MALLOC": "system", "ROPESCALE_FUSED_LOSS": "0"},
    "malloc": {"ROPESCALE_MALLOC": "", "ROPESCALE_FUSED_LOSS": "0"},
    "fused": {"ROPESCALE_MALLOC": "", "ROPESCALE_FUSED_LOSS": "1"},
    "compile": {"ROPESCALE_MALLOC": "", "ROPESCALE_FUSED_LOSS": "1", "BENCH_COMPILE": "1"},
}


class _Enough(Exception):
    pass


def one(recipe: str, steps: int, warmup: int) -> dict:
    """Time ``steps`` steps of ``recipe`` in this process (the variant is in the environment)."""
    import numpy as np
    from accelerate.state import AcceleratorState

    import ropescale
    from ropescale.models.runtime import keep_freed_memory, load_average
    from ropescale.training.config import load_config
    from ropescale.training.trainer import Trainer

    kept = keep_freed_memory()
    load_before = load_average()
    times: list[float] = []
    losses: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-step-") as out:
        fixed = [f"train.output_dir={out}", "train.max_steps=100000", "train.save_every=0", "eval.every=0"]
        compiled = f"train.compile={str(os.environ.get('BENCH_COMPILE') == '1').lower()}"
        config = load_config(recipe, [*fixed, "eval.at_end=false", "train.log_every=1", compiled])
        vocab = ropescale.load_tokenizer(config.model.name)
        tokens = np.random.default_rng(0).integers(10, len(vocab), size=config.data.seq_len * 64).astype(np.int64)
        AcceleratorState._reset_state(True)
        trainer = Trainer(config, tokenizer=vocab, train_tokens=tokens, progress=False)
        trainer.setup()
        last = [time.perf_counter()]

        def on_step(_trainer, loss) -> None:
            now = time.perf_counter()
            times.append(now - last[0])
            losses.append(loss)
            last[0] = now
            if len(times) >= warmup + steps:
                raise _Enough

        try:
            trainer.train(on_step=on_step)
        except _Enough:
            pass
    timed = sorted(times[warmup:])
    usage = os.times()
    return {
        "malloc_kept": kept,
        "s_per_step": round(timed[len(timed) // 2], 3),
        "steps_s": [round(t, 3) for t in times],
        "first_loss": round(losses[0], 5),
        "user_s": round(usage.user, 1),
        "system_s": round(usage.system, 1),
        "load_avg": [load_before, load_average()],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="smollm2-135m/yarn_x2_cpu")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first steps")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--output", default=None, help="JSON of every variant")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child's variant
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.recipe, args.steps, args.warmup)))
        return 0
    results: dict = {"recipe": args.recipe, "command": "python " + " ".join(sys.argv), "variants": {}}
    base = None
    for name in args.variants.split(","):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **VARIANTS[name]}
        cmd = [sys.executable, __file__, "--one", name, "--recipe", args.recipe]
        cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        row = json.loads(done.stdout.strip().splitlines()[-1])
        base = base or row["s_per_step"]
        row["vs_before"] = round(row["s_per_step"] / base, 3)
        results["variants"][name] = row
        print(
            f"{name:8s} {row['s_per_step']:6.2f} s a step ({row['vs_before']:.2f}x before), system {row['system_s']} s, "
            f"user {row['user_s']} s, first loss {row['first_loss']}, load {row['load_avg']}",
            flush=True,
        )
    if args.output:
        from ropescale._io import atomic_write_json

        atomic_write_json(args.output, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
