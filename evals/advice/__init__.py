"""``ropescale recommend`` and the frontier: which method and factor for a target length, read from measured
evidence (suite results, shipped files, RULER batteries, fine-tune experiments), and what an engine serves.

Reads results through :mod:`ropescale.evals.report` and RULER cells through :mod:`ropescale.evals.tasks`;
nothing below imports it."""
