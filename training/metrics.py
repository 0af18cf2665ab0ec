"""Test-split metrics: loss, accuracy, per-class precision/recall/F1, confusion matrix.

``evaluate_model`` returns a plain dict; ``training.steps.evaluate`` writes it, with the
champion/challenger decision (``registry/policy.py``), as ``evaluation.json`` next to the model.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def classification_metrics(y_true: np.ndarray, probs: np.ndarray) -> dict[str, Any]:
    """Metrics of predicted class probabilities ``probs`` against integer labels."""
    y_true = np.asarray(y_true, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    num_classes = probs.shape[1]
    y_pred = probs.argmax(axis=1)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (y_true, y_pred), 1)
    per_class = []
    for c in range(num_classes):
        tp = int(confusion[c, c])
        predicted, actual = int(confusion[:, c].sum()), int(confusion[c, :].sum())
        precision = tp / predicted if predicted else 0.0
        recall = tp / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append({"class": c, "precision": precision, "recall": recall, "f1": f1,
                          "support": actual})
    picked = np.clip(probs[np.arange(len(y_true)), y_true], 1e-7, 1.0)
    return {
        "examples": int(len(y_true)),
        "loss": float(-np.log(picked).mean()),
        "accuracy": float((y_pred == y_true).mean()),
        "macro_f1": float(np.mean([p["f1"] for p in per_class])),
        "per_class": per_class,
        "confusion_matrix": confusion.tolist(),
    }


def predict(model: Any, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """Labels and predicted probabilities over a batched ``(image, label)`` dataset."""
    labels, probs = [], []
    for images, batch_labels in dataset:
        probs.append(np.asarray(model(images, training=False)))
        labels.append(np.asarray(batch_labels))  # a tf.Tensor, or NumPy (JAX input)
    return np.concatenate(labels), np.concatenate(probs)


def evaluate_model(model: Any, dataset: Any, what: str = "test split") -> dict[str, Any]:
    labels, probs = predict(model, dataset)
    metrics = classification_metrics(labels, probs)
    log.info("%s: %d examples, loss %.4f, accuracy %.4f", what, metrics["examples"],
             metrics["loss"], metrics["accuracy"])
    return metrics
