"""A process's memory figures from /proc/<pid>/status."""

from __future__ import annotations


def status_bytes(pid: int, field: str) -> int:
    """/proc/<pid>/status `field` (VmRSS, VmHWM, ...) in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")
