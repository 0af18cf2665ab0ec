"""The staged snapshot: a dataset prepared once into a fingerprinted directory, checked
before anything trains, kept while something refers to it.

Enters: a source's builder (``sources/``: tfds's, or a team's partitions, each decoded
once into its own shards: ``partition_shards.py``, ``own_snapshot.py``).
Leaves: a ``StagedDataset`` (``staging.py``: where it lives, its fingerprint, a
manifest and statistics); the verdict on the data (``validation.py``, ``drift.py``);
the pinned holdout (``holdout.py``); clean-up of what nothing refers to
(``staging_cleanup.py``); the snapshot read back under TensorFlow
(``snapshot_reader.py``) and the split expressions training reads (``splits.py``), for
``input/``.
"""
