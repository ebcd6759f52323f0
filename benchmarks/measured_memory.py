"""Every training-memory cell measured so far, read from benchmarks/README.md, beside the plan's estimate.

    python benchmarks/measured_memory.py            # the calibration table (markdown)

The cells are the tables of the README's "Training memory per step" section, each under the
``bench_train_memory.py`` command that produced it (shape, device, options, tile and loss chunk come
from that command; the card from the text above it). ``tests/models/test_plan.py`` holds the plan
(:mod:`ropescale.models.plan`) within 15 % of every one; a new measured table in that section is a new
cell of the test, with nothing to copy by hand.

On CUDA a cell is ``torch.cuda.max_memory_allocated`` (weights included); on the CPU it is the growth
of the resident set during the step, so the plan's weights (loaded before the step) are left out there.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "benchmarks" / "README.md"
SECTION = "## Training memory per step"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # the benchmark's LoRA


def _command_args(command: str) -> dict[str, str]:
    words = shlex.split(command.replace("\\\n", " "))
    args = {}
    for i, word in enumerate(words):
        if word.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            args[word[2:]] = words[i + 1]
    return args


def cells(readme: Path = README) -> list[dict]:
    """One dict per measured (command, option, length): its settings and ``peak_mib``, ``tok_s``."""
    text = readme.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    lines = text[start : end if end > 0 else len(text)].splitlines()
    found, command, card, header = [], None, None, None
    i = 0
    while i < len(lines):
        line = lines[i]
        for name in re.findall(r"NVIDIA (H100|H200)", line):
            card = name
        if "bench_train_memory.py" in line and line.lstrip().startswith("python"):
            command = line.strip()
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
        elif re.match(r"\|\s*length\s*\|", line):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif header and re.match(r"\|\s*\d+\s*\|", line):
            values = [c.strip() for c in line.strip("|").split("|")]
            args = _command_args(command)
            for col, name in enumerate(header):
                if name.endswith(" peak MiB") and values[col].replace(",", "").isdigit():
                    option = name[: -len(" peak MiB")]
                    tok_col = header.index(f"{option} tok/s")
                    found.append(
                        {
                            "shape": args.get("shape", "tiny"),
                            "device": args.get("device", "cpu"),
                            "card": card if args.get("device") == "cuda" else "CPU",
                            "option": option,
                            "length": int(values[0]),
                            "tile": int(args["tile"]) if "tile" in args else None,
                            "loss_chunk": int(args.get("loss-chunk", 1024)),
                            "peak_mib": float(values[col].replace(",", "")),
                            "tok_s": float(values[tok_col].replace(",", "")),
                            "command": command,
                        }
                    )
        elif header and not line.startswith("|"):
            header = None
        i += 1
    return found


def estimate(cell: dict, shapes: dict) -> tuple[float, float]:
    """``(estimated peak MiB comparable with the cell, estimated tokens/s)`` (the benchmark's settings:
    LoRA r=16 on every linear layer, checkpointing, no optimizer step; bf16 on CUDA, fp32 on the CPU)."""
    from ropescale.models import plan

    raw = dict(shapes[cell["shape"]])
    shape = plan.Shape(
        hidden=raw["hidden_size"],
        intermediate=raw["intermediate_size"],
        layers=raw["num_hidden_layers"],
        heads=raw["num_attention_heads"],
        kv_heads=raw["num_key_value_heads"],
        head_dim=raw["hidden_size"] // raw["num_attention_heads"],
        vocab=raw["vocab_size"],
        tied=raw.get("tie_word_embeddings", False),
    )
    cuda = cell["device"] == "cuda"
    option = cell["option"]
    options = plan.Options(
        tokens=cell["length"],
        trainable=shape.lora_params(TARGETS, 16),
        weight_dtype="bfloat16" if cuda else "float32",
        autocast=cuda,
        checkpointing=option != "nockpt",
        offload="offload" in option and cuda,  # on the CPU the activations are in host memory already
        tile=(cell["tile"] or shape.hidden) if "tiled" in option else 0,
        loss_chunk=cell["loss_chunk"],
        optimizer=False,
    )
    card = plan.CARDS["h200-141gb" if cell["card"] == "H200" else "h100-80gb"]
    est = plan.train_estimate(shape, options, card)
    peak = est.peak if cuda else est.peak - est.parts["weights"]
    return peak / plan.MIB, plan.tokens_per_second(est)


def table(found: list[dict], shapes: dict) -> str:
    from ropescale import markdown

    rows = []
    for c in found:
        peak, tok_s = estimate(c, shapes)
        err = peak / c["peak_mib"] - 1
        speed = f"{tok_s:.0f}" if c["device"] == "cuda" else "(GPU only)"
        rows.append([c["shape"], c["card"], c["option"], c["length"], f"{c['peak_mib']:.0f}", f"{peak:.0f}"])
        rows[-1] += [f"{err:+.1%}", f"{c['tok_s']:.0f}", speed]
    heads = ["shape", "card", "option", "length", "measured MiB", "plan MiB", "error", "measured tok/s", "plan tok/s"]
    return markdown.table(heads, rows, align="lllrrrrrr")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_memory", ROOT / "benchmarks" / "bench_train_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    print(table(cells(), bench.SHAPES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
