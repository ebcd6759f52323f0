"""docs/engines.md is the table :mod:`ropescale.export.engines_table` generates from the doctor's rule rows."""

from __future__ import annotations

from ropescale.export import engines_table as table
from tests.conftest import squeezed

from .cases import ROOT


def test_docs_engines_md_is_generated_from_the_rules():
    doc = ROOT / "docs" / "engines.md"
    assert doc.read_text() == table.markdown(), "regenerate: python -m ropescale.export.engines_table docs/engines.md"


def test_the_doc_covers_every_row_and_method():
    text = squeezed(table.markdown())
    for column in table.METHODS:
        assert f" {column} |" in text
    assert text.count("| vLLM |") == 2 * 5 and text.count("| SGLang |") == 2 * 2
    assert "0.33.0 on transformers 5.24.0" in text and "0.11.0 on transformers 4.57.6" in text
