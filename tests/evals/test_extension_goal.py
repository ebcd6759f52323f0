"""Issue 41's goal, part by part, on synthetic numbers: met, not met, and met only because the control
overfits (its held-out curve rising at the measured step), which does not count."""

from __future__ import annotations

import json

from extension_goal import (
    MET,
    MISSING,
    NOT_COUNTED,
    NOT_MET,
    CurvePoint,
    goal_parts,
    heldout_curve,
    still_improving,
    verdict,
)

from ropescale.evals.advice.evidence import CONTROL, FINE_TUNED, Measured

L = 8192
TASKS = ("niah_single_1", "vt")


def _rows(ft16=24.0, ft32=24.1, ft2=22.3, c8=24.0, c2=22.2, pk32=1.0) -> list[Measured]:
    full = {4096: 30, 8192: 30, 16384: 30, 32768: 30}
    return [
        Measured("none", "default", ppl={2048: 28.0, 8192: 27.0}, passkey={4096: 0.9, 8192: 0.8}, passkey_trials=full),
        Measured(
            FINE_TUNED,
            "yarn",
            4,
            ppl={2048: ft2, 8192: 23.9, 16384: ft16, 32768: ft32},
            passkey={4096: 1.0, 8192: 1.0, 16384: 1.0, 32768: pk32},
            passkey_trials=full,
        ),
        Measured(CONTROL, "default", ppl={2048: c2, 8192: c8}, passkey={4096: 1.0, 8192: 1.0}, passkey_trials=full),
    ]


def _curve(*ppl: float) -> list[CurvePoint]:
    return [CurvePoint(50 * (i + 1), L, p) for i, p in enumerate(ppl)]


IMPROVING = {FINE_TUNED: _curve(30.0, 26.0, 24.5, 24.2), CONTROL: _curve(26.0, 24.8, 24.2, 24.0)}


def _ruler(ft_long=0.7, none_L=0.6) -> dict:
    return {
        "none": {t: {L: none_L} for t in TASKS},
        FINE_TUNED: {t: {L: 0.7, 16384: ft_long, 32768: ft_long} for t in TASKS},
        CONTROL: {t: {L: 0.65} for t in TASKS},
    }


def _status(parts) -> list[str]:
    return [p.status for p in parts]


def test_every_part_met_while_both_curves_still_improve():
    parts = goal_parts(_rows(), L, IMPROVING, _ruler())
    assert _status(parts) == [MET] * len(parts) and len(parts) == 7  # ppl long, ppl 2k, RULER, 4 passkey lengths
    assert verdict(parts) == "goal: met (every part)"
    assert "worst 24.10 = 1.004 × 24.00" in parts[0].detail and "both still improving" in parts[0].detail
    assert parts[2].detail.startswith("16k 70.0, 32k 70.0 vs 60.0")


def test_parts_not_met_are_named_with_their_numbers():
    parts = goal_parts(_rows(ft32=24.5, ft2=22.6, pk32=0.5), L, IMPROVING, _ruler(ft_long=0.55))
    status = dict(zip([p.part for p in parts], _status(parts)))
    assert status["PPL at 16k, 32k ≤ 1.01 × control's PPL(8k)"] == NOT_MET  # 24.5 > 24.24
    assert status["PPL(2k) ≤ 1.01 × control's"] == NOT_MET  # 22.6 > 22.42
    assert status["RULER mean at 16k, 32k ≥ the unscaled model's at 8k"] == NOT_MET
    assert status["passkey at 32k ≥ the unscaled model's at 8k"] == NOT_MET
    assert status["passkey at 16k ≥ the unscaled model's at 8k"] == MET
    assert verdict(parts).startswith("goal: not met yet (4 of 7 parts")


def test_a_ratio_met_only_because_the_control_overfits_does_not_count():
    """The fine-tune is within 1 % of the control's 8k perplexity, but the control's held-out perplexity
    has risen since its best point: the bar was lowered by a control that got worse."""
    overfit = {FINE_TUNED: IMPROVING[FINE_TUNED], CONTROL: _curve(26.0, 24.0, 24.2, 24.4)}
    part = goal_parts(_rows(c8=24.4), L, overfit, _ruler())[0]
    assert part.status == NOT_COUNTED and "the control overfits" in part.detail
    assert "24.200 at step 150 → 24.400 at step 200; lowest 24.000 at step 100" in part.detail
    # the fine-tune no longer improving does not count either, and it is named
    flat = {FINE_TUNED: _curve(30.0, 24.0, 24.1), CONTROL: IMPROVING[CONTROL]}
    assert "fine-tuned yarn no longer improves" in goal_parts(_rows(), L, flat, _ruler())[0].detail
    # a ratio that is not met stays NOT met whatever the curves
    assert goal_parts(_rows(ft16=25.0), L, overfit, _ruler())[0].status == NOT_MET


def test_missing_curves_ruler_cells_or_partial_passkey_are_not_judged():
    parts = goal_parts(_rows(), L, {FINE_TUNED: IMPROVING[FINE_TUNED]}, {})
    assert parts[0].status == MISSING and "fewer than two held-out points" in parts[0].detail
    assert parts[2].status == MISSING
    rows = _rows()
    rows[1].passkey_trials[32768] = 12
    assert goal_parts(rows, L, IMPROVING, _ruler())[-1].status == "in progress"
    # the measured step must be on the curve
    ok, why = still_improving(IMPROVING[CONTROL], step=175)
    assert ok is None and "no held-out point at step 175" in why
    assert still_improving(IMPROVING[CONTROL], step=150)[0] is True


def test_heldout_curve_reads_the_runs_evaluations(tmp_path):
    lines = [
        {"step": 50, "loss": 3.0},
        {"step": 50, "eval_length": 32768, "eval_ppl": 30.0, "eval_tokens": 1, "eval_seconds": 1},
        {"step": 100, "eval_length": 32768, "eval_ppl": 29.0, "eval_tokens": 1, "eval_seconds": 1},
        {"step": 100, "eval_length": 32768, "eval_ppl": 28.5, "eval_tokens": 1, "eval_seconds": 1},  # resumed
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 1')
    assert heldout_curve(tmp_path) == [CurvePoint(50, 32768, 30.0), CurvePoint(100, 32768, 28.5)]
    assert heldout_curve(tmp_path / "nowhere") == []


def test_a_length_the_protocol_asks_for_and_not_measured_is_not_judged_on_the_others():
    """x8: the 64k cells not yet measured; 16k and 32k meeting the bar is not the goal met."""
    asked = {"ppl": [2048, 8192, 16384, 32768, 65536], "passkey": [4096, 8192, 16384, 32768, 65536]}
    asked["ruler"] = asked["passkey"]
    parts = goal_parts(_rows(), L, IMPROVING, _ruler(), lengths=asked)
    assert parts[0].part == "PPL at 16k, 32k, 64k ≤ 1.01 × control's PPL(8k)" and parts[0].status == MISSING
    assert parts[2].part.startswith("RULER mean at 16k, 32k, 64k") and parts[2].status == MISSING
    assert [p.status for p in parts if "passkey at 64k" in p.part] == [MISSING]
    assert goal_parts(_rows(), L, IMPROVING, _ruler(), lengths={"ppl": [2048, 8192, 16384, 32768]})[0].status == MET
