"""Does a checkpoint saved by ropescale load with its scaling in plain transformers 4.57 and 5?

For each method (linear, ntk, dynamic_ntk, yarn, llama3, longrope) and architecture (a tiny random
Llama and Mistral, original context L = 64), the patched model is saved with
``ropescale.save_pretrained`` and loaded back four ways; each is compared (fp32, max |Δ logit|) with
the in-memory patched model on 200 tokens (> 3L, where every method changes the result):

  * ropescale:   ``ropescale.from_pretrained(dir)``
  * tf5:         plain ``AutoModelForCausalLM.from_pretrained(dir)`` under this environment's transformers
  * tf4.57:      the same in a subprocess whose PYTHONPATH puts transformers 4.57 first (``make tf4``)
  * unscaled:    the same weights with no scaling at all: how wrong a loader that drops the scaling is

    python benchmarks/loader_parity.py [--tf4 .tf4] [--methods linear,yarn] [--archs llama,mistral]
    python benchmarks/loader_parity.py --checkpoint runs/extension-x4/yarn-export --tokens 9000

``--checkpoint DIR``: a checkpoint already written (a ``ropescale export`` of a fine-tuned run): its
reference is ``ropescale.from_pretrained(DIR)`` on the first ``--tokens`` tokens of held-out Emma.

The test ``tests/export/test_loader_parity.py`` runs the same functions and asserts max |Δ| < 1e-3.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

import ropescale
from ropescale.export.engines_table import apply_case

HERE = Path(__file__).resolve().parent
CHILD = HERE / "loader_child.py"
L = 64  # original context of the tiny models
LENGTH = 200  # > 3L: dynamic methods rescale, longrope switches to long_factor
TOLERANCE = 1e-3

#: method -> (factor, parameters) of the checkpoint saved for it
CASES = {
    "linear": (4, {}),
    "ntk": (4, {}),
    "dynamic_ntk": (4, {}),
    "yarn": (4, {}),
    "llama3": (4, {}),
    "longrope": (4, {"long_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0], "short_factor": [1.0] * 8}),
    # YaRN x4 composed on a shipped llama3 x4 (ropescale.methods.composed): saved as LongRoPE, equal factors
    "yarn_on_llama3": (4, {"compose_on": "llama3"}),
}
#: the architectures; Mistral gets a base other than transformers 4's default 10000, so a loader that
#: misses the top-level rope_theta shows.
ARCHS = ("llama", "mistral")
THETA = {"llama": 10000.0, "mistral": 50000.0}


@dataclass
class Checkpoint:
    """One saved checkpoint and the logits it must reproduce."""

    name: str
    path: Path
    reference: torch.Tensor  # the in-memory patched model's logits [b, s, vocab]
    unscaled: torch.Tensor  # same weights, no scaling


def tiny_model(arch: str, seed: int = 0):
    """A tiny random model (head_dim 16, L = 64, base THETA[arch]) in eval mode."""
    from ropescale.models import tiny

    return tiny.tiny_model(
        arch,
        seed=seed,
        max_position_embeddings=L,
        rope_parameters={"rope_type": "default", "rope_theta": THETA[arch]},
        attn_implementation="eager",
        initializer_range=0.5,  # large weights: logits of order 10, so a lost scaling shows
    )


def input_ids() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, 128, (1, LENGTH))  # [b, s]


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def build_checkpoints(root: Path, ids: torch.Tensor, methods=tuple(CASES), archs=tuple(ARCHS)) -> list[Checkpoint]:
    """Patch, save (``ropescale.save_pretrained``) and record the reference logits of each case."""
    out = []
    for arch in archs:
        for method in methods:
            factor, params = CASES[method]
            model = tiny_model(arch)
            unscaled = logits(model, ids)
            apply_case(model, method.replace("_on_llama3", ""), params, factor, ropescale.patch)
            path = root / f"{arch}-{method}"
            ropescale.save_pretrained(model, path)
            out.append(Checkpoint(path.name, path, logits(model, ids), unscaled))
    return out


def _child_module():
    spec = importlib.util.spec_from_file_location("loader_child", CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_here(ids_path: Path, out: Path, checkpoints: list[Checkpoint]) -> dict:
    """Plain transformers of this environment (5.x), in this process."""
    _child_module().main([str(ids_path), str(out), *(str(c.path) for c in checkpoints)])
    return json.loads((out / "report.json").read_text())


def load_in_subprocess(tf_dir: Path, ids_path: Path, out: Path, checkpoints: list[Checkpoint]) -> dict:
    """Plain transformers from ``tf_dir`` (first on PYTHONPATH; torch stays this environment's)."""
    path = os.pathsep.join([str(tf_dir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = dict(
        os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"
    )
    cmd = [sys.executable, str(CHILD), str(ids_path), str(out), *(str(c.path) for c in checkpoints)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"loader subprocess failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads((out / "report.json").read_text())


def max_delta(out: Path, report: dict, checkpoint: Checkpoint) -> float | None:
    """max |Δ logit| of a loader's result against the reference; None where it could not load."""
    if not report["checkpoints"].get(checkpoint.name, {}).get("ok"):
        return None
    got = torch.load(out / f"{checkpoint.name}.pt", weights_only=True)  # tensors only: no pickle runs
    return float((got - checkpoint.reference).abs().max())


def measure(root: Path, tf4_dir: Path | None, methods=tuple(CASES), archs=tuple(ARCHS)) -> list[dict]:
    """One row per checkpoint: max |Δ| for ropescale, tf5, tf4.57 (None if not run/not loadable), unscaled."""
    ids = input_ids()
    ids_path = root / "ids.pt"
    torch.save(ids, ids_path)
    checkpoints = build_checkpoints(root / "ckpt", ids, methods, archs)
    tf5 = load_here(ids_path, root / "tf5", checkpoints)
    tf4 = load_in_subprocess(tf4_dir, ids_path, root / "tf4", checkpoints) if tf4_dir else None
    rows = []
    for c in checkpoints:
        rows.append(
            {
                "checkpoint": c.name,
                "ropescale": float(
                    (logits(ropescale.from_pretrained(c.path, attn_implementation="eager"), ids) - c.reference)
                    .abs()
                    .max()
                ),
                "tf5": max_delta(root / "tf5", tf5, c),
                "tf5_version": tf5["transformers"],
                "tf4": max_delta(root / "tf4", tf4, c) if tf4 else None,
                "tf4_version": tf4["transformers"] if tf4 else None,
                "tf4_read": tf4["checkpoints"][c.name] if tf4 else None,
                "unscaled": float((c.unscaled - c.reference).abs().max()),
                "rope_scaling": json.loads((c.path / "config.json").read_text()).get("rope_scaling", "absent"),
            }
        )
    return rows


def measure_saved(root: Path, tf4_dir: Path | None, path: Path, tokens: int) -> list[dict]:
    """One row for an existing checkpoint: plain transformers 5 and 4.57 against ropescale's loader."""
    from ropescale.data import load_corpus

    tokenizer = ropescale.load_tokenizer(str(path))
    emma = next(d for d in load_corpus("austen") if "emma" in d.title.lower())
    text_ids = tokenizer(emma.text[: tokens * 8], add_special_tokens=False)["input_ids"][: tokens - 1]
    ids = torch.tensor([[tokenizer.bos_token_id, *text_ids]])  # [1, tokens]
    ids_path = root / "ids.pt"
    torch.save(ids, ids_path)
    reference = logits(ropescale.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa"), ids)
    c = Checkpoint(path.name, path, reference, reference)
    tf5 = load_here(ids_path, root / "tf5", [c])
    tf4 = load_in_subprocess(tf4_dir, ids_path, root / "tf4", [c]) if tf4_dir else None
    row = {"checkpoint": c.name, "ropescale": 0.0, "tf5": max_delta(root / "tf5", tf5, c)}
    row.update(tf5_version=tf5["transformers"], tf4=max_delta(root / "tf4", tf4, c) if tf4 else None)
    row.update(tf4_version=tf4["transformers"] if tf4 else None, tf4_read=tf4["checkpoints"][c.name] if tf4 else None)
    row.update(unscaled=None, rope_scaling=json.loads((path / "config.json").read_text()).get("rope_scaling", "absent"))
    return [row]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the rows of :func:`measure`."""
    from ropescale.markdown import table

    tf4v = next((r["tf4_version"] for r in rows if r["tf4_version"]), "4.57")
    tf5v = rows[0]["tf5_version"] if rows else "5"
    lines = []
    for r in rows:
        read = r["tf4_read"] or {}
        built = (
            f"{read.get('rope_type')}, θ={read.get('rope_theta'):g}"
            if read.get("ok")
            else (read.get("error", "not run")[:40] if read else "not run")
        )
        lines.append(
            [r["checkpoint"], _fmt(r["tf4"]), built, _fmt(r["tf5"]), _fmt(r["ropescale"]), _fmt(r["unscaled"])]
        )
    heads = ["checkpoint", f"tf {tf4v} max abs Δ", f"tf {tf4v} built", f"tf {tf5v} max abs Δ", "ropescale max abs Δ"]
    return table([*heads, "unscaled max abs Δ"], lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tf4", default=str(HERE.parent / ".tf4"), help="transformers 4.57 --target dir (make tf4)")
    ap.add_argument("--methods", default=",".join(CASES))
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--checkpoint", default=None, help="compare this saved checkpoint instead of tiny models")
    ap.add_argument("--tokens", type=int, default=9000, help="with --checkpoint: tokens of Emma (BOS first)")
    args = ap.parse_args(argv)
    tf4 = Path(args.tf4)
    if not (tf4 / "transformers").is_dir():
        print(f"no transformers 4.57 in {tf4} (run `make tf4`); tf4 column skipped", file=sys.stderr)
        tf4 = None
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint:
            rows = measure_saved(Path(tmp), tf4, Path(args.checkpoint), args.tokens)
        else:
            rows = measure(Path(tmp), tf4, tuple(args.methods.split(",")), tuple(args.archs.split(",")))
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
