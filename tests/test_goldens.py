"""What users see stays byte for byte what it was while the house is rebuilt (issue 53).

Each case runs one CLI command in this process and compares its standard output, and the files it
writes that users read (a patched ``config.json``; an evaluation's ``results.json`` and ``report.md``),
with the copies in tests/data/goldens/ taken before the refactor began. Only what differs from run to
run is masked: temporary paths, ropescale's version, timings, load averages and dates.

A change of behaviour asked by an issue regenerates them in a commit of its own::

    ROPESCALE_UPDATE_GOLDENS=1 python -m pytest tests/test_goldens.py
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ropescale import __version__
from ropescale.cli.main import main

HERE = Path(__file__).parent
GOLDENS = HERE / "data" / "goldens"
SHAPES = HERE / "data" / "shapes"
UPDATE = os.environ.get("ROPESCALE_UPDATE_GOLDENS") == "1"


def shape(name: str) -> str:
    return str(SHAPES / name)


#: name -> (argv, files under the output folder to compare); "{out}" is a fresh folder, "{tiny}" a tiny model
CASES: dict[str, tuple[list[str], list[str]]] = {
    "patch-smollm2-yarn4": (["patch", "--model", shape("smollm2-135m"), "--factor", "4", "--verbose"], []),
    "patch-llama3.1-yarn2-composed": (["patch", "--model", shape("llama3.1-8b"), "--factor", "2"], []),
    "patch-llama3.1-yarn16-replaced": (
        ["patch", "--model", shape("llama3.1-8b"), "--method", "yarn", "--factor", "16", "--replace"],
        [],
    ),
    "patch-qwen3-yarn-target-256k": (["patch", "--model", shape("qwen3-8b-yarn"), "--target-length", "262144"], []),
    "patch-mistral-linear-no-window": (
        [
            "patch",
            "--model",
            shape("mistral-7b-v0.1"),
            "--method",
            "linear",
            "--factor",
            "2",
            "--sliding-window",
            "none",
        ],
        [],
    ),
    "patch-llama2-longrope": (["patch", "--model", shape("llama2-7b"), "--method", "longrope", "--factor", "8"], []),
    "patch-llama3-self-extend": (
        ["patch", "--model", shape("llama3-8b"), "--method", "self_extend", "--factor", "4"],
        [],
    ),
    "patch-llama3-dynamic-yarn": (
        [
            "patch",
            "--model",
            shape("llama3-8b"),
            "--method",
            "dynamic_yarn",
            "--factor",
            "4",
            "--param",
            "kv_consistent=true",
        ],
        [],
    ),
    "patch-config-llama3.1-composed": (
        ["patch", "--model", shape("llama3.1-8b"), "--factor", "4", "--output", "{out}", "--config-only"],
        ["config.json"],
    ),
    "patch-config-qwen2.5-yarn-params": (
        [
            "patch",
            "--model",
            shape("qwen2.5-7b"),
            "--factor",
            "4",
            "--param",
            "beta_fast=16",
            "--original-max-position-embeddings",
            "32768",
            "--output",
            "{out}",
            "--config-only",
        ],
        ["config.json"],
    ),
    "patch-config-llama3-llama3-rope": (
        [
            "patch",
            "--model",
            shape("llama3-8b"),
            "--method",
            "llama3",
            "--target-length",
            "65536",
            "--output",
            "{out}",
            "--config-only",
        ],
        ["config.json"],
    ),
    "patch-config-nemo-string": (
        [
            "patch",
            "--model",
            shape("mistral-nemo-12b"),
            "--method",
            "string",
            "--factor",
            "2",
            "--replace",
            "--param",
            "frequencies=yarn",
            "--output",
            "{out}",
            "--config-only",
        ],
        ["config.json"],
    ),
    "recommend-smollm2-32k": (["recommend", "--target-length", "32768"], []),
    "recommend-llama3.1-256k": (["recommend", "--model", shape("llama3.1-8b"), "--target-length", "262144"], []),
    "recommend-qwen3-128k": (["recommend", "--model", shape("qwen3-8b"), "--target-length", "131072", "--verbose"], []),
    "eval-plan-llama3.1": (
        [
            "eval",
            "perplexity",
            "--model",
            shape("llama3.1-8b"),
            "--methods",
            "yarn",
            "--factor",
            "2",
            "--lengths",
            "4k",
            "--dry-run",
        ],
        [],
    ),
    "eval-perplexity-tiny": (
        [
            "eval",
            "perplexity",
            "--model",
            "{tiny}",
            "--methods",
            "none,yarn,linear",
            "--factor",
            "2",
            "--lengths",
            "128,512",
            "--data",
            "{text}",
            "--output",
            "{out}",
        ],
        ["results.json", "report.md"],
    ),
    # RULER: the unscaled run first (PRE), then yarn into the same folder, whose report adds retention
    "eval-ruler-tiny": (
        [
            "eval",
            "ruler",
            "--model",
            "{ruler}",
            "--method",
            "yarn",
            "--factor",
            "2",
            "--tasks",
            "niah_single_1,fwe",
            "--lengths",
            "1k",
            "--samples",
            "2",
            "--device",
            "cpu",
            "--no-progress",
            "--output",
            "{out}",
        ],
        ["results.json", "report.md"],
    ),
    "eval-longppl-tiny": (
        [
            "eval",
            "longppl",
            "--model",
            "{tiny}",
            "--methods",
            "none,yarn",
            "--factor",
            "2",
            "--lengths",
            "200",
            "--data",
            "{text}",
            "--trunc-len",
            "64",
            "--internal",
            "32",
            "--device",
            "cpu",
            "--output",
            "{out}",
        ],
        ["results.json", "report.md"],
    ),
}

#: name -> commands run first into the same folder (their output is not compared)
PRE: dict[str, list[list[str]]] = {
    "eval-ruler-tiny": [
        [
            "eval",
            "ruler",
            "--model",
            "{ruler}",
            "--method",
            "none",
            "--tasks",
            "niah_single_1,fwe",
            "--lengths",
            "1k",
            "--samples",
            "2",
            "--device",
            "cpu",
            "--no-progress",
            "--output",
            "{out}",
        ]
    ],
}

_VOLATILE = (
    r'"(seconds|elapsed|elapsed_s|load_avg|created|started|finished|date|time_s|tokens_per_s|tokens_per_second|wall_s|duration_s)": '
    r'(\[[^\]]*\]|"[^"]*"|[-0-9.eE+]+|null)'
)


def mask(text: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "<TMP>")
    if len(tmp.parts) > 2:  # pytest's base folder, wherever TMPDIR is
        text = text.replace(str(tmp.parent), "<BASETEMP>")
    text = text.replace(str(HERE.parent), "<ROOT>").replace(__version__, "<VERSION>")
    text = re.sub(_VOLATILE, r'"\1": "<volatile>"', text)
    text = re.sub(r"\b20\d\d-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:\d\d)?", "<DATE>", text)
    text = re.sub(r"\b\d+(\.\d+)? ?(s|min) (a |per )?(cell|step)\b", "<TIME>", text)
    text = re.sub(r"\((\d+(\.\d+)? ?(s|min)|\d+ min \d+ s)\)", "(<TIME>)", text)  # a cell's time
    text = re.sub(r"\bin \d+(\.\d+)? ?(s|min)\b", "in <TIME>", text)  # "finished 6/6 cells in 25 s"
    text = re.sub(r"pytest-of-[\w-]+[/-]pytest-\d+", "<PYTEST>", text)  # names made from a temporary path
    text = re.sub(r"perplexity-[\w.<>-]*golden\d+-tiny", "perplexity-<TINY-NAME>", text)  # wherever TMPDIR is
    text = re.sub(r"ruler-[\w.<>-]*golden-ruler\d+-ruler", "ruler-<RULER-NAME>", text)  # wherever TMPDIR is
    text = re.sub(r"longppl-[\w.<>-]*golden\d+-tiny", "longppl-<TINY-NAME>", text)  # wherever TMPDIR is
    # converting the embedded model happens once per cache: whether this case sees it depends on the order
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("ropescale: converting"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Llama with the evaluation tests' byte-level tokenizer (both deterministic)."""
    from tests.evals.conftest import _train, sharpened_tiny_llama

    tok = _train("bytelevel")
    model = sharpened_tiny_llama(tok)
    path = tmp_path_factory.mktemp("golden") / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    from tests.evals.conftest import CORPUS

    (path.parent / "text.txt").write_text(" ".join(CORPUS))
    return path


@pytest.fixture(scope="module")
def ruler_model(tmp_path_factory):
    """The RULER tests' tiny model: its tokenizer is trained on lm-eval's RULER wording, so prompts fit 1k."""
    from tests.evals.ruler_fixtures import ruler_tokenizer, save_ruler_model

    return save_ruler_model(tmp_path_factory.mktemp("golden-ruler") / "ruler", ruler_tokenizer())


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_users_see_is_unchanged(name, capsys, tmp_path, tiny, monkeypatch, request):
    monkeypatch.setenv("COLUMNS", "100")
    argv, files = CASES[name]
    out = tmp_path / "out"
    ruler = request.getfixturevalue("ruler_model") if "{ruler}" in argv else ""

    def filled(args: list[str]) -> list[str]:
        return [
            a.replace("{out}", str(out))
            .replace("{tiny}", str(tiny))
            .replace("{ruler}", ruler)
            .replace("{text}", str(tiny.parent / "text.txt"))
            for a in args
        ]

    for before in PRE.get(name, []):
        assert main(filled(before)) == 0, capsys.readouterr().err[-1500:]
    capsys.readouterr()
    argv = filled(argv)
    code = main(argv)
    captured = capsys.readouterr()
    said = "".join(line + "\n" for line in captured.err.splitlines() if line.startswith("ropescale: error"))
    seen = {"stdout": f"exit {code}\n" + captured.out + said}
    missing = [f for f in files if not (out / f).is_file()]
    assert not missing, f"{name} wrote no {missing}: {captured.err[-1500:]}"
    for f in files:
        seen[f] = (out / f).read_text()
    for part, text in seen.items():
        golden = GOLDENS / name / (part if part != "stdout" else "stdout.txt")
        text = text.replace(str(Path(ruler).parent), "<RULER>") if ruler else text
        text = mask(text.replace(str(tiny.parent), "<TINY>"), tmp_path)
        if part == "results.json":  # measured floats: the last bits follow the CPU's kernels, not ropescale
            text = json.dumps(_rounded(json.loads(text)), indent=2, ensure_ascii=False) + "\n"
        if UPDATE:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(text)
            continue
        assert golden.is_file(), f"no golden {golden}: ROPESCALE_UPDATE_GOLDENS=1 takes it"
        assert text == golden.read_text(), f"{name}: {part} differs from {golden.relative_to(HERE.parent)}"


def _rounded(value):
    """``value`` with every float to 6 significant digits (a tiny model's perplexities differ in their last
    bits between CPUs whose BLAS kernels sum in another order)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_the_masks_leave_the_numbers_users_read():
    text = '{"ppl": 12.345, "seconds": 3.2, "load_avg": [1.2, 1.5], "factor": 4.0}'
    assert (
        mask(text, Path("/nowhere"))
        == '{"ppl": 12.345, "seconds": "<volatile>", "load_avg": "<volatile>", "factor": 4.0}'
    )
    assert json.loads(mask(text, Path("/nowhere")))["ppl"] == 12.345
