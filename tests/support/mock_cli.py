"""``python tests/support/mock_cli.py N ARGS``: ``python -m training ARGS`` on
``tfds.testing.mock_data(num_examples=N)``: a tfds dataset of its real shape, random
images, nothing downloaded; the same CLI, staging and training as a user's run."""

from __future__ import annotations

import sys

import tensorflow_datasets as tfds

from training.cli import main

if __name__ == "__main__":
    with tfds.testing.mock_data(num_examples=int(sys.argv[1])):
        sys.exit(main(sys.argv[2:]))
