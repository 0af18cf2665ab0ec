"""A production training pipeline for Keras models; Airflow schedules it.

This package never imports Airflow. Heavy modules (TensorFlow, Keras, tfds, boto3)
are imported inside the functions that need them, so ``import training`` is cheap.
"""

__version__ = "0.1.0"
