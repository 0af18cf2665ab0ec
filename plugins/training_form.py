"""Airflow plugin: the trigger form's rules, in words, where the api-server checks them.

The form's fields with a pattern carry it as a JSON-Schema ``format`` named by the rule
in words (see ``training_airflow.params``). Airflow checks a triggered run's params with
jsonschema's ``FormatChecker`` in the api-server, which never imports DAG files but does
load plugins: importing this module registers the checks there, so a refused value
reads ``'a b' is not a 'registry name of 1 to 128 letters, ...'`` before any run exists.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from training_airflow.params import register_formats

register_formats()


class TrainingFormPlugin(AirflowPlugin):
    name = "training_form"
