"""Run each installed engine on the cases' checkpoints and say what it did, as a doctor verdict.

``observed`` turns one engine's result on one checkpoint into ``keeps`` / ``approximates`` / ``loses`` /
``fails``: ``fails`` when it raised while building or at a length within the context it accepts,
``loses`` when it built from another rope type or base than the checkpoint means, ``approximates`` when
its cos/sin differ from transformers 5's at one of :data:`cases.LENGTHS` or its default context is not
the extended one, else ``keeps``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from . import cases

TOLERANCE = 1e-3
RUNNER = Path(__file__).with_name("run_engine.py")


def engine_dir(key: str) -> Path:
    return cases.ROOT / cases.INSTALLS[key][1]


def missing() -> list[str]:
    """What ``make engines`` did not install here."""
    out = [str(engine_dir(k)) for k in cases.INSTALLS if not engine_dir(k).is_dir()]
    if any(tf for _, _, tf in cases.INSTALLS.values()) and not (cases.TF4 / "transformers").is_dir():
        out.append(str(cases.TF4))
    return out


def run(key: str, directories: list[Path], out: Path) -> dict:
    """The engine's results (:mod:`run_engine`) on these checkpoints, in a subprocess."""
    kind, target, tf = cases.INSTALLS[key]
    path = [str(engine_dir(key))] + ([str(cases.TF4)] if tf else []) + [str(cases.ROOT / cases.DEPS)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    lengths = ",".join(str(n) for n in cases.LENGTHS)
    cmd = [sys.executable, str(RUNNER), kind, str(out), lengths, *map(str, directories)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{key} runner failed:\n{done.stderr[-3000:]}")
    return torch.load(out, weights_only=False)


def reference(directory: Path) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """transformers 5's cos/sin [n, head_dim/2] (attention factor included) for each length."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = transformers.AutoConfig.from_pretrained(directory)
    rotary = LlamaRotaryEmbedding(config)
    out = {}
    for n in cases.LENGTHS:
        x = torch.zeros(1, n, 1)
        cos, sin = rotary(x, torch.arange(n)[None])
        half = cos.shape[-1] // 2
        out[n] = (cos[0, :, :half].float(), sin[0, :, :half].float())
    return out


def deltas(result: dict, ref: dict) -> dict[int, float | str]:
    out: dict[int, float | str] = {}
    for n, got in result["tables"].items():
        if isinstance(got, str):
            out[n] = got
        else:
            out[n] = max((got[0] - ref[n][0]).abs().max().item(), (got[1] - ref[n][1]).abs().max().item())
    return out


def observed(result: dict, ref: dict, intent: dict, extended: int) -> tuple[str, str]:
    """(verdict, what happened) for one engine on one checkpoint; ``intent`` is its rope_parameters."""
    if "error" in result:
        return "fails", result["error"].splitlines()[0]
    # lengths beyond the engine's default context are refused by it (a context that differs is judged below)
    found = {n: d for n, d in deltas(result, ref).items() if n <= result["context"]}
    read = result["read"]
    kind = read.get("rope_type") or read.get("type") or "default"
    if (
        kind != intent.get("rope_type", "default")
        or abs(read["rope_theta"] - intent["rope_theta"]) > 1e-6 * intent["rope_theta"]
    ):
        return "loses", f"built {result['class']} with base {read['rope_theta']:g}"
    errors = {n: d for n, d in found.items() if isinstance(d, str)}
    if errors:
        n = min(errors)
        return "fails", f"{errors[n]} at n = {n} (context {result['context']})"
    worst = max(found, key=found.get)
    if found[worst] > TOLERANCE:
        return "approximates", f"cos/sin off by {found[worst]:.3g} at n = {worst}"
    if result["context"] != extended:
        return "approximates", f"default context {result['context']} instead of {extended}"
    return "keeps", f"cos/sin within {TOLERANCE:g} at every n; context {result['context']}"
