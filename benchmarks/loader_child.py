"""Load checkpoints with plain ``transformers.AutoModelForCausalLM`` and save their logits.

Run by ``benchmarks/loader_parity.py`` (and its test) in a subprocess whose ``PYTHONPATH`` puts
another transformers first (4.57, from ``make tf4``), so it imports nothing from ropescale: what it
measures is what a user of that transformers gets from ``from_pretrained(dir)`` alone.

    python benchmarks/loader_child.py IDS.pt OUT_DIR CHECKPOINT_DIR...

Writes ``OUT_DIR/<checkpoint name>.pt`` (fp32 logits [b, s, vocab]) for each checkpoint that loads
and ``OUT_DIR/report.json``: the transformers version and, per checkpoint, the rope type and base its
rotary module was built with, or the one-line error that stopped the load.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers


def rotary_facts(model) -> dict:
    """The rope type and base the loaded model's rotary module was built with, as this transformers read them."""
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    config = model.config
    if int(transformers.__version__.split(".")[0]) >= 5:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    else:  # 4.x builds from the top-level rope_theta (a rope_parameters key in config.json is ignored)
        theta = getattr(config, "rope_theta", None)
    return {
        "rope_type": getattr(rotary, "rope_type", None),
        "rope_theta": float("nan") if theta is None else float(theta),
        "attention_scaling": float(getattr(rotary, "attention_scaling", 1.0)),
    }


def main(argv: list[str]) -> int:
    ids_path, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.load(ids_path, weights_only=True)  # a tensor: nothing in the file runs
    report = {"transformers": transformers.__version__, "checkpoints": {}}
    for directory in map(Path, argv[2:]):
        try:  # `dtype` (4.56+ and 5; 4.x's older `torch_dtype` is deprecated)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                directory, attn_implementation="eager", dtype=torch.float32
            )
            with torch.no_grad():
                logits = model.eval()(ids, use_cache=False).logits
            torch.save(logits, out / f"{directory.name}.pt")
            report["checkpoints"][directory.name] = {"ok": True, **rotary_facts(model)}
        except Exception as exc:  # noqa: BLE001 - a checkpoint this transformers cannot load is a result
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            report["checkpoints"][directory.name] = {"ok": False, "error": f"{type(exc).__name__}: {first}"}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
