"""The perplexity-against-length plot of a suite report (docs/img/demo.png) and the label placer.

The figure is caught as it is saved, then read the way a reader reads the PNG: the title, the tick
labels as drawn, the legend's entries, the notes beside lone points, the trained-context line.
"""

from __future__ import annotations

import itertools

import pytest

from ropescale.plots import curves
from ropescale.plots.curves import log_ticks, plot_perplexity_curves
from ropescale.plots.labels import place_labels
from tests.conftest import load_script

#: the README's smollm2-demo table (n/r cells absent, as in the suite's results), as the redraw script holds it
DEMO = load_script("benchmarks/redraw_docs_plots.py").DEMO
LENGTHS = [2048, 8192, 16384]


@pytest.fixture
def saved(monkeypatch):
    """The figures the plot functions save, in order."""
    figures = []
    real = curves.save_png

    def catch(fig, path, **kwargs):
        figures.append(fig)
        return real(fig, path, **kwargs)

    monkeypatch.setattr(curves, "save_png", catch)
    return figures


def _demo(tmp_path, saved, **kwargs):
    path = plot_perplexity_curves(DEMO, LENGTHS, tmp_path / "demo.png", **kwargs)
    assert path.read_bytes()[:4] == b"\x89PNG"
    fig = saved[-1]
    fig.canvas.draw()
    return fig.axes[0]


def test_title_names_the_model_and_the_factor(tmp_path, saved):
    ax = _demo(tmp_path, saved, model="smollm2-135m", factor=4, trained_context=8192)
    assert ax.get_title() == "smollm2-135m: perplexity vs length, factor 4"
    # callers that pass neither (a report of methods at several factors) keep the plain title
    assert _demo(tmp_path, saved).get_title() == "Perplexity vs evaluation length"


def test_a_dashed_labelled_line_at_the_trained_context(tmp_path, saved):
    ax = _demo(tmp_path, saved, model="smollm2-135m", factor=4, trained_context=8192)
    lines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [8192, 8192]]
    assert len(lines) == 1 and lines[0].get_linestyle() == "--"
    assert "trained context L = 8k" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [ln for ln in _demo(tmp_path, saved).get_lines() if ln.get_linestyle() == "--"]  # none unless given


def test_ticks_read_as_plain_numbers_and_lengths(tmp_path, saved):
    ax = _demo(tmp_path, saved, trained_context=8192)
    y = [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]
    assert y and not [t for t in y if "10^" in t or "$" in t or "×" in t or "\\times" in t], y
    assert {"30", "40", "60", "100"} <= set(y)
    assert [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text()] == ["2k", "8k", "16k"]


def test_log_ticks_are_round_and_inside_the_range():
    assert log_ticks(26, 164) == [30, 40, 50, 60, 80, 100, 150]
    assert log_ticks(15, 900) == [20, 30, 50, 100, 200, 300, 500]
    narrow = log_ticks(31.5, 33.5)  # no two round log ticks fit: evenly spaced values instead
    assert len(narrow) >= 2 and all(31.5 <= t <= 33.5 for t in narrow)


def test_a_method_at_one_length_is_named_never_a_lone_dot(tmp_path, saved):
    from matplotlib.text import Text

    ax = _demo(tmp_path, saved, trained_context=8192)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "ntk (only at 16k)" in legend and "dynamic_ntk (only at 16k)" in legend
    assert "linear (not run at 16k)" in legend and "none" in legend and "yarn" in legend
    notes = {t.get_text() for t in ax.texts}
    assert {"ntk 32.05", "dynamic_ntk 33.04"} <= notes
    boxes = [Text.get_window_extent(t) for t in ax.texts]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_a_skipped_length_breaks_the_line(tmp_path, saved):
    """A method measured at 2k and 16k but not 8k: two points, no segment drawn across 8k."""
    path = plot_perplexity_curves({"gap": {2048: 30.0, 16384: 31.0}}, LENGTHS, tmp_path / "g.png")
    assert path.is_file()
    ax = saved[-1].axes[0]
    assert not [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["gap (not run at 8k)"]


def test_labels_on_crowded_points_do_not_overlap():
    """Five labels on nearly one point: each finds its own place, measured by the renderer (the text
    itself; a label standing away from its point has a leader, which is not text)."""
    from matplotlib.text import Text

    from ropescale.plots import figure

    fig = figure(figsize=(5, 4), dpi=100)
    ax = fig.add_subplot()
    points = [(1.0 + i * 0.001, 0.5) for i in range(5)]
    ax.plot(*zip(*points, strict=True), "o")
    ax.set_xlim(0.9, 1.1)
    ax.set_ylim(0, 1)
    notes = place_labels(ax, points, [f"method number {i}" for i in range(5)])
    fig.canvas.draw()
    boxes = [Text.get_window_extent(n) for n in notes]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    frame = ax.get_window_extent()
    assert all(frame.contains(b.x0, b.y0) and frame.contains(b.x1, b.y1) for b in boxes)


def test_a_perplexity_that_overflowed_is_named_not_dropped(tmp_path, saved):
    path = plot_perplexity_curves({"far": {2048: 30.0, 8192: 40.0, 16384: float("inf")}}, LENGTHS, tmp_path / "i.png")
    assert path.is_file()
    assert [t.get_text() for t in saved[-1].axes[0].get_legend().get_texts()] == ["far (inf at 16k)"]
    plot_perplexity_curves({"ok": {2048: 30.0}, "lost": {16384: float("inf")}}, LENGTHS, tmp_path / "l.png")
    assert [t.get_text() for t in saved[-1].axes[0].get_legend().get_texts()] == [
        "ok (only at 2k)",
        "lost (inf at 16k)",
    ]
    assert plot_perplexity_curves({"none": {2048: float("nan")}}, LENGTHS, tmp_path / "n.png") is None
