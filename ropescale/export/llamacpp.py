"""Checking an exported GGUF against llama.cpp: its perplexity protocol reproduced in torch, and
thin wrappers around the ``llama-perplexity`` and ``llama-tokenize`` binaries.

llama-perplexity (``tools/perplexity/perplexity.cpp``) tokenizes the whole text (special tokens
added as the vocabulary says), cuts it into windows of ``n_ctx`` tokens, replaces the first token
of each window by BOS when the vocabulary adds BOS, and scores only the second half of each window:
the logits at positions n/2 .. n−2 predict tokens n/2+1 .. n−1 (n/2 − 1 tokens per window).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FINAL_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
#: the running perplexity printed after each window: ``[1]39.7566,`` (with --chunks 1, the result)
RUNNING_PPL = re.compile(r"\[(\d+)\]([0-9.]+),")


def perplexity_protocol_nll(
    model: Any, ids: Sequence[int], n_ctx: int, bos_token_id: int | None = None, chunks: int = 1
) -> tuple[float, int]:
    """Summed NLL and scored token count of ``ids`` under llama-perplexity's protocol.

    Args:
        model: a causal LM (``lm_head`` + decoder), already scaled.
        ids: the token ids of the whole text, as the tokenizer gives them with special tokens.
        n_ctx: the window (llama-perplexity's ``-c``).
        bos_token_id: BOS to put at each window's start, or None when the vocabulary adds none.
        chunks: windows to score (``--chunks``).

    Returns:
        ``(total_nll, n_scored)``; the perplexity is ``exp(total_nll / n_scored)``.
    """
    import torch

    from ..scoring.nll import IGNORE_INDEX
    from ..scoring.perplexity import chunked_nll

    if len(ids) < 2 * n_ctx:  # llama-perplexity refuses shorter texts
        raise ValueError(
            f"llama-perplexity needs at least {2 * n_ctx} tokens for n_ctx={n_ctx}, the text has {len(ids)}"
        )
    first, total, count = n_ctx // 2, 0.0, 0
    for chunk in range(min(chunks, len(ids) // n_ctx)):
        window = list(ids[chunk * n_ctx : (chunk + 1) * n_ctx])
        if bos_token_id is not None:
            window[0] = bos_token_id
        x = torch.tensor([window])
        labels = torch.full_like(x, IGNORE_INDEX)
        labels[0, first + 1 :] = x[0, first + 1 :]  # position t predicts labels[t + 1], t = n/2 .. n-2
        with torch.inference_mode():
            nll, n = chunked_nll(model, x, labels)
        total, count = total + nll, count + n
    return total, count


#: A destructor that waits 0.3 s when the process exits. llama.cpp's logger writes from a thread and
#: is never shut down (llama.cpp issue 22142), so a tool's last lines (llama-perplexity's result) are
#: often lost when the machine is busy; preloading this gives that thread time to write them.
_EXIT_DELAY_C = "#include <unistd.h>\n__attribute__((destructor)) static void wait_for_log(void) { usleep(300000); }\n"


def exit_delay_library() -> Path | None:
    """The compiled exit-delay shim (built once into the cache with ``cc``), or None without a compiler."""
    from .._io import cache_root

    target = cache_root() / "llamacpp" / "exit-delay.so"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if target.is_file() or compiler is None:
        return target if target.is_file() else None
    target.parent.mkdir(parents=True, exist_ok=True)
    source = target.with_name(f".exit-delay-{os.getpid()}.c")
    partial = target.with_name(f".exit-delay-{os.getpid()}.so")
    try:
        source.write_text(_EXIT_DELAY_C)
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(partial), str(source)], capture_output=True, check=False
        )
        if proc.returncode != 0:
            return None
        os.replace(partial, target)
        return target
    finally:
        source.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)


def run_llama_perplexity(
    binary: str | Path,
    gguf: str | Path,
    text: str | Path,
    n_ctx: int,
    threads: int = 2,
    batch: int = 2048,
    chunks: int = 1,
) -> tuple[float, float, str]:
    """Run llama-perplexity with no rope flags; return (PPL, its ±, the full output)."""
    cmd = [
        str(binary),
        "-m",
        str(gguf),
        "-f",
        str(text),
        "-c",
        str(n_ctx),
        "-b",
        str(min(batch, n_ctx)),
        "--chunks",
        str(chunks),
        "-t",
        str(threads),
    ]
    env = dict(os.environ)
    shim = exit_delay_library()
    if shim is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), str(shim)]))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    output = " ".join(cmd) + "\n\n" + proc.stdout + proc.stderr
    text_out = proc.stdout + proc.stderr
    final, running = FINAL_PPL.search(text_out), RUNNING_PPL.findall(text_out)
    # should the final line still be lost, the running value after the last window is the same number
    if proc.returncode != 0 or not (final or running):
        tail = " | ".join(text_out.strip().splitlines()[-3:])
        raise RuntimeError(f"llama-perplexity failed (rc={proc.returncode}): {tail}")
    if final:
        return float(final.group(1)), float(final.group(2)), output
    return float(running[-1][1]), float("nan"), output


def llama_tokenize(binary: str | Path, gguf: str | Path, text: str | Path) -> list[int]:
    """llama.cpp's token ids for a text file (``llama-tokenize --ids``, special tokens added)."""
    proc = subprocess.run(
        [str(binary), "-m", str(gguf), "-f", str(text), "--ids", "--log-disable"],
        capture_output=True,
        text=True,
        check=False,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("[")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"llama-tokenize failed (rc={proc.returncode}): {proc.stderr.strip()[-200:]}")
    return json.loads(line)
