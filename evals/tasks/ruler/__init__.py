"""RULER's offline synthetic tasks (arXiv 2404.06654) through lm-eval's generators, scored as lm-eval
scores them, decoded by ropescale on the patched model: :mod:`.tasks` (the table, generation, prompt
and score), :mod:`.cell` (one task at one length), :mod:`.run` (a battery into a folder, resumable),
:mod:`.measures` (retention and effective length) and :mod:`.aggregate`."""
