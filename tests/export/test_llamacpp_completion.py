"""The benchmarks' shared set-up and row (:func:`prepare_comparison`, :func:`compare_greedy`), with a
stand-in for ``llama-completion`` (the real one: ``test_self_extend_llamacpp_cli.py``)."""

from __future__ import annotations

import sys

from ropescale.export.llamacpp_completion import compare_greedy, greedy_ids, prepare_comparison, token_bytes

#: prints llama.cpp's ``--verbose-prompt`` lines for the tokens 5, 6, 7 and generates "42"
FAKE = """#!{python}
import sys
sys.stderr.write("number of tokens in prompt = 3\\n     5 -> 'a'\\n     6 -> 'b'\\n     7 -> 'c'\\n")
sys.stdout.write("42\\n\\n")
"""


def test_prepare_comparison_reads_the_results_back_and_exports_once(checkpoint, tmp_path):
    path, _, tokenizer = checkpoint
    out = tmp_path / "bench"
    setup = prepare_comparison(path, out, "m.gguf")
    assert setup.results == {} and setup.gguf == out / "m.gguf" and setup.gguf.is_file()
    assert setup.banned == list(tokenizer.all_special_ids)
    setup.results_path.write_text('{"8192@0.5#0": {"same": true}}')
    stamp = setup.gguf.stat().st_mtime_ns
    again = prepare_comparison(path, out, "m.gguf")
    assert again.results == {"8192@0.5#0": {"same": True}} and again.gguf.stat().st_mtime_ns == stamp


def test_compare_greedy_decodes_llama_cpps_own_prompt_tokens(checkpoint, tmp_path):
    path, model, tokenizer = checkpoint
    setup = prepare_comparison(path, tmp_path, "m.gguf")
    binary = tmp_path / "llama-completion"
    binary.write_text(FAKE.format(python=sys.executable))
    binary.chmod(0o755)
    got = compare_greedy(
        binary, setup, [40, 41, 42, 43], {"ours": lambda: model}, 4, text=tmp_path / "prompt.txt",
        log=tmp_path / "llama.log", threads=1, group_size=1, window=512,
    )  # fmt: skip
    assert got.prompt_ids == [5, 6, 7]
    ours = token_bytes(tokenizer, greedy_ids(model, [5, 6, 7], 4, setup.banned))
    assert got.answers == {"llama.cpp": b"42", "ours": ours}
    assert list(got.row()) == ["llama.cpp", "llama.cpp_s", "ours", "ours_s"] and got.row()["llama.cpp"] == "42"
    assert (tmp_path / "prompt.txt").read_text() == tokenizer.decode([40, 41, 42, 43], skip_special_tokens=True)
    assert f" -c {4 + 4 + 64} " in (tmp_path / "llama.log").read_text()  # the prompt, the answer, 64 to spare
