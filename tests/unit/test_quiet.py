"""TensorFlow's CUDA probing noise is dropped from a task's stderr; everything else passes."""

from __future__ import annotations

import subprocess
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


def test_noise_lines_are_dropped_and_the_rest_passes_in_order():
    script = textwrap.dedent(f"""
        import os, sys
        from training_airflow.quiet import stderr_without_noise
        lines = {[*NOISE[:1], REAL[0], *NOISE[1:], REAL[1]]!r}
        with stderr_without_noise():
            for line in lines:
                os.write(2, (line + "\\n").encode())  # as C++ code writes: the descriptor
        os.write(2, b"after\\n")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stderr.splitlines() == [*REAL, "after"]


def test_is_noise_matches_only_the_probing_lines():
    from training_airflow.quiet import is_noise

    assert all(is_noise(line) for line in NOISE)
    assert not any(is_noise(line) for line in REAL)
