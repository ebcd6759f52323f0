"""Training data as a weighted mix of sources (data.sources): each window from one source, shares within
binomial noise of the weights, held-out text (data.holdout, and Emma wherever austen is mixed in) never
in a training window, Python trees as one document per package, and `ropescale data list`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ropescale.data.sources import describe_source, parse_sources, python_documents
from ropescale.errors import RopescaleError
from ropescale.training.data import WindowSpec
from ropescale.training.mixing import mixed_heldout, mixed_windows
from tests.training.conftest import char_tokenizer, recipe

N_SAMPLES = 3000
Z = 4.5  # standard deviations: a correct sampler leaves the band with probability < 1e-5 per source


def _folder(root, name: str, letter: str, n: int = 4, extra: dict | None = None):
    folder = root / name
    folder.mkdir()
    for i in range(n):
        (folder / f"{name}{i}.txt").write_text(f"{letter} " * (40 + 7 * i))
    for title, text in (extra or {}).items():
        (folder / f"{title}.txt").write_text(text)
    return folder


def _mix(tmp_path, sources, holdout=(), seq_len=24):
    config = recipe(tmp_path, data={"sources": sources, "holdout": list(holdout), "seq_len": seq_len})
    tok = char_tokenizer()
    spec = WindowSpec(seq_len, tok.bos_token_id, documents=True)
    return config, tok, mixed_windows(config, tok, tmp_path / "cache", spec)


def test_windows_follow_the_weights_within_binomial_noise(tmp_path):
    """Source shares over N windows stay within Z·sqrt(p(1-p)/N) of the weights (p = weight / total);
    every window's text comes from its own source only."""
    weights = {"a": 6.0, "b": 3.0, "c": 1.0}
    sources = [{"source": str(_folder(tmp_path, k, k)), "weight": w} for k, w in weights.items()]
    _, tok, mix = _mix(tmp_path, sources)
    counts = np.zeros(3)
    for g in range(N_SAMPLES):
        source, _ = mix.pick(g)
        counts[source] += 1
        if g < 200:
            text = set(tok.convert_ids_to_tokens(mix.sample(g)["input_ids"].tolist())) - {"<s>", "</s>", " "}
            assert text == {"abc"[source]}
    for share, w in zip(counts / N_SAMPLES, weights.values()):
        p = w / sum(weights.values())
        assert abs(share - p) <= Z * math.sqrt(p * (1 - p) / N_SAMPLES), (share, p)


def test_no_source_leaks_into_the_held_out_text(tmp_path, monkeypatch):
    """data.holdout titles, and Emma wherever austen is mixed in (named or not), appear in no training
    window of any source and are exactly the evaluation text."""
    import ropescale.data.corpus as corpus

    fake = [corpus.Document("Emma", "E " * 300), corpus.Document("Persuasion", "p " * 300)]
    monkeypatch.setattr(corpus, "load_corpus", lambda name, cache_dir=None: fake)
    a = _folder(tmp_path, "a", "a", extra={"Held": "Z " * 200})
    sources = [{"source": str(a), "weight": 1}, {"source": "austen", "weight": 1}]
    config, tok, mix = _mix(tmp_path, sources, holdout=["Held"])
    leaked = set()
    for g in range(600):
        leaked |= set(tok.convert_ids_to_tokens(mix.sample(g)["input_ids"].tolist())) & {"Z", "E"}
    assert not leaked
    assert sorted(t for t, _ in mixed_heldout(config)) == ["Emma", "Held"]
    assert {"p", "a"} <= {t for g in range(50) for t in tok.convert_ids_to_tokens(mix.sample(g)["input_ids"].tolist())}


def test_the_long_recipes_mix_leaks_no_held_out_token_into_any_training_stream(tmp_path, monkeypatch):
    """The shape of the issue-41 recipes (a Python tree, a folder and austen; stream packing; 40 % short
    windows), checked exhaustively: no token of the held-out documents (a data.holdout title and Emma) in
    any source's whole training stream, the held-out text exactly those documents, and short windows,
    like long ones, cut from the source their draw names."""
    import ropescale.data.corpus as corpus
    from ropescale.training.mixing import mixed_streams

    fake = [corpus.Document("Emma", "E " * 300), corpus.Document("Persuasion", "p " * 300)]
    monkeypatch.setattr(corpus, "load_corpus", lambda name, cache_dir=None: fake)
    tree = tmp_path / "tree" / "pkg"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("x = 1\n" * 50)
    a = _folder(tmp_path, "a", "a", extra={"Held": "Z " * 200})
    sources = [
        {"source": f"python:{tree.parent}", "weight": 0.5},
        {"source": str(a), "weight": 0.3},
        {"source": "austen", "weight": 0.2},
    ]
    config = recipe(
        tmp_path, data={"sources": sources, "holdout": ["Held"], "seq_len": 24, "packing": "stream", "short_share": 0.4}
    )
    tok = char_tokenizer()
    held_ids = set(tok.convert_tokens_to_ids(["Z", "E"]))
    streams = mixed_streams(config, tok, tmp_path / "cache")
    assert [len(s.tokens) > 0 for s in streams] == [True] * 3
    assert all(not held_ids & set(s.tokens.tolist()) for s in streams)
    held = mixed_heldout(config)
    assert sorted(t for t, _ in held) == ["Emma", "Held"] and {c for _, text in held for c in text} == {"E", "Z", " "}
    spec = WindowSpec(24, tok.bos_token_id, documents=False, short_share=0.4, short_len=16)
    mix = mixed_windows(config, tok, tmp_path / "cache2", spec)
    for g in range(100):
        source, _ = mix.pick(g)
        text = set(tok.convert_ids_to_tokens(mix.sample(g, short=True)["input_ids"].tolist())) - {"<s>", "</s>", " "}
        assert not text & {"Z", "E"} and (source != 1 or text == {"a"}) and (source != 2 or text == {"p"})


def test_python_tree_is_one_document_per_package(tmp_path):
    root = tmp_path / "tree"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "pkg" / "sub" / "b.py").write_text("def f():\n    return 2\n")
    (root / "mod.py").write_text("import pkg\n")
    (root / "pkg" / "latin.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: left out and counted
    (root / "site-packages").mkdir()
    (root / "site-packages" / "other.py").write_text("never = 1\n")
    docs, skipped = python_documents(f"python:{root}")
    assert skipped == 1
    assert [t for t, _ in docs] == ["pkg", "tree (modules)"]
    assert docs[0][1] == "# file: pkg/__init__.py\nX = 1\n\n# file: pkg/sub/b.py\ndef f():\n    return 2\n"
    info = describe_source(parse_sources([f"python:{root}"])[0])
    assert info["documents"] == 2


@pytest.mark.parametrize(
    ("sources", "message"),
    [
        ([{"source": "austen", "weight": 0}], r"data.sources\[0\].weight must be a positive number"),
        ([{"path": "x"}], r"data.sources\[0\]: unknown key 'path'"),
        ([{"source": "austen"}, {"source": "austen"}], r"names 'austen' twice"),
    ],
)
def test_bad_sources_are_refused_in_one_line(tmp_path, sources, message):
    with pytest.raises(RopescaleError, match=message):
        recipe(tmp_path, data={"sources": sources})


def test_count_holdout_with_sources_is_refused(tmp_path):
    with pytest.raises(RopescaleError, match=r"data.holdout must list document titles"):
        recipe(tmp_path, data={"sources": ["austen"], "holdout": 1})


def test_data_list_prints_sources_and_sizes(tmp_path, capsys):
    from ropescale.cli.main import main

    a = _folder(tmp_path, "a", "a", n=3)
    assert main(["data", "list", str(a), f"python:{tmp_path}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["source", "share", "documents", "size"]
    assert out[1].split()[:3] == [str(a), "-", "3"]


def test_trainer_trains_on_a_mix(tmp_path, model_dir):
    from ropescale.training.trainer import Trainer

    sources = [{"source": str(_folder(tmp_path, k, k)), "weight": w} for k, w in (("a", 2), ("b", 1))]
    config = recipe(tmp_path, model={"name": str(model_dir)}, data={"sources": sources, "seq_len": 32})
    result = Trainer(config, progress=False).train()
    assert result.step == config.train.max_steps and all(np.isfinite(result.losses))
    assert (config.output_dir / "data" / "source-1.npy").is_file()


def test_dry_run_and_list_name_the_mix(tmp_path, capsys):
    import yaml

    from ropescale.cli.main import main

    a, b = _folder(tmp_path, "a", "a"), _folder(tmp_path, "b", "b")
    raw = {
        "model": {"name": "smollm2-135m"},
        "scaling": {"method": "yarn", "factor": 4},
        # windows the folders' ~200 tokens can fill: the preflight checks them wherever the tokenizer is here
        "data": {
            "sources": [{"source": str(a), "weight": 3}, {"source": str(b), "name": "bee"}],
            "short_share": 0.25,
            "seq_len": 128,
        },
        "pose": {"enabled": False},
    }
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", "--config", str(path), "--dry-run"]) == 0
    windows = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("windows:"))
    assert f"from {a} 75%, bee 25%, documents packing, 25% short" in windows
    assert main(["data", "list", "--config", str(path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[:3] for r in rows] == [[str(a), "75%", "4"], ["bee", "25%", "4"]]
