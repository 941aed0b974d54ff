"""A test module run again as a child process (`python tests/test_x.py child ...`), to be killed mid-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def spawn_child(test_file: str, *args: str) -> subprocess.Popen:
    """`python test_file child ARGS...` with tests/ on its path; stdin and stdout are text pipes."""
    path = os.pathsep.join([str(Path(test_file).parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, test_file, "child", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=path),
    )


def kill_when_paused(proc: subprocess.Popen) -> None:
    """Read the child's lines until it says `paused` (failing if it says `finished` first), SIGKILL it there."""
    assert proc.stdout is not None
    for line in proc.stdout:
        assert not line.startswith("finished"), "the child finished before it could be killed"
        if line.startswith("paused"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
