import math

import numpy as np

from training.metrics import classification_metrics


def test_metrics_of_a_known_confusion():
    y_true = np.array([0, 0, 1, 1, 2, 2])
    probs = np.array([
        [0.9, 0.1, 0.0],  # 0 -> 0
        [0.2, 0.8, 0.0],  # 0 -> 1
        [0.1, 0.9, 0.0],  # 1 -> 1
        [0.0, 1.0, 0.0],  # 1 -> 1
        [0.0, 0.0, 1.0],  # 2 -> 2
        [0.5, 0.0, 0.5],  # 2 -> 0 (first max)
    ])
    m = classification_metrics(y_true, probs)
    assert m["examples"] == 6
    assert m["accuracy"] == 4 / 6
    assert m["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    c0, c1, c2 = m["per_class"]
    assert (c0["precision"], c0["recall"]) == (0.5, 0.5)
    assert (c1["precision"], c1["recall"]) == (2 / 3, 1.0)
    assert math.isclose(c1["f1"], 0.8)
    assert (c2["precision"], c2["recall"], c2["support"]) == (1.0, 0.5, 2)
    expected_loss = -np.mean(np.log([0.9, 0.2, 0.9, 1.0, 1.0, 0.5]))
    assert math.isclose(m["loss"], expected_loss, rel_tol=1e-6)


def test_a_class_never_predicted_has_zero_precision_not_a_crash():
    m = classification_metrics(np.array([0, 1]), np.array([[1.0, 0.0], [1.0, 0.0]]))
    assert m["per_class"][1] == {"class": 1, "precision": 0.0, "recall": 0.0, "f1": 0.0,
                                 "support": 1}
