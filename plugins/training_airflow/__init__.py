"""Airflow glue for the training library: trigger-form params, store credentials from a
connection, the DAG's operators (``tasks.py``) and launchers, queue routing, the local
stack behind ``./dev airflow``.

Importing this package is cheap (no TensorFlow, Keras, tfds or boto3): DAG files import
it at parse time. Everything heavy is imported inside task bodies.
"""
