"""``train.compile`` (ropescale/training/compiling.py): each decoder layer through torch.compile, refused
in one line before the weights load where inductor cannot build kernels, and the same loss as eager.

Compilation takes seconds even on the tiny model, so there is one training test, of two steps; no test
measures speed (benchmarks/bench_train_step.py does, alone on the machine).
"""

from __future__ import annotations

import json
import math

import pytest

from ropescale.cli.main import main
from ropescale.training.compiling import decoder_layers
from ropescale.training.trainer import Trainer
from tests.training.conftest import recipe, repetitive_stream
from tests.training.test_preflight import TEXT, _folder, _recipe, broken_model  # noqa: F401 - a fixture


def test_no_cpp_compiler_on_a_cpu_run_is_refused_before_the_weights(tmp_path, broken_model, capsys):  # noqa: F811
    from torch._inductor import config as inductor

    recipe_file = _recipe(tmp_path, broken_model, data={"source": _folder(tmp_path, "books", {"a": TEXT})})
    with inductor.patch({"cpp.cxx": (None, "no-such-c++-ropescale")}):  # what CXX=no-such-c++-ropescale gives
        code = main(["train", "--config", recipe_file, "--no-progress", "train.compile=true"])
        err = capsys.readouterr().err
        dry = main(["train", "--config", recipe_file, "--dry-run", "train.compile=true"])
    assert code == 2, err
    assert err.strip() == (
        "ropescale: error: train.compile=true: no C++ compiler found for torch inductor on this CPU run "
        "(looked for no-such-c++-ropescale); install g++ or set CXX to one, or set train.compile=false"
    )  # one line, before the weights (there are none: their load would have said so)
    # the dry run (which may plan a run for another machine) says it in the plan and goes on
    assert dry == 0
    out = capsys.readouterr().out
    assert "torch.compile of each decoder layer" in out  # the steps line
    assert "compile: " in out[out.index("preflight:") :]


def test_compile_must_be_true_or_false(tmp_path, broken_model, capsys):  # noqa: F811
    recipe_file = _recipe(tmp_path, broken_model)
    assert main(["train", "--config", recipe_file, "--dry-run", "train.compile=yes please"]) == 2
    assert "ropescale: error: train.compile must be true or false, got 'yes please'" in capsys.readouterr().err


def test_a_compiled_run_gives_the_eager_losses(tmp_path, make_model):
    pytest.importorskip("torch._inductor")
    from ropescale.training.compiling import compile_problem

    if compile_problem("cpu") is not None:
        pytest.skip(compile_problem("cpu"))
    losses, records = {}, {}
    for compiled in (False, True):
        train = {"max_steps": 2, "mixed_precision": "no", "compile": compiled}
        config = recipe(tmp_path / str(compiled), model={"dtype": "float32"}, train=train)
        trainer = Trainer(config, model=make_model(), train_tokens=repetitive_stream(), progress=False)
        result = trainer.train()
        losses[compiled] = result.losses
        records[compiled] = [json.loads(ln) for ln in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
        layers = decoder_layers(trainer.peft_model.get_base_model())
        assert len(layers) == 2 and all((layer._compiled_call_impl is not None) == compiled for layer in layers)
    assert len(losses[True]) == 2
    for eager, compiled in zip(losses[False], losses[True]):  # fp32: fused kernels round differently, no more
        assert math.isclose(eager, compiled, rel_tol=1e-4), (losses[False], losses[True])
    assert all("compiled_layers" not in r for r in records[False])  # what produced each step's numbers
    assert [r["compiled_layers"] for r in records[True]] == [2, 2]
    assert "compile: true" in (tmp_path / "True" / "run-llama" / "config.yaml").read_text()
