"""Tracking off is nothing at all: no tracking URI, no MLflow imported, every call a
no-op (training/tracking/__init__.py); the frozen config as params keeps no secret."""

from __future__ import annotations

import os
import subprocess
import sys

from training.tracking import NO_TRACKING, open_tracker, registry_followers
from training.tracking.params import flat_params


def test_no_uri_is_no_tracking_and_follows_nothing():
    assert open_tracker("") is NO_TRACKING and not NO_TRACKING.enabled
    assert NO_TRACKING.start(object(), tags={"a": "b"}) is None
    assert NO_TRACKING.flush() is None
    assert registry_followers(NO_TRACKING) == ()


def test_a_process_with_tracking_off_never_imports_mlflow():
    code = ("import sys\n"
            "from training.tracking import tracker_from_env, tracked_registry\n"
            "t = tracker_from_env(); t.log_metrics('m', 'r', {'loss': 1.0}); t.flush()\n"
            "tracked_registry(sys.argv[1])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "TRAINING_MLFLOW_TRACKING_URI")}
    done = subprocess.run([sys.executable, "-c", code, "/tmp/no-store"], env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_params_are_flat_and_keep_no_secret():
    params = flat_params({
        "fit": {"learning_rate": 0.01, "epochs": 3},
        "sweep": {"space": {"fit.learning_rate": {"float": [0.001, 0.1]}},
                  "storage": "postgresql+psycopg2://bob:hunter2@db:5432/optuna"},
        "storage": {"store_uri": "s3://models/registry", "password": "hunter2",
                    "api_token": "t0ken"},
    })
    assert params["fit.learning_rate"] == "0.01" and params["fit.epochs"] == "3"
    assert params["sweep.space.fit.learning_rate"] == '{"float": [0.001, 0.1]}'
    assert params["storage.store_uri"] == "s3://models/registry"
    assert "storage.password" not in params and "storage.api_token" not in params
    assert "hunter2" not in str(params) and "bob:***@db" in params["sweep.storage"]
