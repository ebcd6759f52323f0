"""The needle tasks and RULER's string-match scoring."""

from __future__ import annotations

import pytest

from ropescale.evals.tasks.needle_tasks import METRICS, TASKS, get_task, string_match_all, string_match_part

# --------------------------------------------------------------------------- scoring

FOUR = ["1234567", "2345678", "3456789", "4567890"]


@pytest.mark.parametrize(
    "output, expected, score",
    [
        (" 1234567.", ["1234567"], 1.0),
        (": 1234567, and that is all", ["1234567"], 1.0),
        ("12345678", ["1234567"], 1.0),  # substring match, as in RULER
        ("1234566", ["1234567"], 0.0),
        ("123 4567", ["1234567"], 0.0),
        ("", ["1234567"], 0.0),
        ("The grass is green. The sky is blue.", ["1234567"], 0.0),
        ("\x00\x1f garbage ###", ["1234567"], 0.0),
        (" 1234567, 2345678, 3456789 and 4567890.", FOUR, 1.0),
        (" 4567890, 1234567, 3456789, 2345678", FOUR, 1.0),  # order does not matter
        (" 1234567, 3456789", FOUR, 0.5),
        (" 2345678 2345678 2345678", FOUR, 0.25),  # repeating one value does not count twice
        (" 9999999", FOUR, 0.0),
        ("Quiet-Lantern", ["quiet-lantern"], 1.0),  # case-insensitive
    ],
)
def test_string_match_all(output, expected, score):
    assert string_match_all(output, expected) == score


def test_string_match_part():
    assert string_match_part(" 3456789", FOUR) == 1.0
    assert string_match_part(" 1234567, 2345678", FOUR) == 1.0
    assert string_match_part("nothing", FOUR) == 0.0


@pytest.mark.parametrize("expected", [[], "1234567", [""], [1234567]])
def test_scoring_rejects_bad_expected(expected):
    for fn in (string_match_all, string_match_part):
        with pytest.raises(ValueError, match="expected must be a non-empty list"):
            fn("1234567", expected)


def test_tasks_and_their_metric():
    assert list(TASKS) == ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"]
    multikey = get_task("niah_multikey")
    assert (multikey.num_needles, multikey.num_expected) == (4, 1) and METRICS[multikey.metric] is string_match_all
    assert get_task("niah_multivalue").num_expected == 4
    with pytest.raises(ValueError, match=r"unknown needle task 'niah_singel' \(did you mean 'niah_single'\?\)"):
        get_task("niah_singel")
