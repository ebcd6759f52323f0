"""The extension benchmark's plumbing for a variant of the fine-tune (no training here: the commands it
would run are recorded): the overrides reach the recipes, and only the chosen suites' models are trained."""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_extension.py")


def test_a_variant_trains_only_its_suites_models_with_its_overrides(bench, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench, "ropescale", lambda *args: ran.append(args))
    monkeypatch.setattr(bench, "trained", lambda run, recipe: False)
    overrides = ["pose.enabled=false", "data.seq_len=4096"]
    exports = bench.train_and_export(tmp_path, {"finetuned"}, overrides)
    assert exports == {"fine-tuned yarn": tmp_path / "yarn-export", "control": tmp_path / "control-export"}
    (train, export) = ran  # the control is not trained: its suite was not asked for
    assert train[:3] == ("train", "--config", "smollm2-135m/yarn_x4") and train[-2:] == tuple(overrides)
    assert export == ("export", str(tmp_path / "yarn"), "--output", str(tmp_path / "yarn-export"))
    ran.clear()
    bench.train_and_export(tmp_path, {"base", "finetuned", "control"}, [])
    assert [a[2] for a in ran if a[0] == "train"] == ["smollm2-135m/yarn_x4", "smollm2-135m/yarn_x4_control"]
    args = bench.parse_args(["--output", "runs/v", "--suites", "finetuned", "--overrides", *overrides])
    assert args.suites == "finetuned" and args.overrides == overrides
