"""YAML from users' files refuses a key given twice (issue 42): PyYAML keeps the last silently."""

from __future__ import annotations

import pytest

from ropescale._yaml import DuplicateKeyError, safe_load
from ropescale.errors import RopescaleError


def test_a_key_given_twice_is_named_with_both_lines():
    with pytest.raises(DuplicateKeyError, match=r"^f.yaml: key 'r' is given twice \(lines 2 and 4\); keep one$"):
        safe_load("lora:\n  r: 8\n  alpha: 16\n  r: 16\n", "f.yaml")
    assert safe_load("a: {x: 1}\nb: {x: 1}\n") == {"a": {"x": 1}, "b": {"x": 1}}  # the same key in two mappings
    assert safe_load("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n")["c"] == {"x": 2}  # a merge key may be overridden


def test_training_recipes_and_accelerate_configs_refuse_duplicate_keys(tmp_path):
    from ropescale.training.config import load_config
    from ropescale.training.parallel import check_accelerate_config

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  name: smollm2-135m\nscaling:\n  method: yarn\n  factor: 4\n  factor: 8\n")
    with pytest.raises(RopescaleError, match=r"r.yaml: key 'factor' is given twice \(lines 5 and 6\)"):
        load_config(recipe)
    accelerate = tmp_path / "a.yaml"
    accelerate.write_text("distributed_type: FSDP\nnum_processes: 2\nnum_processes: 4\n")
    with pytest.raises(RopescaleError, match="key 'num_processes' is given twice"):
        check_accelerate_config(accelerate, None)
