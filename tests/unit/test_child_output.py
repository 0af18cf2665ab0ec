"""TensorFlow's CUDA probing noise is dropped from a task's log; everything else passes."""

from __future__ import annotations

import sys
import textwrap

# As TensorFlow 2.21 writes them on a CPU-only machine (copied from a task log).
NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796105621.858617    8543 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1796105636.099200    8543 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
]
REAL = [
    "E0000 00:00:1796105636.1    8543 op_kernel.cc:1830] OP_REQUIRES failed: out of memory",
    "Traceback (most recent call last):",
]


def test_a_child_process_noise_is_dropped_from_the_task_log_and_the_rest_passes():
    """``training.launch.child.Child``: how a child's output (TensorFlow loads only in
    children) reaches the task log; its exit code, its ``error:`` line's message and
    its JSON lines."""
    from training.launch.child import Child

    lines = [*NOISE[:1], REAL[0], *NOISE[1:], REAL[1], '{"staged": {"key": "k"}}',
             "error: the last word"]
    script = textwrap.dedent(f"""
        import os
        for line in {lines!r}:
            os.write(2, (line + "\\n").encode())  # as C++ code writes: the descriptor
        raise SystemExit(3)
    """)
    logged: list[str] = []
    ended = Child([sys.executable, "-c", script], env={}, cwd=".").run(logged.append)
    assert (ended.code, ended.error, ended.results) == (
        3, "the last word", {"staged": {"key": "k"}})  # the message, without its prefix
    assert logged == [REAL[0], *lines[-3:]]  # every line but the noise, in order


def test_is_noise_matches_only_the_probing_lines():
    from training.launch.child import is_noise

    assert all(is_noise(line) for line in NOISE)
    assert not any(is_noise(line) for line in REAL)
