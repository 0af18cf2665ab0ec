"""The input training reads: a staged snapshot's splits as Keras's ``fit`` takes them.

Enters: a ``snapshot.staging.StagedDataset`` and the run's dataset settings, in a process
of one Keras backend.
Leaves: ``choose.training_input``: the training and validation splits (a tf.data
pipeline, or a ``PyDataset`` of NumPy batches or of device indices), the training
split's size, the model's input shape and classes, the split kept on the device.

``choose.py`` decides once which reader serves (the only module that asks which kind it
holds): ``tf_reader.py`` (tf.data, a TensorFlow process) or ``numpy_reader.py`` (NumPy
batches, a JAX process, which reads the staged files without TensorFlow:
``staged_arrays.py`` over ``staged_layouts.py``, ``records.py``, ``read_order.py``).
``decoded_copy.py`` is a source of pixels (a split decoded once, on disk),
``device_split.py`` a place to keep a split (the accelerator), ``memory.py`` the rule
that keeps one in the host's memory.
"""
