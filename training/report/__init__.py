"""The report published with every model version: one HTML page and its PNG plots.

``build_report(model_dir)`` reads what training and evaluation wrote into the model
directory (``history.json``, ``evaluation.json``, ``config.json``, ``run.json``; the
names are ``training.layout``'s) and writes ``<model_dir>/report/``:

* ``index.html``            the page: decision and reasons, champion versus challenger,
                            learning curves, test metrics per class, confusion matrix,
                            data fingerprint, strategy, effective config, software;
* ``learning_curves.png``   loss, accuracy and learning rate per epoch, train and
                            validation, with the epochs where the learning rate dropped
                            and the epoch whose weights early stopping kept;
* ``confusion_matrix.png``  test-split counts, rows true class, columns predicted;
* ``sweep_objective.png``, ``sweep_params.png``  for a version a hyperparameter sweep
                            picked (``sweep.json`` in the model directory): the trials'
                            objective, and each searched value against it.

Because ``report/`` lives in the model directory, ``steps.publish`` uploads it with
the version: the report of version ``V`` of model ``M`` is
``models/M/versions/V/report/index.html`` in the store, its PNGs beside it.

The package:

* ``plots``      matplotlib ``Figure`` on the Agg canvas (no pyplot, no display),
                 deterministic PNG bytes;
* ``render``     the one Jinja2 template environment (``templates/``: ``base.html`` with
                 the one stylesheet ``style.css``, ``report.html``, and the Models page's
                 ``models.html`` and ``refused.html``), autoescaping every ``.html``;
* ``sweep``      the Sweep section's text and rows from ``sweep.json`` (and the Models
                 page's "best of N trials" line); ``sweep_plots`` its plots;
* ``build``      reads the records and writes the report directory atomically;
* ``cli``        ``python -m training.report MODEL_DIR``.

The page is self-contained: inline CSS, images by relative path, no script and no
external URL. Every value from the run is HTML-escaped by the template engine.
TensorFlow is never imported. A file that is missing (a report built before
evaluation) leaves its sections saying so.
"""

from __future__ import annotations

from training.report.build import build_report
from training.report.cli import main
from training.report.plots import plot_confusion_matrix, plot_learning_curves
from training.report.render import environment, render, render_report

__all__ = ["build_report", "environment", "main", "plot_confusion_matrix",
           "plot_learning_curves", "render", "render_report"]
