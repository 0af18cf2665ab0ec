"""A stand-in MultiWorkerMirroredStrategy for the probes (and the unit tests).

It claims multi-worker mode and records every ``reduce`` it is asked for, so a probe can
run Keras's own code path without a cluster, collectives or the TensorFlow runtime and
read what Keras would have reduced, and how.
"""

from __future__ import annotations

import contextlib
from typing import Any


def probe_strategy() -> Any:
    """A MultiWorkerMirroredStrategy in multi-worker mode that records its reduces."""
    import tensorflow as tf

    class _Extended:
        def _in_multi_worker_mode(self) -> bool:
            return True

    class _Probe(tf.distribute.MultiWorkerMirroredStrategy):
        def __init__(self) -> None:  # no cluster, no collectives: a recorder
            self._extended = _Extended()
            self.reduces: list[tuple[str, Any, Any]] = []

        def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
            self.reduces.append((str(reduce_op), value, axis))
            return value

        def scope(self) -> Any:
            return contextlib.nullcontext()

        def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
            return tuple(getattr(value, "values", (value,)))

    return _Probe()
