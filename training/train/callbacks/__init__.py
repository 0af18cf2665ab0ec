"""The project's own Keras callbacks, one class per module (as ``keras/src/callbacks/``).

* ``backup.ResumableBackup``: BackupAndRestore plus the other callbacks' state, written
  as a transaction; acts on SIGTERM (``training.train.preemption``);
* ``weights_report.WeightsReport``: the final weights digest and per-epoch logs of a
  worker of a multi-worker run.

``training.train.fit.make_callbacks`` composes them with Keras's own. Each module imports
Keras; this package does not, so importing it stays cheap.
"""
