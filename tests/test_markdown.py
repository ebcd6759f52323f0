"""The one markdown table (:func:`ropescale.markdown.table`): tabulate's pipe format, cells as given."""

from __future__ import annotations

import pytest

from ropescale.markdown import table


def test_columns_are_padded_aligned_and_cells_kept_as_given():
    text = table(["method", "PPL", "n"], [["yarn", "1.000", 10], ["dynamic_ntk", None]], align="lrc")
    assert text.splitlines() == [
        "| method      |   PPL |  n  |",
        "|:------------|------:|:---:|",
        "| yarn        | 1.000 | 10  |",  # 1.000 is not read as a number and shown as 1
        "| dynamic_ntk |       |     |",  # None and a short row: empty cells, the column stays
    ]


def test_an_align_of_another_length_is_refused():
    with pytest.raises(ValueError, match="align 'lr' has 2 letters for 3 columns"):
        table(["a", "b", "c"], [], align="lr")
