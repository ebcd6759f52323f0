"""``ropescale eval perplexity|passkey|needle --dry-run``: the plan per length, loading nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ropescale.cli.main import main
from ropescale.models import plan

SHAPES = Path(__file__).resolve().parents[1] / "data" / "shapes"


def _rows(out: str) -> dict[int, list[str]]:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\| +(\d+) \|(.*)\|$", line)
        if m:
            rows[int(m[1])] = [c.strip() for c in m[2].split("|")]
    return rows


@pytest.mark.parametrize("shape", ["llama3-8b", "qwen2.5-7b", "qwen3-8b", "mistral-7b-v0.3"])
def test_passkey_plan_per_length(shape, capsys, tmp_path):
    model = SHAPES / shape
    argv = ["eval", "passkey", "--model", str(model), "--method", "yarn", "--factor", "4"]
    argv += ["--lengths", "32768,65536,131072", "--trials", "2", "--output", str(tmp_path / "o"), "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows) == {32768, 65536, 131072}
    assert all(r[3] == "10" for r in rows.values())  # 5 default depths x 2 trials
    peaks = [float(rows[n][0].split()[0]) for n in sorted(rows)]
    assert peaks == sorted(peaks) and "KV cache" in out
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


def test_perplexity_forwards_follow_the_protocol(capsys):
    base = ["eval", "perplexity", "--model", str(SHAPES / "llama3-8b"), "--lengths", "32768", "--dry-run"]
    assert main([*base, "--mode", "nonoverlap"]) == 0
    assert _rows(capsys.readouterr().out)[32768][3] == "4"
    assert main(base) == 0  # yarn protocol: a window every 256 tokens over 4 windows' worth of text
    assert _rows(capsys.readouterr().out)[32768][3] == str(4 * 32768 // 256)


def test_a_length_that_does_not_fit_says_so(capsys):
    argv = ["eval", "passkey", "--model", str(SHAPES / "qwen3-8b"), "--lengths", "131072", "--dry-run"]
    assert main([*argv, "--gpu", "rtx4090-24gb"]) == 0
    assert _rows(capsys.readouterr().out)[131072][1].startswith("NO: needs")
    assert main([*argv, "--gpu", "h200-141gb"]) == 0
    assert _rows(capsys.readouterr().out)[131072][1] == "yes"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--gpu", "v100"], "unknown --gpu 'v100'"),
        (["--model", "no-such-org/no-such-model"], "no config for 'no-such-org/no-such-model'"),
    ],
)
def test_what_cannot_be_planned_is_one_line(extra, fragment, capsys):
    argv = ["eval", "perplexity", "--model", str(SHAPES / "llama3-8b"), "--lengths", "4096", "--dry-run", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_kv_cache_of_the_plan():
    shape = plan.Shape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256)
    est = plan.eval_estimate(shape, 65536)
    assert est.parts["KV cache"] == 8 * 2**30  # 2 x 32 layers x 65536 x 1024 x 2 B


def test_gpu_without_dry_run_is_refused(capsys):
    argv = ["eval", "perplexity", "--model", str(SHAPES / "llama3-8b"), "--lengths", "4096", "--gpu", "h200-141gb"]
    assert main(argv) == 2
    assert "--gpu plans a run: add --dry-run" in capsys.readouterr().err
    train = ["train", "--config", "llama3-8b/yarn_x4", "--gpus", "8"]
    assert main(train) == 2
    assert "--gpu and --gpus plan a run (--dry-run)" in capsys.readouterr().err


def test_a_passkey_length_the_run_refuses_is_refused_by_the_plan(tmp_path, capsys):
    """The plan checks the lengths against the tokenizer with the run's own check (Task.check_lengths):
    a 1-token passkey never "fits" in the plan and then fails after the weights."""
    import transformers

    from tests.export.conftest import tiny_llama, tiny_tokenizer

    model = tmp_path / "tiny"
    tiny_llama().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    capsys.readouterr()
    argv = ["eval", "passkey", "--model", str(model), "--lengths", "1,300", "--output", str(tmp_path / "o")]
    assert main([*argv, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    line = "ropescale: error: length 1 is too short for the passkey prompt: BOS, task, needle and question take "
    assert "plan:" not in out and err.startswith(line) and len(err.strip().splitlines()) == 1, err
    assert main(["eval", "passkey", "--model", str(model), "--lengths", "300", "--dry-run"]) == 0
    assert _rows(capsys.readouterr().out)[300][1] == "yes"

    def never(*args, **kwargs):
        raise AssertionError("weights loaded before the length was refused")

    transformers_load = transformers.AutoModelForCausalLM.from_pretrained
    try:
        transformers.AutoModelForCausalLM.from_pretrained = never
        assert main([*argv, "--no-progress"]) == 2
    finally:
        transformers.AutoModelForCausalLM.from_pretrained = transformers_load
    assert capsys.readouterr().err.strip() == err.strip() and not (tmp_path / "o").exists()
