"""How much memory this process may still use, and the rule that keeps a decoded split
in it: ``cache_plan`` (``dataset.input_cache``), the same for both readers
(``tf_reader.py``, ``numpy_reader.py``); on a CPU device, ``device_split`` measures the
device's memory here too.
"""

from __future__ import annotations

from pathlib import Path

CACHE_SHARE = 4  # auto caches a split whose decoded size fits in 1/CACHE_SHARE of memory
LABEL_BYTES = 8  # an int64 class label beside each image


def cache_plan(mode: str, size: int | None, available: int | None,
               again: str = "decoded again every epoch") -> tuple[bool, str]:
    """Whether to cache the decoded split in memory, and why (logged); ``again``: what
    happens every epoch when it is not (with a decoded copy: read from it)."""
    if mode == "memory":
        return True, "dataset.input_cache is 'memory'"
    if mode == "none":
        return False, f"dataset.input_cache is 'none': {again}"
    if size is None:
        return True, "dataset.input_cache 'auto': the dataset's info gives no size, cached"
    if available is None:
        return True, f"dataset.input_cache 'auto': {_mb(size)} decoded, memory unknown"
    budget = available // CACHE_SHARE
    fits = size <= budget
    return fits, (f"dataset.input_cache 'auto': {_mb(size)} decoded "
                  f"{'fits in' if fits else 'exceeds'} {_mb(budget)}, a quarter of the "
                  f"{_mb(available)} available" + ("" if fits else f": {again}"))


def _mb(size: int) -> str:
    return f"{size / 2**20:,.1f} MB"


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes this process may still use: ``MemAvailable`` from /proc/meminfo, lowered to
    what its cgroup's memory limit leaves (a Kubernetes pod's limit); None off Linux.

    The cgroup's usage counts the page cache, which the kernel gives back under
    pressure: its inactive files are not counted as used (as the kubelet's working set
    does), or a pod that has just read its shards would see no memory at all. ``root``:
    where /proc and /sys are (tests)."""
    limits = []
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    left = _cgroup_left(root)
    if left is not None:
        limits.append(left)
    return min(limits) if limits else None


def _cgroup_left(root: Path) -> int | None:
    """The memory the process's cgroup limit leaves (v2, else v1); None without one."""
    try:
        own = next((line.split(":", 2)[2].strip() for line in
                    (root / "proc/self/cgroup").read_text().splitlines()
                    if line.startswith("0::")), "/")
    except OSError:
        own = "/"
    v2 = root / "sys/fs/cgroup" / own.lstrip("/")
    for base, limit_file, usage_file, inactive in (
            (v2, "memory.max", "memory.current", "inactive_file"),
            (root / "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
             "total_inactive_file")):
        try:
            limit = (base / limit_file).read_text().strip()
            usage = int((base / usage_file).read_text())
            stat = dict(line.split() for line in (base / "memory.stat").read_text()
                        .splitlines() if len(line.split()) == 2)
        except (OSError, ValueError):
            continue
        if not limit.isdigit() or int(limit) >= 1 << 60:  # "max" or v1's huge number
            return None
        return max(0, int(limit) - usage + int(stat.get(inactive, 0)))
    return None
