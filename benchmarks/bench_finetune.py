"""Fine-tune the embedded SmolLM2-135M with the CPU recipe (PoSE, YaRN x4 → 32768 tokens) and compare
held-out perplexity before (training-free YaRN x4) and after, at several lengths.

    python benchmarks/bench_finetune.py                                  # train, then evaluate
    python benchmarks/bench_finetune.py --lengths 2048,16384 train.max_steps=20
    python benchmarks/bench_finetune.py --output runs/bench-finetune     # re-run: finished parts are kept

Protocol: the recipe trains on five Austen novels and holds out *Emma* (``data.holdout``); perplexity
is measured on the start of *Emma* with non-overlapping windows of each length, BOS prepended to every
window, fp32, ``--tokens`` tokens scored per length (default: 4 windows at 2k, one window at 16k and
32k). The training run (``<output>/run``) resumes if interrupted; every finished evaluation cell is
written to ``<output>/cells/`` and never recomputed. Ends with a Markdown table (``report.md``) and
``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_TOKENS = {2048: 8192, 8192: 8192, 16384: 16384, 32768: 32768}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides (e.g. train.max_steps=20)")
    ap.add_argument("--config", default="smollm2-135m/pose_yarn_x4_cpu", help="training recipe")
    ap.add_argument("--output", default="runs/bench-finetune", help="run + results folder")
    ap.add_argument("--lengths", default="2048,16384,32768", help="evaluation window lengths")
    ap.add_argument("--tokens", default=None, help="tokens scored per length, comma-separated (default: see docstring)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--skip-train", action="store_true", help="evaluate an existing run only")
    return ap.parse_args(argv)


def write_json(path: Path, obj) -> None:
    from ropescale._io import atomic_write_json

    atomic_write_json(path, obj)


def train(config, progress: bool = True) -> dict:
    """Train (or resume) the recipe; the record keeps the wall time of every session."""
    from ropescale.training.trainer import Trainer, list_checkpoints

    record_path = config.output_dir / "bench_train.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"sessions": []}
    done = list_checkpoints(config.output_dir)
    if done and int(done[-1].name.split("-")[1]) >= config.train.max_steps:
        return record
    start = time.perf_counter()
    trainer = Trainer(config, progress=progress)
    result = trainer.train(resume=True)
    record["sessions"].append(
        {"steps": len(result.losses), "wall_s": time.perf_counter() - start, "train_loop_s": result.seconds}
    )
    metrics = [json.loads(ln) for ln in (config.output_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    record.update(
        steps=trainer.step,
        tokens=trainer.tokens_seen,
        first_loss=losses[0],
        last_loss=losses[-1],
        mean_loss_first5=sum(losses[:5]) / len(losses[:5]),
        mean_loss_last5=sum(losses[-5:]) / len(losses[-5:]),
    )
    write_json(record_path, record)
    return record


def evaluate(label: str, load, docs, lengths, tokens, bos, cells: Path) -> list[dict]:
    """Perplexity of one model at every length (finished cells are read back, not recomputed)."""
    import torch

    from ropescale.scoring.perplexity import evaluate_perplexity

    rows, model = [], None
    for length, n_tokens in zip(lengths, tokens):
        path = cells / f"{label}__{length}.json"
        if path.is_file():
            rows.append(json.loads(path.read_text()))
            continue
        if model is None:
            model = load()
        doc = docs[0][:n_tokens]
        if len(doc) < length:
            raise SystemExit(f"held-out text has {len(doc)} tokens, fewer than the {length}-token window")
        with torch.inference_mode():
            result = evaluate_perplexity(
                model, [doc], window=length, mode="nonoverlap", bos_token_id=bos, progress=True
            )
        row = {
            "model": label,
            "length": length,
            "ppl": result.ppl,
            "tokens_scored": result.tokens_scored,
            "windows": len(result.window_nll),
            "seconds": result.elapsed_s,
            "tokens_per_s": result.tokens_per_second,
        }
        write_json(path, row)
        print(f"{label:<28} {length:>6}  ppl {row['ppl']:8.3f}  ({row['seconds']:.0f} s)", flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    from ropescale.markdown import table

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import ropescale
    from ropescale.data.documents import load_documents, tokenize_documents
    from ropescale.models.runtime import cpu_model
    from ropescale.training.config import load_config
    from ropescale.training.data import split_holdout
    from ropescale.training.export import merged_model

    out = Path(args.output)
    config = load_config(args.config, [*args.overrides, f"train.output_dir={out / 'run'}"])
    lengths = [int(x) for x in args.lengths.split(",")]
    tokens = [int(x) for x in args.tokens.split(",")] if args.tokens else [DEFAULT_TOKENS.get(n, n) for n in lengths]
    if len(tokens) != len(lengths):
        raise SystemExit("--tokens needs one value per length")
    t0 = time.perf_counter()
    train_record = {} if args.skip_train else train(config)
    train_wall = time.perf_counter() - t0

    tokenizer = ropescale.load_tokenizer(config.model.name)
    _, held_out = split_holdout(load_documents(config.data.source), config.data.holdout)
    docs = tokenize_documents(tokenizer, held_out, max_tokens=max(tokens))
    bos = tokenizer.bos_token_id
    s = config.scaling
    cells = out / "cells"
    t1 = time.perf_counter()
    before = evaluate(
        f"{s.method}-x{s.factor:g}-training-free",
        lambda: ropescale.from_pretrained(
            config.model.name,
            method=s.method,
            factor=s.factor,
            method_params=dict(s.params),
            attn_implementation="sdpa",
        ),
        docs,
        lengths,
        tokens,
        bos,
        cells,
    )
    after = evaluate(
        f"{s.method}-x{s.factor:g}-finetuned",
        lambda: merged_model(config.output_dir),
        docs,
        lengths,
        tokens,
        bos,
        cells,
    )
    eval_wall = time.perf_counter() - t1

    steps = config.train.max_steps
    changes = [
        [b["length"], b["tokens_scored"], f"{b['ppl']:.3f}", f"{a['ppl']:.3f}", f"{a['ppl'] / b['ppl'] - 1:+.1%}"]
        for b, a in zip(before, after)
    ]
    lines = [
        f"# Fine-tuning benchmark: {config.name}",
        "",
        f"{config.model.name}, {s.method} x{s.factor:g}, LoRA r={config.lora.r} on {','.join(config.lora.target_modules)}"
        + (f" + {','.join(config.lora.trainable)}" if config.lora.trainable else "")
        + (
            f", PoSE {config.data.seq_len}-token windows over {config.pose.target_length}"
            if config.pose.enabled
            else ""
        )
        + f", {steps} steps x {config.global_batch()} windows, lr {config.optim.lr:g}.",
        f"Held-out: {', '.join(t for t, _ in held_out)}; non-overlapping windows, BOS per window, fp32.",
        "",
        table(["length", "tokens scored", "training-free PPL", "fine-tuned PPL", "change"], changes, align="rrrrr"),
    ]
    sessions = train_record.get("sessions", [])
    lines += [
        "",
        f"Training: {sum(x['wall_s'] for x in sessions):.0f} s wall over {len(sessions)} session(s), "
        f"loss {train_record.get('mean_loss_first5', float('nan')):.3f} (first 5 steps) -> "
        f"{train_record.get('mean_loss_last5', float('nan')):.3f} (last 5). "
        f"Evaluation: {eval_wall:.0f} s this session. torch threads {torch.get_num_threads()}, "
        f"{cpu_model()}, {os.cpu_count()} CPUs.",
    ]
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    write_json(
        out / "results.json",
        {
            "before": before,
            "after": after,
            "train": train_record,
            "train_wall_this_session_s": train_wall,
            "eval_wall_this_session_s": eval_wall,
            "recipe": config.to_dict(),
        },
    )
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
