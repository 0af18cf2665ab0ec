"""Training: model builders, the tf.distribute strategy, the Keras fit and its callbacks."""
