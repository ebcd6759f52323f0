"""ropescale/training/convergence.py: the held-out curve's rule, its t quantile against scipy (an independent
reference), and the line `ropescale train` ends with."""

from __future__ import annotations

import json
import math

import pytest

from ropescale.training.convergence import (
    convergence_line,
    curve_falling,
    fall_tolerance,
    heldout_records,
    paired_change,
    t975,
)


def test_the_t_quantile_matches_scipy_at_every_degree_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    for df in [*range(1, 61), 80, 100, 200, 1000, 10**6]:
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4), df
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def _point(step: int, windows: list[float]) -> dict:
    return {"step": step, "eval_ppl": math.exp(sum(windows) / len(windows)), "eval_window_nll": windows}


def test_the_interval_is_students_and_the_tolerance_a_rate():
    before, last = _point(40, [3.0, 3.1, 3.2, 3.3]), _point(80, [2.999, 3.098, 3.199, 3.296])
    mean, half, n = paired_change(before, last)
    d = [-0.001, -0.002, -0.001, -0.004]
    assert n == 4 and mean == pytest.approx(sum(d) / 4)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert half == pytest.approx(3.182446 * sd / 2)  # t at 3 degrees of freedom, not 2 (the old rule)
    assert fall_tolerance(40) == pytest.approx(math.log(1.0025)) and fall_tolerance(20) == fall_tolerance(40) / 2
    assert paired_change(before, {**last, "eval_window_nll": [3.0]}) is None  # no spread to measure


def test_train_says_whether_the_logged_curve_levelled_off(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert convergence_line(run) is None  # no log
    lines = [{"step": 1, "loss": 2.0}, _point(40, [3.0, 3.1, 3.2, 3.3]), _point(80, [2.9, 3.0, 3.1, 3.2])]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 8', encoding="utf-8")
    assert len(heldout_records(run)) == 2  # the cut last line is skipped
    said = convergence_line(run)
    assert said.startswith("held-out curve may still fall: ") and "raise train.max_steps and --resume" in said
    flat = _point(120, [2.9001, 2.9999, 3.1002, 3.1998])
    with (run / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write("\n" + json.dumps(flat) + "\n")
    assert curve_falling(heldout_records(run))[0] is False
    said = convergence_line(run)
    assert said.startswith("held-out curve flat at its last point: ") and "at step 80 → " in said and "excludes" in said
