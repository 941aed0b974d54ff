"""stop: end a subprocess the way a service manager does (SIGTERM, then SIGKILL after a grace period)."""

from __future__ import annotations

import signal
import subprocess


def stop(proc: subprocess.Popen, grace: float = 120.0) -> int:
    """SIGTERM `proc` if it still runs, SIGKILL it if it has not exited `grace` seconds later; its exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode
