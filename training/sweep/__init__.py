"""A hyperparameter sweep: one model's config searched over a space, trial by trial.

What enters: a ``RunConfig`` whose ``sweep`` section is on (``sweep.trials`` above 0,
``training/config/sweep.py``), the fingerprint of the staged data the trials train on,
and, for a PostgreSQL study storage, the password the deployment hands over (never part
of the config). What leaves: for each trial task ``i``, an Optuna trial found or claimed
for slot ``i`` and its ``RunConfig`` (the base config with the searched fields replaced,
run id ``<base run id>-t<i>``, the sweep off); the epochs' objective reported to the
study and pruning decisions taken there; at the end, the best completed trial and
``sweep.json`` beside the base run.

- ``space``: the searched fields and their distributions, parsed and checked alone
  (no Optuna, no config: the config section imports it);
- ``storage``: where the study lives (a SQLite file by default, a SQLAlchemy URL), opened
  with connect timeouts, never shown with a password;
- ``engine``: the objective's direction, the sampler and the pruner a sweep asks for;
- ``study``: open the study, plan the slots, ask for slot ``i`` (again, on a retry),
  report, tell, read the trials back; ``slots``: which Optuna trial is slot ``i``'s;
  ``budget``: the sweep's time budget;
- ``trial``: a trial's config and run directory;
- ``pruning``: the Keras callback that reports each epoch and stops a pruned trial;
- ``pick``: the best completed trial, or an error naming the failed trials;
- ``record``: ``sweep.json``.

This package imports nothing itself, so the config section can use ``space`` without
loading Optuna or Keras. docs/sweeps.md tells the whole story.
"""
