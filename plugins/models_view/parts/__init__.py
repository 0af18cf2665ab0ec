"""The parts of the Models page app (``models_view/page.py`` puts them together).

``answers`` (security headers, refused pages), ``access`` (the caller's Airflow login),
``stores`` (the deployment's store and the JSON files of published versions),
``listing`` (what the page lists), ``plot`` (the accuracy plot's geometry), ``compare``
(two versions' settings side by side) and ``promote`` (the form that triggers the
``promote_model`` DAG). This folder's ``.airflowignore`` keeps Airflow's plugin loader
from importing them as top-level modules in every process.
"""
