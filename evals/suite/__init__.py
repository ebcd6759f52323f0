"""``ropescale eval suite``: a suite file read and checked, sized to a model, and run cell by cell into a
report. Sits above :mod:`ropescale.evals.report` (it writes the report) and :mod:`ropescale.evals.tasks`
(it runs their rows)."""
