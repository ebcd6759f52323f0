"""A suite's results: its cell files as typed records, the keys that tie their numbers to what produced
them, the results' schema, and the aggregation into ``results.json``, ``report.md`` and plots.

Reads the task rows of :mod:`ropescale.evals.tasks`; never imports the suite runner or the advice."""
