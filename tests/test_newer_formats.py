"""Files written by a newer ropescale (a format version above this one's) are refused in one line
naming the file, and never overwritten: a checkpoint manifest, a converted-model cache, an installed
corpus (the search history is in tests/cli/test_overwrite_inputs.py, optimizer state in
tests/training/test_no_pickles.py)."""

from __future__ import annotations

import json

import pytest

from ropescale.data.corpus import install_corpus
from ropescale.data.corpus_types import CorpusInstallError
from ropescale.errors import RopescaleError
from ropescale.models.embedded import MANIFEST as CACHE_MANIFEST
from ropescale.models.embedded import cache_problem
from ropescale.training.checkpoints import MANIFEST, checkpoint_problem, resume_point


def _newer(path, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 2, "files": {}, **extra}))
    return path.read_bytes()


def test_a_checkpoint_of_a_newer_format_is_refused_not_skipped(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step-00000002"
    manifest = step / MANIFEST
    before = _newer(manifest)
    message = f"checkpoint '{manifest}' was written by a newer ropescale (format 2, this one reads 1)"
    with pytest.raises(RopescaleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checkpoint_problem(step)
    with pytest.raises(RopescaleError, match="newer ropescale"):
        resume_point(tmp_path / "run")  # not skipped for an older one (which a resume would then overwrite)
    assert manifest.read_bytes() == before


def test_a_converted_model_of_a_newer_format_is_refused(tmp_path):
    manifest = tmp_path / "smollm2-135m" / CACHE_MANIFEST
    before = _newer(manifest)
    with pytest.raises(RopescaleError, match=f"converted model '{manifest}' was written by a newer ropescale"):
        cache_problem(manifest.parent)
    assert manifest.read_bytes() == before


def test_a_corpus_of_a_newer_format_is_refused_not_reinstalled(tmp_path):
    manifest = tmp_path / "austen" / "manifest.json"
    before = _newer(manifest, name="austen", documents=[])
    with pytest.raises(CorpusInstallError, match=f"corpus '{manifest}' was written by a newer ropescale"):
        install_corpus("austen", cache_dir=manifest.parent, source=tmp_path / "nowhere")
    assert manifest.read_bytes() == before
