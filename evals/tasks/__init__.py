"""The evaluation tasks and what runs them: the table of task rows (:mod:`.task_table`, each row's settings,
runner and cell format), the retrieval prompts (passkey, needles), LongPPL, the RULER battery, and what
every runner shares (greedy generation, interval arithmetic, the results folder's promises).

The lowest floor of ``evals``: nothing here imports :mod:`ropescale.evals.report`,
:mod:`ropescale.evals.suite` or :mod:`ropescale.evals.advice`."""
