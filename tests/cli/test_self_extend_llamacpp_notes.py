"""``ropescale patch`` and ``doctor`` name the llama.cpp flags of a Self-Extend checkpoint, say the
server has none, and that llama.cpp's schedule is ``self_extend_llamacpp``, not LongLM's."""

from __future__ import annotations

import json

import pytest

from ropescale import patch
from ropescale.cli.main import main
from ropescale.methods import RotarySpec, get_method
from ropescale.methods.self_extend_llamacpp import llamacpp_note
from tests.conftest import tiny_model

SPEC = RotarySpec(64, 1e5, 8192)


def test_longlm_self_extend_names_the_flags_and_the_other_schedule():
    note = llamacpp_note(get_method("self_extend", factor=2, group_size=4, window=1024, logn=True), SPEC)
    assert "llama-completion -m model.gguf -c 16384 --grp-attn-n 4 --grp-attn-w 1024 " in note
    assert "llama-server has no Self-Extend" in note
    assert "method self_extend_llamacpp (group_size=4, window=1024) predicts" in note
    assert "llama.cpp has no logn" in note


def test_the_llamacpp_variant_names_its_batch_size():
    method = get_method("self_extend_llamacpp", group_size=4, window=1024, n_batch=512)
    note = llamacpp_note(method, SPEC)
    assert "--grp-attn-n 4 --grp-attn-w 1024 -b 512 " in note and "LongLM" not in note
    assert llamacpp_note(get_method("yarn", factor=4), SPEC) is None


def test_window_must_be_a_multiple_of_the_group_as_llama_cpp_asserts():
    with pytest.raises(ValueError, match="window must be a multiple of group_size"):
        get_method("self_extend_llamacpp", group_size=4, window=1022)


@pytest.mark.parametrize("method", ["self_extend", "self_extend_llamacpp"])
def test_doctor_prints_the_flags_of_a_saved_checkpoint(tmp_path, capsys, method):
    model = patch(tiny_model("llama"), method, group_size=4, window=16)
    model.config.save_pretrained(tmp_path)
    main(["doctor", str(tmp_path)])
    assert "--grp-attn-n 4 --grp-attn-w 16 (llama-server has no Self-Extend)" in capsys.readouterr().out
    main(["doctor", str(tmp_path), "--json"])
    note = json.loads(capsys.readouterr().out)["llama_cpp_self_extend"]
    assert ("self_extend_llamacpp (group_size=4, window=16) predicts" in note) == (method == "self_extend")


@pytest.mark.parametrize("verbose", [False, True])
def test_the_patch_summary_ends_with_the_llama_cpp_flags(verbose):
    from ropescale.cli.patch import summary
    from ropescale.patching.plan import plan_patch
    from tests.conftest import tiny_config

    plan = plan_patch(tiny_config("llama"), "self_extend", group_size=4, window=16)
    text = summary("tiny", plan, verbose=verbose)
    assert "llama-completion -m model.gguf -c 208 --grp-attn-n 4 --grp-attn-w 16 (llama-server" in text
    assert "self_extend_llamacpp (group_size=4, window=16) predicts" in text
    assert "llama.cpp" not in summary("tiny", plan_patch(tiny_config("llama"), "yarn", factor=4), verbose=verbose)
