"""Scoring a causal LM on text: one chunked next-token NLL (:mod:`.nll`) and sliding-window
perplexity (:mod:`.perplexity`), used by evaluation, search and training alike."""
