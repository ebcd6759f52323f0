"""Bad input fails before anything is converted or loaded: a wrong method name or parameter stops
``ropescale patch`` and ``ropescale.from_pretrained`` before the model is even resolved."""

from __future__ import annotations

import pytest

import ropescale
from ropescale.cli.main import main
from ropescale.models import loading


@pytest.fixture
def no_model_resolution(monkeypatch):
    """Resolving the model (which converts the embedded one, or reaches the Hub) is a test failure."""

    def forbidden(name_or_path):
        raise AssertionError(f"the model {name_or_path!r} was resolved before the bad input was rejected")

    monkeypatch.setattr(loading, "resolve_model", forbidden)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--method", "yarnn", "--factor", "4"], "unknown method 'yarnn'; did you mean 'yarn'?"),
        (["--method", "yarn", "--factor", "4", "--param", "beta_fastt=3"], "unknown parameter 'beta_fastt'"),
        (["--method", "yarn", "--factor", "four"], "factor must be a number"),
        (["--method", "linear", "--factor", "4", "--param", "kv_consistent=true"], "kv_consistent applies to"),
        (["--method", "yarnn", "--target-length", "32768"], "unknown method 'yarnn'"),
    ],
)
def test_patch_rejects_the_method_before_resolving_the_model(capsys, no_model_resolution, argv, fragment, tmp_path):
    for extra in ([], ["--output", str(tmp_path / "out")]):
        capsys.readouterr()
        code = main(["patch", "--model", "smollm2-135m", *argv, *extra])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.startswith("ropescale: error:") and len(err.strip().splitlines()) == 1, err
        assert fragment in err, err


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"method": "yarnn", "factor": 4}, "unknown method 'yarnn'"),
        ({"method": "yarn", "factor": 4, "method_params": {"beta_fastt": 3}}, "unknown parameter 'beta_fastt'"),
        ({"method": "yarn", "target_length": 256, "method_params": {"beta_fast": "x"}}, "beta_fast must be a number"),
    ],
)
def test_from_pretrained_rejects_the_method_before_resolving_the_model(no_model_resolution, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        ropescale.from_pretrained("smollm2-135m", **kwargs)
