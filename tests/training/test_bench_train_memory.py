"""The memory benchmark's CPU smoke mode: tiny shape, a child process for the option, one table, results.json."""

from __future__ import annotations

import json

from tests.conftest import load_script, squeezed


def _bench():
    return load_script("benchmarks/bench_train_memory.py")


def test_cpu_smoke_measures_every_option_and_length(tmp_path, capsys):
    bench = _bench()
    argv = ["--shape", "tiny", "--lengths", "64,32", "--device", "cpu", "--options", "offload+tiled"]
    assert bench.main([*argv, "--tile", "16", "--steps", "1", "--threads", "1", "--output", str(tmp_path)]) == 0
    out = squeezed(capsys.readouterr().out)
    assert "| 32 |" in out and "| 64 |" in out and "offload+tiled peak MiB" in out
    results = json.loads((tmp_path / "results.json").read_text())
    cells = {(c["option"], c["length"]): c for c in results["cells"]}
    assert set(cells) == {("offload+tiled", 32), ("offload+tiled", 64)}  # one child process, both lengths
    assert all(c["seconds"] > 0 and c["peak_mib"] >= 0 for c in cells.values()), cells
    assert results["tile"] == 16 and results["command"].startswith("python benchmarks/bench_train_memory.py")


def test_table_marks_failed_cells():
    bench = _bench()
    cells = [
        {"option": "plain", "length": 8, "seconds": 2.0, "peak_mib": 10.0},
        {"option": "tiled", "length": 8, "error": "out of memory"},
    ]
    text = bench.table(cells, ["plain", "tiled"], [8])
    assert squeezed(text.splitlines()[-1]) == "| 8 | 4 | 10 | out of memory | |"
