"""benchmarks/niah_pair.py: two RULER cells of the same prompts compared (issue 51 point 5's verdict)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def _cell(path, scores, answers=None):
    answers = answers or [str(1000 + i) for i in range(len(scores))]
    records = [{"index": i, "outputs": [a], "score": s} for i, (a, s) in enumerate(zip(answers, scores))]
    path.write_text(json.dumps({"schema": "ropescale.ruler.cell/1", "cell": {"records": records}}))
    return path


def test_the_pair_is_read_prompt_by_prompt(tmp_path, capsys):
    pair = load_script("benchmarks/niah_pair.py")
    a = _cell(tmp_path / "a.json", [1.0] * 25 + [0.0] * 5)
    b = _cell(tmp_path / "b.json", [1.0] * 20 + [0.0] * 10)
    assert pair.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("a.json: 25/30 = 83.3% [") and out[1].startswith("b.json: 20/30 = 66.7% [")
    assert out[2].startswith("difference (first - second): +16.7%, 95% [")
    assert out[3].startswith(
        "discordant prompts: 5 found by the first only, 0 by the second only; McNemar exact p = 0.062"
    )


def test_cells_of_other_prompts_are_refused(tmp_path):
    pair = load_script("benchmarks/niah_pair.py")
    a = _cell(tmp_path / "a.json", [1.0, 0.0])
    b = _cell(tmp_path / "b.json", [1.0, 0.0], answers=["1", "2"])
    with pytest.raises(SystemExit, match="do not hold the same prompts"):
        pair.main([str(a), str(b)])
