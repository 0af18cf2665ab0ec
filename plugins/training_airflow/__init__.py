"""Airflow glue for the training library: trigger-form params, store credentials from a
connection, the training launch operator and queue routing.

Importing this package is cheap (no TensorFlow, Keras, tfds or boto3): DAG files import
it at parse time. Everything heavy is imported inside task bodies.
"""
