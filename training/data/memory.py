"""How much memory this process may still use: what decides whether a decoded split is
kept in memory (``input.cache_plan``) or, on a CPU device, on the device
(``device_split``).
"""

from __future__ import annotations

from pathlib import Path


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
