"""The checkpoints the engine tests serve: every native method, as ropescale writes it and as
``rope_parameters`` alone (what ropescale wrote before the legacy keys), on a tiny Llama (head_dim 64,
L = 256, base 5e5 so that a loader falling back to 10000 shows)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import ropescale
from ropescale.export import engines_table
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[2]
L = 256
FACTOR = 4
LENGTHS = (16, L // 2, L, L + 1, L + 2, 2 * L, 4 * L)
#: case -> (method, params): the columns of docs/engines.md (one table for the doc and the test), named
#: for checkpoint folders and test ids
METHODS = {
    {"yarn af=1": "yarn_af1", "yarn betas 16/2": "yarn_betas", "yarn on llama3": "yarn_on_llama3"}.get(
        column, column
    ): case
    for column, case in engines_table.METHODS.items()
}
FORMS = ("saved", "rope_parameters")
#: engine install -> (runner kind, its --target folder under ROOT (``make engines``), the transformers
#: beside it: ``.tf4`` or None for this venv's 5.x)
INSTALLS = {
    "vllm-0.11.0": ("vllm", ".engines/vllm-0.11.0", ".tf4"),
    "vllm-0.33.0": ("vllm", ".engines/vllm-0.33.0", None),
    "sglang-0.5.23": ("sglang", ".engines/sglang-0.5.23", None),
}
#: install -> what ``doctor --engines`` names it (the engine version and the transformers beside it)
SELECTORS = {
    "vllm-0.11.0": "vllm==0.11.0:transformers==4.57.6",
    "vllm-0.33.0": "vllm==0.33.0:transformers==5.24.0",
    "sglang-0.5.23": "sglang==0.5.23:transformers==5.24.0",
}
DEPS = ".engines/deps"
TF4 = Path(os.environ.get("ROPESCALE_TF4") or ROOT / ".tf4")


def build(root: Path) -> dict[tuple[str, str], Path]:
    """Save every case; returns (method, form) -> checkpoint directory."""
    out = {}
    for name, (method, params) in METHODS.items():
        model = tiny_model(
            shape="engines", max_position_embeddings=L, rope_parameters={"rope_type": "default", "rope_theta": 5e5}
        )
        path = root / f"{name}-saved"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaled = engines_table.apply_case(model, method, params, FACTOR, ropescale.patch)
            ropescale.save_pretrained(scaled, path, config_only=True)
        out[name, "saved"] = path
        data = json.loads((path / "config.json").read_text())
        for key in ("rope_scaling", "rope_theta", "original_max_position_embeddings"):
            data.pop(key, None)
        data["max_position_embeddings"] = data["ropescale"]["extended_context"] if method != "dynamic_ntk" else L
        old = root / f"{name}-rope_parameters"
        old.mkdir()
        (old / "config.json").write_text(json.dumps(data, indent=2))
        out[name, "rope_parameters"] = old
    return out
