"""lm-evaluation-harness integration: the ``ropescale`` lm-eval model and :func:`run_harness`.

Importing this package registers the lm-eval model ``ropescale`` (an ``HFLM`` subclass that loads
and patches through :func:`ropescale.from_pretrained`; :mod:`.model`, its arguments in
:mod:`.args`). lm-eval discovers no external models by itself, so use one of::

    ropescale eval harness --model smollm2-135m --method yarn --factor 4 --tasks passkey_4k
    ropescale-lm-eval run --model ropescale \\
        --model_args pretrained=smollm2-135m,method=yarn,factor=4 --tasks passkey_4k
    python -c "import ropescale.evals.lm_eval, lm_eval; lm_eval.simple_evaluate(model='ropescale', ...)"

``ropescale-lm-eval`` (:mod:`ropescale.cli.lm_eval`) is lm-eval's own CLI with the model
registered and, unless ``--include_path`` is given, this package's task folder on the task path.
:mod:`.runner` runs tasks from Python (:func:`run_harness`), :mod:`.checks` stops prompts that
lm-eval would cut and warns when RULER runs at its 4k default on a scaled model.
"""

from __future__ import annotations

from typing import Any

from ropescale.evals.lm_eval.args import MODEL_NAME, default_max_length, split_model_args
from ropescale.evals.lm_eval.model import MODEL_TARGET, register_lm_eval_model
from ropescale.evals.lm_eval.runner import (
    RESULTS_FILE,
    TASKS_DIR,
    format_results,
    results_path,
    run_harness,
    task_manager,
)

__all__ = [
    "MODEL_NAME",
    "MODEL_TARGET",
    "RESULTS_FILE",
    "TASKS_DIR",
    "RopescaleLM",
    "default_max_length",
    "format_results",
    "register_lm_eval_model",
    "results_path",
    "run_harness",
    "split_model_args",
    "task_manager",
]


def __getattr__(name: str) -> Any:
    if name == "RopescaleLM":  # built on first use (importing lm-eval's HF model costs seconds)
        from ropescale.evals.lm_eval import model

        return model.RopescaleLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_lm_eval_model()
