"""Run a row's process under a deadline and a memory watchdog: its RSS (VmRSS) over `memory_max` kills it, and the
row says so. The limit is the one every model gets (qualify --memory-max, else the target's, else 80 % of what is
available: agent.serving.memory.resolve_memory_max)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

POLL_S = 0.05


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def run_watched(argv: list[str], timeout_s: float, memory_max: int | None) -> tuple[int, str, str, str | None]:
    """(exit status, stdout, stderr, why it was killed or None)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        why, deadline, peak = None, time.monotonic() + timeout_s, 0
        while proc.poll() is None:
            rss = _rss(proc.pid) or 0
            peak = max(peak, rss)
            if memory_max and rss > memory_max:
                why = f"memory: the row's RSS reached {rss >> 20} MiB > the limit {memory_max >> 20} MiB"
            elif time.monotonic() > deadline:
                why = f"the row's process ran past its {timeout_s:g} s deadline"
            if why:
                proc.kill()
                proc.wait()
                break
            time.sleep(POLL_S)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"), why
