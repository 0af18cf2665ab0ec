"""Reading what a process printed, for assertion messages."""

from __future__ import annotations

from collections.abc import Iterable


def tail(output: str | Iterable[str], n: int = 40) -> str:
    """The last ``n`` lines of ``output`` (text, or lines), to show why a check failed."""
    lines = output.splitlines() if isinstance(output, str) else list(output)
    return "\n".join(lines[-n:])
