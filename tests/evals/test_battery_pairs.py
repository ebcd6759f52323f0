"""benchmarks/battery_pairs.py (issue 54, part 3): the battery's methods compared on the same prompts, from the
shipped cells of both layouts; a pair of cells of different prompts is said, never compared."""

from __future__ import annotations

from tests.conftest import load_script


def test_the_shipped_battery_pairs_methods_on_their_prompts(capsys):
    pairs = load_script("benchmarks/battery_pairs.py")
    assert pairs.main(["--tasks", "niah_single_2[austen]"]) == 0
    out = capsys.readouterr().out
    assert "== niah_single_2[austen] at 16384: unscaled at 4096 96.7" in out
    assert "  string-x4-b3e24b74: 66.7 [49, 81], 69 % of base" in out  # the suite layout's cell
    assert "  self_extend-x4-cc7a0d2a vs string-x4-b3e24b74: 9 / 0, p = 0.0039" in out  # McNemar, exact
    assert "  dynamic_ntk-x4 vs string-x4-b3e24b74: 7 / 7, p = 1" in out


def test_cells_of_other_prompts_are_not_paired(capsys):
    pairs = load_script("benchmarks/battery_pairs.py")
    by = pairs.cells_by_task([], pairs.BATTERY)
    at_16k = by[("niah_single_2[austen]", 16384)]["yarn-x4"]
    at_4k = by[("niah_single_2[austen]", 4096)]["none"]  # another length: other haystacks and needles
    assert pairs.pair(at_16k, at_4k) is None
    assert pairs.pair(at_16k, at_16k) == (0, 0, 1.0)
