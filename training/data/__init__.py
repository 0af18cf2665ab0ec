"""Datasets, in three rooms that follow a dataset's life, each importing only the ones
before it::

    sources/   where data comes from: a catalog name, or a team's landed days
       |
    snapshot/  staged once into a fingerprinted snapshot, checked (statistics,
       |       validation, drift), kept or cleaned up, read back under TensorFlow
       |
    input/     what training reads: one decision (choose.py) hands a split to the
               reader of the run's backend, tf.data (tf_reader.py) or NumPy batches
               (numpy_reader.py); the decoded copy, the device split, the memory rule

``manifest.py`` (files, sizes, SHA-256, a fingerprint) lies below the rooms: staging,
landing, the partitions' shards and the model registry all list files with it.
"""
