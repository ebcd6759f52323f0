"""benchmarks/heldout_plot.py: the CPU fine-tunes' held-out curves drawn as their convergence is judged
(issue 54): each step's paired change agrees with extension_cpu_goal's rule, shipped and run logs are read."""

from __future__ import annotations

import json

import pytest
from extension_cpu_goal import curve_falling, fall_tolerance, paired_change
from heldout_plot import curves_of, main, step_changes

POINTS = [
    {"step": 40, "eval_ppl": 26.0, "eval_length": 16384, "eval_window_nll": [3.30, 3.20, 3.25, 3.27]},
    {"step": 80, "eval_ppl": 25.0, "eval_length": 16384, "eval_window_nll": [3.26, 3.16, 3.22, 3.22]},
    {"step": 120, "eval_ppl": 24.9, "eval_length": 16384, "eval_window_nll": [3.27, 3.14, 3.23, 3.21]},
]


def _log(path, points, resumed_twice=False):
    lines = [{"step": 1, "loss": 2.5}, *points]
    if resumed_twice:  # a resumed run evaluates its last step again: the last line counts
        lines.append({**points[-1], "eval_ppl": 99.0})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 9, "lo', encoding="utf-8")


def test_each_change_is_the_paired_windows_mean_and_agrees_with_the_convergence_rule():
    changes = step_changes(POINTS)
    assert [s for s, _, _ in changes] == [80, 120]
    step, mean, half = changes[0]
    assert step == 80 and mean == pytest.approx(-0.04) and half > 0
    flat = {"step": 160, "eval_ppl": 24.9, "eval_window_nll": [3.2703, 3.1398, 3.2302, 3.2097]}  # precise
    points = [*POINTS, flat]
    said = [curve_falling(points[i : i + 2])[0] for i in range(3)]
    assert said == [True, True, False]  # a sure fall, one lost in the noise, a precise flat step
    for i, (_, mean, half) in enumerate(step_changes(points)):  # a bar reaching below the dashed line: "may fall"
        assert (mean - half < -fall_tolerance(40)) == said[i]
    assert step_changes([POINTS[0], {**POINTS[1], "eval_window_nll": [3.2]}]) == []  # no spread: no bar
    # every 80 steps (the x4 recipe): the bar is the rate per 40 steps, so one tolerance line still decides
    slow = [POINTS[2], {**flat, "step": 200, "eval_window_nll": [3.266, 3.1355, 3.2262, 3.2058]}]
    (_, rate, half), whole = step_changes(slow)[0], paired_change(*slow)
    assert rate == pytest.approx(whole[0] / 2) and half == pytest.approx(whole[1] / 2)
    assert curve_falling(slow)[0] is False and rate - half > -fall_tolerance(40)  # ~-0.004 in 80 steps: flat
    assert curve_falling([POINTS[2], {**slow[1], "step": 160}])[0] is True  # the same change in 40 steps


def test_shipped_logs_and_a_run_folder_are_read_and_named_and_the_png_is_written(tmp_path, capsys):
    _log(tmp_path / "ship" / "yarn-metrics.jsonl", POINTS, resumed_twice=True)
    _log(tmp_path / "ship" / "control-metrics.jsonl", POINTS[:2])
    _log(tmp_path / "runs" / "cpu-x2" / "yarn" / "metrics.jsonl", POINTS[:1])
    (tmp_path / "ship" / "other-metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n', encoding="utf-8")
    curves = curves_of([tmp_path / "ship", tmp_path / "runs" / "cpu-x2" / "yarn"])
    assert list(curves) == ["ship control", "ship yarn", "cpu-x2 yarn"]  # no held-out point: no curve
    assert [p["eval_ppl"] for p in curves["ship yarn"]] == [26.0, 25.0, 99.0]
    out = tmp_path / "plots" / "heldout.png"
    assert main([str(tmp_path / "ship"), "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ship yarn: 3 points, steps 40-120" in capsys.readouterr().out
    assert main([str(tmp_path / "runs"), "--output", str(tmp_path / "none.png")]) == 2  # nothing to draw
    assert not (tmp_path / "none.png").exists()
