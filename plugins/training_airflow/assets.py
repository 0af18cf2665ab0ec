"""The Airflow Assets the training DAGs produce and schedule on, defined once.

- ``LABELLED_DATA`` (``x-training://data/labelled``): a day's labelled images landed in
  the data store (``dags/land_labelled_data.py``); its events carry ``{"partition",
  "files", "data_uri"}`` as ``extra``. ``keras_retrain`` runs on every event (and on its
  cron).
- ``STAGED_DATASET`` (``x-training://datasets/staged``): a dataset staged by
  ``keras_retrain``'s first task; ``extra``: the staged dataset's key, path, fingerprint.
- ``PRODUCTION_MODEL`` (``x-training://models/production``): a new production model;
  ``extra``: the promotion.
"""

from __future__ import annotations

from airflow.sdk import Asset

LABELLED_DATA = Asset(name="labelled_data", uri="x-training://data/labelled")
STAGED_DATASET = Asset(name="training_staged_dataset", uri="x-training://datasets/staged")
PRODUCTION_MODEL = Asset(name="training_production_model", uri="x-training://models/production")
